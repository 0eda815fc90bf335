package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atoll-dev/atoll/api"
)

// TestWebSocketKeyProtocol opens a process's websocket as a browser must,
// with the key among the offered subprotocols: the server accepts it,
// selects "atoll", keeps the key from the agent (whose fake refuses a
// handshake that carries one), and refuses a wrong key or a key so offered
// on a request that is not a handshake.
func TestWebSocketKeyProtocol(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID
	ws := f.url + "/v1/sandboxes/" + id + "/processes/7/ws"

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, ws, &websocket.DialOptions{Subprotocols: []string{wsProtocol, wsKeyProtocol + testKey}})
	if err != nil {
		t.Fatalf("dial with the key as a subprotocol: %v (%v)", err, resp)
	}
	defer c.CloseNow()
	if got := c.Subprotocol(); got != wsProtocol {
		t.Errorf("selected subprotocol %q, want %q", got, wsProtocol)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo hi\n")); err != nil {
		t.Fatal(err)
	}
	if typ, b, err := c.Read(ctx); err != nil || typ != websocket.MessageBinary || string(b) != "ECHO HI\n" {
		t.Fatalf("read: %v %v %q", typ, err, b)
	}
	c.Close(websocket.StatusNormalClosure, "")

	for _, tc := range []struct {
		name   string
		protos []string
	}{
		{"wrong key", []string{wsProtocol, wsKeyProtocol + "nope"}},
		{"empty key", []string{wsProtocol, wsKeyProtocol}},
		{"no key", []string{wsProtocol}},
	} {
		_, resp, err := websocket.Dial(ctx, ws, &websocket.DialOptions{Subprotocols: tc.protos})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: err %v, resp %v; want 401", tc.name, err, resp)
		}
	}

	// Not a handshake: the subprotocol header is no way to send a key.
	resp, body = f.do("GET", "/v1/sandboxes/"+id, nil, "X-API-Key", "", "Sec-WebSocket-Protocol", wsProtocol+", "+wsKeyProtocol+testKey)
	wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
}
