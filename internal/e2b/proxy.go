package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/portproxy"
)

// target is the sandbox and port a request is for.
type target struct {
	id, port string
}

// sandboxTarget finds where E2B SDKs address sandbox traffic: with
// E2B_SANDBOX_URL set, any path on that URL with the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers; otherwise the host {port}-{sandboxID}.{domain}.
func sandboxTarget(r *http.Request) (target, bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return target{id: id, port: r.Header.Get("E2b-Sandbox-Port")}, true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return target{}, false
	}
	port, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return target{}, false
	}
	return target{id: id, port: port}, true
}

// IsSandboxRequest reports whether r is sandbox traffic rather than a call
// of the E2B control plane.
func IsSandboxRequest(r *http.Request) bool {
	_, ok := sandboxTarget(r)
	return ok
}

// accessToken is sandbox id's envd access token: an HMAC of its ID under
// the server's key, so no token is stored and tokens survive restarts. E2B
// SDKs send it as X-Access-Token and sign file URLs with it.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.TokenKey)
	m.Write([]byte("atoll e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// proxyError is an answer of E2B's client proxy to sandbox traffic it
// cannot deliver, in its words: SDKs and agent code match on them (a 502
// means "not running"; "The sandbox was not found" becomes
// SandboxNotFoundError). atoll's own port proxy words its answers its own
// way.
type proxyError struct {
	status  int
	message string
}

var (
	// E2B does not tell a paused sandbox from one that never was.
	errSandboxNotFound = proxyError{http.StatusBadGateway, "The sandbox was not found"}
	errPortClosed      = proxyError{http.StatusBadGateway, "The sandbox is running but port is not open"}
	errTokenMissing    = proxyError{http.StatusForbidden, "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"}
	errTokenInvalid    = proxyError{http.StatusForbidden, "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid"}
)

// write answers with e's body for sandbox id, as E2B's proxy does:
// {"sandboxId", "message", "code"}, and "port" when it is about one.
func (e proxyError) write(w http.ResponseWriter, id string, port int) {
	writeJSON(w, e.status, struct {
		apiError
		SandboxID string `json:"sandboxId"`
		Port      int    `json:"port,omitempty"`
	}{apiError{Code: e.status, Message: e.message}, id, port})
}

func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, t target) {
	port, err := strconv.Atoi(t.port)
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad sandbox port %q", truncate(t.port)))
		return
	}
	id, _, _ := strings.Cut(t.id, "-") // a client suffix, as in the API
	if !api.ValidSandboxID(id) {
		errSandboxNotFound.write(w, truncate(t.id), 0)
		return
	}
	dial, err := s.cfg.Sandboxes.AgentDialer(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrConflict):
		errSandboxNotFound.write(w, id, 0) // ErrConflict: not running
		return
	case err != nil:
		s.writeErr(w, r, err)
		return
	}
	if port != envd.Port {
		s.servePort(w, r, id, port)
		return
	}
	c := agent.NewClient(dial)
	defer c.HTTPClient().CloseIdleConnections()
	s.envd.Serve(w, r, envd.Sandbox{ID: id, Agent: c, AccessToken: s.accessToken(id)})
}

// Headers of E2B's sandbox traffic that are for atoll, not the sandbox.
const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerTrafficToken = "E2b-Traffic-Access-Token"
)

// servePort sends a request for a port other than envd's to the port
// proxy. A sandbox whose ports are not public (E2B's allowPublicTraffic
// false) needs its traffic access token in e2b-traffic-access-token, or
// atoll's own token header; E2B answers 403 without it.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	if s.cfg.Ports == nil {
		proxyError{http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s is not reachable: this atoll server runs sandboxes without networking, or without its port proxy", port, id)}.write(w, id, port)
		return
	}
	sb, err := s.cfg.Sandboxes.Get(r.Context(), id)
	if err != nil {
		errSandboxNotFound.write(w, id, 0)
		return
	}
	if !sb.Ports.Public {
		tok := r.Header.Get(headerTrafficToken)
		if tok == "" {
			tok = r.Header.Get("Atoll-Access-Token")
		}
		if tok == "" {
			errTokenMissing.write(w, id, 0)
			return
		}
		if !hmac.Equal([]byte(tok), []byte(s.cfg.Ports.Token(id))) {
			errTokenInvalid.write(w, id, 0)
			return
		}
	}
	r = r.Clone(r.Context())
	for _, h := range []string{headerSandboxID, headerSandboxPort, headerTrafficToken} {
		r.Header.Del(h)
	}
	s.cfg.Ports.ServePort(w, r, id, port, func(w http.ResponseWriter, f portproxy.Failure) {
		switch {
		case f.SandboxGone:
			errSandboxNotFound.write(w, id, 0)
		case f.Status == http.StatusBadGateway:
			errPortClosed.write(w, id, port)
		default:
			proxyError{f.Status, f.Message}.write(w, id, 0)
		}
	})
}
