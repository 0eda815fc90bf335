package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// peerGet calls node to's node listener as it would be called from node
// from: with from's certificate and epoch.
func peerGet(t *testing.T, c *Client, to *node, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest("GET", "https://"+to.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", keyT1)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	t.Cleanup(cancel)
	return c.Do(ctx, Node{Name: to.name, Address: to.addr}, req)
}

func wantError(t *testing.T, resp *http.Response, err error, status int, code string, contains ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("want a %d answer, got %v", status, err)
	}
	defer resp.Body.Close()
	e := decode[api.Error](t, readAll(t, resp))
	if resp.StatusCode != status || e.Code != code {
		t.Fatalf("status %d %+v, want %d %s", resp.StatusCode, e, status, code)
	}
	for _, s := range contains {
		if !strings.Contains(e.Message, s) {
			t.Errorf("message %q does not name %q", e.Message, s)
		}
	}
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPeerCall: a node's own call reaches another node as that node, under
// its epoch; Call maps error answers back to their kinds.
func TestPeerCall(t *testing.T) {
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	var got answer
	err := a.client.Call(context.Background(), Node{Name: "b", Address: b.addr}, "POST", "/cluster/v1/sandboxes/"+onB+"/run", map[string]string{"template": "base"}, &got)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != "b" || got.RoutedBy != "a" || got.Body != `{"template":"base"}` {
		t.Errorf("got %+v", got)
	}
	err = a.client.Call(context.Background(), Node{Name: "b", Address: b.addr}, "POST", "/cluster/v1/sandboxes/"+nowhere+"/run", nil, nil)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("call for a sandbox b lacks: %v, want not found", err)
	}
}

// TestWrongCA: a client whose certificate another CA signed is refused at
// the handshake, as is a client with none; the API never sees them.
func TestWrongCA(t *testing.T) {
	c := newCluster(t, "a", "b")
	b := c.nodes["b"]
	pem, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other, err := ParseCA(pem)
	if err != nil {
		t.Fatal(err)
	}
	// An impostor with a's very name and address, from another CA.
	imp, err := other.NewIdentity("a", c.nodes["a"].addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	impostor := NewClient(imp, func() int64 { return 10 })
	defer impostor.Close()
	// It does not trust b either; let it try as if it did, with b's CA
	// as its roots, so that only b's check of its certificate stops it.
	cfg := imp.ClientTLS("b", b.addr)
	cfg.RootCAs = c.ca.Pool()
	// a's certificate from the right CA, but expired.
	old, err := c.ca.sign("a", c.nodes["a"].addr, time.Millisecond, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	for name, cfg := range map[string]*tls.Config{
		"other CA":       cfg,
		"no certificate": {RootCAs: c.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13},
		"expired":        {RootCAs: c.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*old}},
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", b.addr, cfg)
			if err == nil {
				// TLS 1.3: the server's refusal arrives with the first read.
				conn.SetDeadline(time.Now().Add(testWait))
				conn.Write([]byte("GET /v1/sandboxes/" + onB + " HTTP/1.1\r\nHost: x\r\n\r\n"))
				_, err = conn.Read(make([]byte, 1))
				conn.Close()
			}
			if err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Fatalf("handshake: %v, want a certificate error", err)
			}
		})
	}
	// Through the Client, which trusts only the cluster CA: b is not
	// trusted by the impostor either.
	if _, err := peerGet(t, impostor, b, "/v1/sandboxes/"+onB); err == nil {
		t.Error("a client of another CA reached b")
	}
	if n := b.served.Load(); n != 0 {
		t.Errorf("b's API served %d requests from outside the cluster", n)
	}
}

// TestWrongNode: a node that answers at an address under another name
// (the address moved to another node) is refused by the caller.
func TestWrongNode(t *testing.T) {
	c := newCluster(t, "a", "b", "c")
	a, cc := c.nodes["a"], c.nodes["c"]
	req, _ := http.NewRequest("GET", "https://x/v1/sandboxes/"+onB, nil)
	_, err := a.client.Do(context.Background(), Node{Name: "b", Address: cc.addr}, req)
	if err == nil || !strings.Contains(err.Error(), `not node "b"`) {
		t.Fatalf("calling b at c's address: %v", err)
	}
}

// TestStaleEpoch: a node with a valid certificate under an epoch that is
// not its current one, or fenced, is refused 403.
func TestStaleEpoch(t *testing.T) {
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	// a joined again (epoch 11) while an old process of it kept epoch 10.
	c.w.setNode("a", func(n *store.Node) { n.Epoch = 11 })
	resp, err := peerGet(t, a.client, b, "/v1/sandboxes/"+onB)
	wantError(t, resp, err, http.StatusForbidden, api.CodeForbidden, `"a"`, "epoch 10")
	// The new process is welcome.
	a.epoch.Store(11)
	resp, err = peerGet(t, a.client, b, "/v1/sandboxes/"+onB)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("current epoch: %v %v", resp, err)
	}
	resp.Body.Close()
	// Fenced: refused though its epoch is the one recorded.
	c.w.setNode("a", func(n *store.Node) { n.State = store.NodeFenced })
	time.Sleep(60 * time.Millisecond) // b's directory TTL
	resp, err = peerGet(t, a.client, b, "/v1/sandboxes/"+onB)
	wantError(t, resp, err, http.StatusForbidden, api.CodeForbidden, "fenced")
	// A node the cluster does not know.
	c.w.mu.Lock()
	delete(c.w.nodes, "a")
	c.w.mu.Unlock()
	time.Sleep(60 * time.Millisecond)
	resp, err = peerGet(t, a.client, b, "/v1/sandboxes/"+onB)
	wantError(t, resp, err, http.StatusForbidden, api.CodeForbidden, "not a member")
	if n := b.served.Load(); n != 1 {
		t.Errorf("b's API served %d requests, want only the current epoch's", n)
	}
}

// TestForgedHeaders: routing headers sent to a public listener (from
// outside, or from inside a sandbox) are dropped: the request is routed as
// any client's, and no handler sees them.
func TestForgedHeaders(t *testing.T) {
	c := newCluster(t, "a", "b")
	forged := map[string]string{HeaderEpoch: "10", HeaderRouted: "b", HeaderClient: "10.9.9.9:1", "Atoll-Peer-Whatever": "1"}
	// For b's sandbox, on a: still routed to b, as a's.
	st, body := do(t, "GET", c.nodes["a"].public.URL+"/v1/sandboxes/"+onB, keyT1, nil, forged)
	if st != http.StatusOK {
		t.Fatalf("status %d %s", st, body)
	}
	if got := decode[answer](t, body); got.Node != "b" || got.RoutedBy != "a" || got.Peer != "" || got.Remote != clientIP {
		t.Errorf("got %+v, want b's answer routed by a without peer headers", got)
	}
	if n := c.nodes["a"].served.Load(); n != 0 {
		t.Errorf("a served the forged request itself")
	}
	// On b's own public listener: a client's, not a node's.
	st, body = do(t, "GET", c.nodes["b"].public.URL+"/v1/sandboxes/"+onB, keyT1, nil, forged)
	if got := decode[answer](t, body); st != http.StatusOK || got.RoutedBy != "" || got.Peer != "" || got.Remote != clientIP {
		t.Errorf("status %d %+v, want a plain client request", st, got)
	}
}

// TestOwnerGone: where the router cannot route (an owner fenced, or
// down), the local API answers after its own checks: to the sandbox's
// tenant, a 503 naming the node, with the request's body whole; to anyone
// else, the 404 of an ID that is not theirs, which tells nothing of where
// it is, or whether it exists.
func TestOwnerGone(t *testing.T) {
	c := newCluster(t, "a", "b", "c")
	a := c.nodes["a"].public.URL
	c.w.setNode("c", func(n *store.Node) { n.State = store.NodeFenced })
	time.Sleep(60 * time.Millisecond)
	st, body := do(t, "GET", a+"/v1/sandboxes/"+onC, keyT1, nil, nil)
	e := decode[api.Error](t, body)
	if st != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "node c") {
		t.Errorf("fenced owner: %d %+v", st, e)
	}
	for _, key := range []string{keyT2, ""} {
		if st, body := do(t, "GET", a+"/v1/sandboxes/"+onC, key, nil, nil); st != http.StatusNotFound || strings.Contains(string(body), "node c") {
			t.Errorf("fenced owner, key %q: %d %s, want the 404 of any unknown ID", key, st, body)
		}
	}
	c.nodes["b"].peer.Close()
	// Several on one kept-alive connection: the server must be done with
	// a refused request's body before it reads the next request.
	const exec = `{"cmd":["true"]}`
	for range 3 {
		start := time.Now()
		st, body = do(t, "POST", a+"/v1/sandboxes/"+onB+"/exec", keyT1, strings.NewReader(exec), nil)
		e = decode[api.Error](t, body)
		if st != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "node b") {
			t.Errorf("owner down: %d %+v", st, e)
		}
		if want := fmt.Sprintf("(read %d bytes)", len(exec)); !strings.Contains(e.Message, want) {
			t.Errorf("owner down: %q; the local API did not get the whole body, %s", e.Message, want)
		}
		if d := time.Since(start); d > dialTimeout {
			t.Errorf("owner down answered in %v", d)
		}
		st, body = do(t, "POST", a+"/v1/sandboxes/"+onB+"/exec", keyT2, strings.NewReader(exec), nil)
		if st != http.StatusNotFound || strings.Contains(string(body), "node b") {
			t.Errorf("owner down, another tenant: %d %s, want the 404 of any unknown ID", st, body)
		}
	}
	// a's own sandboxes are served all the while.
	if st, _ := do(t, "GET", a+"/v1/sandboxes/"+onA, keyT1, nil, nil); st != http.StatusOK {
		t.Errorf("a's own sandbox: %d", st)
	}
}

// TestBadIDs: malformed or unknown IDs in paths, hosts and headers are
// served locally (the API's 404), without asking where they are.
func TestBadIDs(t *testing.T) {
	c := newCluster(t, "a", "b")
	a := c.nodes["a"].public.URL
	huge := strings.Repeat("b", 1<<16)
	for _, tc := range []struct {
		name, path string
		hdr        map[string]string
		locates    bool
	}{
		{"huge path", "/v1/sandboxes/" + huge, nil, false},
		{"short", "/v1/sandboxes/bbb", nil, false},
		{"upper", "/v1/sandboxes/" + strings.ToUpper(onB), nil, false},
		{"dots", "/v1/sandboxes/../sandboxes/" + onB[:18], nil, false},
		{"encoded", "/v1/sandboxes/%2e%2e%2f" + onB, nil, false},
		{"unicode", "/v1/sandboxes/bbbbbbbbbbbbbbbbbbé", nil, false},
		{"huge host", "/", map[string]string{"Host": "80-" + huge + ".localhost"}, false},
		{"bad port host", "/", map[string]string{"Host": "x80-" + onB + ".localhost"}, false},
		{"no domain", "/", map[string]string{"Host": "80-" + onB}, false},
		{"huge header", "/", map[string]string{"E2b-Sandbox-Id": huge}, false},
		{"unknown", "/v1/sandboxes/" + nowhere, nil, true},
		{"unknown host", "/", map[string]string{"Host": "80-" + nowhere + ".localhost"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.w.locates.Load()
			st, body := do(t, "GET", a+tc.path, keyT1, nil, tc.hdr)
			if st != http.StatusNotFound {
				t.Errorf("status %d %.200s, want the local 404", st, body)
			}
			if located := c.w.locates.Load() > before; located != tc.locates {
				t.Errorf("located: %v, want %v", located, tc.locates)
			}
		})
	}
	if n := c.nodes["b"].served.Load(); n != 0 {
		t.Errorf("b served %d of them", n)
	}
}

// TestSharedCA: nodes asking for the CA at once all get the one made
// first; each node's certificate names it and is renewed before expiry.
func TestSharedCA(t *testing.T) {
	var sec secrets
	cas := make([]*CA, 8)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, err := LoadCA(context.Background(), sec.Secret)
			if err != nil {
				t.Error(err)
				return
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	for _, ca := range cas[1:] {
		if ca == nil || !ca.cert.Equal(cas[0].cert) {
			t.Fatal("nodes got different CAs")
		}
	}
	id, err := cas[0].NewIdentity("n1", "10.1.2.3:7443", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := id.Certificate()
	leaf := c1.Leaf
	if leaf.Subject.CommonName != "n1" || len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "10.1.2.3" {
		t.Errorf("certificate names %q %v", leaf.Subject.CommonName, leaf.IPAddresses)
	}
	if _, err := leaf.Verify(x509VerifyOptions(cas[0])); err != nil {
		t.Errorf("certificate does not verify under the CA: %v", err)
	}
	now := time.Now()
	id.now = func() time.Time { return now.Add(30 * time.Minute) }
	if c2, _ := id.Certificate(); c2 != c1 {
		t.Error("renewed with half its life left")
	}
	id.now = func() time.Time { return now.Add(45 * time.Minute) }
	c3, _ := id.Certificate()
	if c3 == c1 || !c3.Leaf.NotAfter.After(c1.Leaf.NotAfter) {
		t.Error("not renewed with a quarter of its life left")
	}
	if _, err := ParseCA([]byte("garbage")); err == nil {
		t.Error("parsed garbage as a CA")
	}
}

func x509VerifyOptions(ca *CA) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// TestStoreDown: while the nodes cannot be listed, node calls are answered
// 503 without the store's words, and requests about sandboxes elsewhere
// 503; listing is not retried for every request.
func TestStoreDown(t *testing.T) {
	var lists atomic.Int64
	down := errors.New("dial tcp 10.9.9.9:5432: connection refused")
	dir := NewDirectory(func(context.Context) ([]store.Node, error) { lists.Add(1); return nil, down }, 0)
	h := Guard(dir.Live, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") }), nil)
	var sec secrets
	ca, _ := LoadCA(context.Background(), sec.Secret)
	id, _ := ca.NewIdentity("a", "127.0.0.1:1", 0)
	c, _ := id.Certificate()
	for i := 0; i < 20; i++ {
		r := httptest.NewRequest("GET", "/v1/sandboxes/"+onB, nil)
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c.Leaf}}}
		r.Header.Set(HeaderEpoch, "1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		e := decode[api.Error](t, w.Body.Bytes())
		if w.Code != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable || strings.Contains(e.Message, "10.9.9.9") {
			t.Fatalf("%d %+v", w.Code, e)
		}
	}
	if n := lists.Load(); n != 1 {
		t.Errorf("listed %d times for 20 requests in a burst, want 1", n)
	}
	loc := LocateBy(func(context.Context, string) (string, string, error) { return "b", api.StateRunning, nil }, dir)
	rt := NewRouter(RouterConfig{Self: "a", Locate: loc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w := httptest.NewRecorder()
	rt.Wrap(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("GET", "/v1/sandboxes/"+onB+"/exec", nil))
	if e := decode[api.Error](t, w.Body.Bytes()); w.Code != http.StatusServiceUnavailable || strings.Contains(e.Message, "10.9.9.9") {
		t.Errorf("router with the store down: %d %+v", w.Code, e)
	}
}
