package peer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// secrets is a store's Secret: the first value made is kept.
type secrets struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *secrets) Secret(_ context.Context, name string, make func() ([]byte, error)) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[name]; ok {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string][]byte{}
	}
	s.m[name] = v
	return v, nil
}

// world is what the store holds for the test cluster: its nodes and
// where each sandbox is.
type world struct {
	mu        sync.Mutex
	nodes     map[string]store.Node
	sandboxes map[string]sandbox
	// views are what a node's locator sees of an ID instead of the truth.
	views   map[string]map[string]string
	locates atomic.Int64
}

type sandbox struct {
	node, tenant, state string
}

func (w *world) list(context.Context) ([]store.Node, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ns []store.Node
	for _, n := range w.nodes {
		ns = append(ns, n)
	}
	return ns, nil
}

// sandbox is viewer's locator's source.
func (w *world) sandbox(viewer string) func(context.Context, string) (string, string, error) {
	return func(_ context.Context, id string) (string, string, error) {
		w.locates.Add(1)
		w.mu.Lock()
		defer w.mu.Unlock()
		sb, ok := w.sandboxes[id]
		if !ok {
			return "", "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if v, ok := w.views[viewer][id]; ok {
			return v, sb.state, nil
		}
		return sb.node, sb.state, nil
	}
}

func (w *world) setNode(name string, f func(*store.Node)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[name]
	f(&n)
	w.nodes[name] = n
}

// node is one node of the test cluster: its public listener (the router
// over its API) and its node-to-node listener (Guard over the same).
type node struct {
	name   string
	id     *Identity
	epoch  atomic.Int64
	client *Client
	public *httptest.Server // the API's listener
	ports  *httptest.Server // the port proxy's
	peer   *http.Server
	addr   string
	served atomic.Int64 // requests its API served
}

type cluster struct {
	w     *world
	ca    *CA
	nodes map[string]*node
}

// Sandbox IDs, by where they are.
const (
	onA      = "aaaaaaaaaaaaaaaaaaa1"
	onB      = "bbbbbbbbbbbbbbbbbbb1"
	onC      = "ccccccccccccccccccc1"
	lostOnC  = "ccccccccccccccccccc2"
	nowhere  = "zzzzzzzzzzzzzzzzzzz1"
	keyT1    = "Bearer key-t1"
	keyT2    = "Bearer key-t2"
	testWait = 10 * time.Second
)

func newCluster(t testing.TB, names ...string) *cluster {
	t.Helper()
	var sec secrets
	ca, err := LoadCA(context.Background(), sec.Secret)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{
		w: &world{nodes: map[string]store.Node{}, sandboxes: map[string]sandbox{
			onA:     {"a", "t1", api.StateRunning},
			onB:     {"b", "t1", api.StateRunning},
			onC:     {"c", "t1", api.StateRunning},
			lostOnC: {"c", "t1", api.StateLost},
		}},
		ca:    ca,
		nodes: map[string]*node{},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i, name := range names {
		n := &node{name: name}
		n.epoch.Store(int64(10 + i))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.addr = ln.Addr().String()
		if n.id, err = ca.NewIdentity(name, n.addr, 0); err != nil {
			t.Fatal(err)
		}
		n.client = NewClient(n.id, n.epoch.Load)
		dir := NewDirectory(c.w.list, 50*time.Millisecond)
		router := NewRouter(RouterConfig{Self: name, Listener: "api", Locate: LocateBy(c.w.sandbox(name), dir), Client: n.client, Logger: log})
		api := router.Wrap(c.api(n))
		ports := router.For("ports").Wrap(c.ports(n))
		// The node listener serves each listener's handler behind its
		// router too, as an integrator might: From keeps a routed request
		// here.
		handlers := map[string]http.Handler{"": c.api(n), "api": api, "ports": ports}
		n.peer = &http.Server{Handler: Guard(dir.Live, Listeners(handlers), log), TLSConfig: n.id.ServerTLS(), ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go n.peer.ServeTLS(ln, "", "")
		t.Cleanup(func() { n.peer.Close() })
		n.public = httptest.NewServer(api)
		t.Cleanup(n.public.Close)
		n.ports = httptest.NewServer(ports)
		t.Cleanup(n.ports.Close)
		t.Cleanup(n.client.Close)
		c.w.nodes[name] = store.Node{Name: name, Address: n.addr, Epoch: n.epoch.Load(), State: store.NodeLive}
		c.nodes[name] = n
	}
	return c
}

// answer is what the test API says of a request.
type answer struct {
	Node     string `json:"node"`
	Sandbox  string `json:"sandbox"`
	RoutedBy string `json:"routed_by"`
	Body     string `json:"body"`
	Host     string `json:"host"`
	Peer     string `json:"peer_headers"`
	Listener string `json:"listener"`
	Remote   string `json:"remote"` // the client's address, as the answering node sees it
}

// api is node n's API: it serves the sandboxes the world places on n, to
// their tenant's key; another node's sandbox, unless lost, is to its
// tenant one that runs elsewhere (503, once the request's body is read,
// with its length); any other is not found here, as on a real node.
func (c *cluster) api(n *node) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.served.Add(1)
		id := sandboxOf(r)
		if strings.HasPrefix(r.URL.Path, "/cluster/v1/sandboxes/") {
			id = pathID(r.URL.Path, "/cluster/v1/sandboxes/")
		}
		c.w.mu.Lock()
		sb, ok := c.w.sandboxes[id]
		c.w.mu.Unlock()
		tenant := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer key-")
		if ok && sb.node != n.name && sb.tenant == tenant && sb.state != api.StateLost {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("sandbox %s runs on node %s, not this one (read %d bytes)", id, sb.node, len(body))})
			return
		}
		if !ok || sb.node != n.name || sb.tenant != tenant && !strings.HasPrefix(r.URL.Path, "/cluster/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "no such sandbox"})
			return
		}
		from, _ := From(r)
		var peerHeaders []string
		for k := range r.Header {
			if strings.HasPrefix(k, headerPrefix) {
				peerHeaders = append(peerHeaders, k)
			}
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/stream"):
			// Three chunks, each only after the client has the one before.
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
				if i < 2 {
					select {
					case <-r.Context().Done():
						return
					case <-streamAck(r):
					}
				}
			}
			return
		case strings.HasSuffix(r.URL.Path, "/echo"):
			// Full duplex, as an exec with stdin: the answer begins
			// before the request's body has all come, and each line of
			// it is echoed as it comes.
			http.NewResponseController(w).EnableFullDuplex()
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			br := bufio.NewReader(r.Body)
			for {
				line, err := br.ReadString('\n')
				if line != "" {
					fmt.Fprintf(w, "echo %s", line)
					w.(http.Flusher).Flush()
				}
				if err != nil {
					return
				}
			}
		case strings.HasSuffix(r.URL.Path, "/sink"):
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d\n", n)
			return
		case strings.HasSuffix(r.URL.Path, "/source"):
			io.Copy(w, io.LimitReader(zeros{}, 64<<20))
			return
		case strings.HasSuffix(r.URL.Path, "/ws"):
			conn, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer conn.CloseNow()
			conn.SetReadLimit(1 << 20)
			for {
				typ, b, err := conn.Read(r.Context())
				if err != nil {
					return
				}
				conn.Write(r.Context(), typ, append([]byte(n.name+": "), b...))
			}
		case strings.HasSuffix(r.URL.Path, "/attach"):
			// A hijacked raw stream, as a PTY's.
			if r.Header.Get("Upgrade") != "atoll-pty" {
				http.Error(w, "want upgrade", http.StatusBadRequest)
				return
			}
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "atoll-pty")
			w.WriteHeader(http.StatusSwitchingProtocols)
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			line, _ := brw.ReadString('\n')
			brw.WriteString(strings.ToUpper(line))
			brw.Flush()
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer{Node: n.name, Sandbox: id, RoutedBy: from, Body: string(b), Host: r.Host, Peer: strings.Join(peerHeaders, ","), Listener: "api", Remote: remoteIP(r)})
	})
}

// ports is node n's port proxy: a host {port}-{id}.{domain} of a sandbox
// on n is answered as its port's.
func (c *cluster) ports(n *node) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := hostID(r.Host)
		c.w.mu.Lock()
		sb, ok := c.w.sandboxes[id]
		c.w.mu.Unlock()
		if !ok || sb.node != n.name {
			http.Error(w, "no such sandbox port", http.StatusNotFound)
			return
		}
		from, _ := From(r)
		json.NewEncoder(w).Encode(answer{Node: n.name, Sandbox: id, RoutedBy: from, Host: r.Host, Listener: "ports", Remote: remoteIP(r)})
	})
}

// acks lets the stream test's client tell the handler it has a chunk.
var acks = struct {
	sync.Mutex
	m map[string]chan struct{}
}{m: map[string]chan struct{}{}}

func streamAck(r *http.Request) chan struct{} {
	key := r.URL.Query().Get("ack")
	acks.Lock()
	defer acks.Unlock()
	ch, ok := acks.m[key]
	if !ok {
		ch = make(chan struct{})
		acks.m[key] = ch
	}
	return ch
}

func do(t *testing.T, method, url, auth string, body io.Reader, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := clientFrom.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// clientIP is the address do's requests come from: not the nodes' own
// (127.0.0.1), so that an owner can tell the client from the routing node.
const clientIP = "127.0.0.2"

var clientFrom = &http.Client{Transport: &http.Transport{
	DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}).DialContext,
}}

// remoteIP is the IP r came from.
func remoteIP(r *http.Request) string {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	return host
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

func TestRouted(t *testing.T) {
	c := newCluster(t, "a", "b", "c")
	a := c.nodes["a"].public.URL
	ports := c.nodes["a"].ports.URL
	big := strings.Repeat("x", 3<<20)
	for _, tc := range []struct {
		name, method, url, body string
		hdr                     map[string]string
		node, routedBy          string
	}{
		// The same host on the port proxy's listener is the port's.
		{"port proxy", "GET", ports + "/index.html", "", map[string]string{"Host": "8080-" + onB + ".localhost"}, "b", "a"},
		{"port proxy own", "GET", ports + "/", "", map[string]string{"Host": "8080-" + onA + ".localhost"}, "a", ""},
		{"get on b", "GET", a + "/v1/sandboxes/" + onB, "", nil, "b", "a"},
		{"post on c", "POST", a + "/v1/sandboxes/" + onC + "/exec?x=1", `{"cmd":["ls"]}`, nil, "c", "a"},
		{"big put on b", "PUT", a + "/v1/sandboxes/" + onB + "/files?path=/x", big, nil, "b", "a"},
		{"own sandbox", "GET", a + "/v1/sandboxes/" + onA, "", nil, "a", ""},
		{"e2b api", "POST", a + "/sandboxes/" + onB + "/timeout", `{"timeout":30}`, nil, "b", "a"},
		{"e2b v2 connect", "POST", a + "/v2/sandboxes/" + onC + "/connect", `{}`, nil, "c", "a"},
		{"port host", "GET", a + "/index.html", "", map[string]string{"Host": "8080-" + onB + ".localhost"}, "b", "a"},
		{"envd host", "POST", a + "/process.Process/Start", "{}", map[string]string{"Host": "49983-" + onC + ".e2b.example"}, "c", "a"},
		{"e2b header", "GET", a + "/files", "", map[string]string{"E2b-Sandbox-Id": onB, "E2b-Sandbox-Port": "49983"}, "b", "a"},
		{"port header", "GET", a + "/", "", map[string]string{"Atoll-Sandbox-Id": onC, "Atoll-Sandbox-Port": "80"}, "c", "a"},
		// A lost sandbox is the control plane's: any node answers.
		{"lost", "GET", a + "/v1/sandboxes/" + lostOnC, "", nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := do(t, tc.method, tc.url, keyT1, strings.NewReader(tc.body), tc.hdr)
			if tc.node == "" {
				if st != http.StatusNotFound {
					t.Fatalf("status %d %s, want 404 from the local API", st, b)
				}
				return
			}
			if st != http.StatusOK {
				t.Fatalf("status %d: %s", st, b)
			}
			got := decode[answer](t, b)
			if got.Remote != clientIP {
				t.Errorf("%s saw the request come from %s, want the client's %s", got.Node, got.Remote, clientIP)
			}
			if got.Node != tc.node || got.RoutedBy != tc.routedBy || got.Body != tc.body || got.Peer != "" {
				t.Errorf("answered by %q routed by %q, peer headers %q, body %d bytes; want %q by %q, body %d bytes",
					got.Node, got.RoutedBy, got.Peer, len(got.Body), tc.node, tc.routedBy, len(tc.body))
			}
			wantListener := "api"
			if strings.HasPrefix(tc.url, ports+"/") {
				wantListener = "ports"
			}
			if got.Listener != wantListener {
				t.Errorf("served by the %s listener's handler, want %s's", got.Listener, wantListener)
			}
			if h := tc.hdr["Host"]; h != "" && got.Host != h {
				t.Errorf("owner saw host %q, want %q", got.Host, h)
			}
		})
	}
}

// TestTenantKeys: the router passes the client's key as it is, and the
// owner checks it: another tenant's key opens nothing through routing.
func TestTenantKeys(t *testing.T) {
	c := newCluster(t, "a", "b")
	url := c.nodes["a"].public.URL + "/v1/sandboxes/" + onB
	if st, b := do(t, "GET", url, keyT1, nil, nil); st != http.StatusOK {
		t.Fatalf("owner's tenant: %d %s", st, b)
	}
	for _, key := range []string{keyT2, ""} {
		if st, b := do(t, "GET", url, key, nil, nil); st != http.StatusNotFound {
			t.Errorf("key %q: %d %s, want the owner's 404", key, st, b)
		}
	}
}

func TestStream(t *testing.T) {
	c := newCluster(t, "a", "b")
	key := t.Name()
	resp, br := routedStream(t, c, "GET", "/stream?ack="+key, nil)
	// The owner writes chunk i+1 only once the client has read chunk i
	// through the router: a router that buffered would hang here.
	for i := 0; i < 3; i++ {
		wantLine(t, br, fmt.Sprintf("chunk %d\n", i), fmt.Sprintf("chunk %d did not arrive: the stream is buffered", i))
		if i < 2 {
			streamAck(&http.Request{URL: resp.Request.URL}) <- struct{}{}
		}
	}
}

// routedStream sends a request for path of the sandbox on b to a, which
// routes it, and returns the answer, to be read (until t ends) through
// the reader.
func routedStream(t *testing.T, c *cluster, method, path string, body io.Reader) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(method, c.nodes["a"].public.URL+"/v1/sandboxes/"+onB+path, body)
	req.Header.Set("Authorization", keyT1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// wantLine reads a line of br, which must be want and come within
// testWait; late says what it means if it does not come.
func wantLine(t *testing.T, br *bufio.Reader, want, late string) {
	t.Helper()
	got := make(chan string, 1)
	go func() { line, _ := br.ReadString('\n'); got <- line }()
	select {
	case line := <-got:
		if line != want {
			t.Fatalf("read %q, want %q", line, want)
		}
	case <-time.After(testWait):
		t.Fatal(late)
	}
}

// TestFullDuplex: a request's body goes on streaming to the owner after
// its answer has begun, through the router, line by line.
func TestFullDuplex(t *testing.T) {
	c := newCluster(t, "a", "b")
	pr, pw := io.Pipe()
	_, br := routedStream(t, c, "POST", "/echo", pr)
	for i := range 3 {
		fmt.Fprintf(pw, "line %d\n", i)
		wantLine(t, br, fmt.Sprintf("echo line %d\n", i), fmt.Sprintf("line %d did not come back", i))
	}
	pw.Close()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the body ended: %q, %v", rest, err)
	}
}

func TestWebsocket(t *testing.T) {
	c := newCluster(t, "a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	url := "ws" + strings.TrimPrefix(c.nodes["a"].public.URL, "http") + "/v1/sandboxes/" + onB + "/processes/1/ws"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {keyT1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	for _, msg := range []string{"hello", "again", strings.Repeat("y", 100<<10)} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != "b: "+msg {
			t.Fatalf("echo %.40q, want from b", b)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

// TestHijackedStream: an upgraded raw stream (a PTY's) passes both ways.
func TestHijackedStream(t *testing.T) {
	c := newCluster(t, "a", "b")
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.nodes["a"].public.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testWait))
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/processes/1/attach HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nConnection: Upgrade\r\nUpgrade: atoll-pty\r\n\r\n", onB, keyT1)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	fmt.Fprintf(conn, "echo hi\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "ECHO HI\n" {
		t.Fatalf("read %q, %v", line, err)
	}
}

// TestNoLoop: nodes that disagree on an owner (a's view says b, b's
// says a) forward a request once; the node it reaches serves it, though
// its router (on its node listener too here) would send it back.
func TestNoLoop(t *testing.T) {
	c := newCluster(t, "a", "b")
	const id = "dddddddddddddddddd01"
	c.w.mu.Lock()
	c.w.sandboxes[id] = sandbox{"b", "t1", api.StateRunning}
	c.w.views = map[string]map[string]string{"a": {id: "b"}, "b": {id: "a"}}
	c.w.mu.Unlock()
	a, b := c.nodes["a"], c.nodes["b"]
	st, body := do(t, "GET", a.public.URL+"/v1/sandboxes/"+id, keyT1, nil, nil)
	if st != http.StatusOK {
		t.Fatalf("status %d: %s", st, body)
	}
	if got := decode[answer](t, body); got.Node != "b" || got.RoutedBy != "a" {
		t.Errorf("answered by %q routed by %q, want b routed by a", got.Node, got.RoutedBy)
	}
	if a.served.Load() != 0 || b.served.Load() != 1 {
		t.Errorf("served: a %d, b %d; want 0 and 1", a.served.Load(), b.served.Load())
	}
}

// BenchmarkRouted: a small GET served by its owner directly, and through
// another node's router (mTLS, pooled connections).
func BenchmarkRouted(b *testing.B) {
	c := newCluster(b, "a", "b")
	for _, bc := range []struct{ name, url string }{
		{"direct", c.nodes["b"].public.URL},
		{"routed", c.nodes["a"].public.URL},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req, _ := http.NewRequest("GET", bc.url+"/v1/sandboxes/"+onB, nil)
			req.Header.Set("Authorization", keyT1)
			for b.Loop() {
				doOK(b, req)
			}
		})
	}
}

// BenchmarkRoutedStream: 64 MiB up (a file written) and down (a file
// read), directly and routed.
func BenchmarkRoutedStream(b *testing.B) {
	c := newCluster(b, "a", "b")
	const size = 64 << 20
	for _, bc := range []struct{ name, url string }{
		{"direct", c.nodes["b"].public.URL},
		{"routed", c.nodes["a"].public.URL},
	} {
		for _, dir := range []string{"up", "down"} {
			b.Run(bc.name+"-"+dir, func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					req, _ := http.NewRequest("GET", bc.url+"/v1/sandboxes/"+onB+"/files/source", nil)
					if dir == "up" {
						req, _ = http.NewRequest("PUT", bc.url+"/v1/sandboxes/"+onB+"/files/sink", io.LimitReader(zeros{}, size))
					}
					req.Header.Set("Authorization", keyT1)
					doOK(b, req)
				}
			})
		}
	}
}

// doOK sends req, which must be answered 200, and reads the answer to
// its end.
func doOK(b *testing.B, req *http.Request) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatal(resp.Status)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
