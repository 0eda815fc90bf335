package server

import (
	"net/http"
	"strings"
)

// A browser cannot set headers on a websocket handshake, only the
// subprotocols it offers (Sec-WebSocket-Protocol). So that a web page (the
// dashboard's terminal) can open a process's websocket, a websocket
// handshake may carry its API key as a subprotocol: the client offers
// "atoll" and "atoll.key.KEY", the server takes the key from the second,
// keeps it from the agent, and selects "atoll" (a browser fails a
// handshake whose offered subprotocols get no answer). The key never
// travels in a URL, so it stays out of logs and history. Another site's
// page cannot use this: it does not know the key.
const (
	wsProtocol    = "atoll"
	wsKeyProtocol = "atoll.key."
)

// isWebSocket reports whether r asks to upgrade to a websocket.
func isWebSocket(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// wsProtocols returns the subprotocols r offers, in order.
func wsProtocols(h http.Header) []string {
	var ps []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// wsKey returns the API key a websocket handshake offers as subprotocol
// "atoll.key.KEY", or "".
func wsKey(r *http.Request) string {
	if !isWebSocket(r) {
		return ""
	}
	for _, p := range wsProtocols(r.Header) {
		if k, ok := strings.CutPrefix(p, wsKeyProtocol); ok {
			return k
		}
	}
	return ""
}

// stripWSKey removes the key subprotocol from h, a request forwarded to
// the agent, which trusts its socket and must not see keys.
func stripWSKey(h http.Header) {
	ps := wsProtocols(h)
	if len(ps) == 0 {
		return
	}
	kept := ps[:0]
	for _, p := range ps {
		if !strings.HasPrefix(p, wsKeyProtocol) {
			kept = append(kept, p)
		}
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(kept) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(kept, ", "))
	}
}

// selectWSProtocol completes the agent's answer to a websocket handshake
// that offered "atoll": the agent selects no subprotocol, and a browser
// would then fail the handshake.
func selectWSProtocol(resp *http.Response) error {
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Protocol") != "" || resp.Request == nil {
		return nil
	}
	for _, p := range wsProtocols(resp.Request.Header) {
		if p == wsProtocol {
			resp.Header.Set("Sec-WebSocket-Protocol", wsProtocol)
			break
		}
	}
	return nil
}
