package portproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

const (
	idPublic  = "pub00000000000000000"
	idPrivate = "priv0000000000000000"
	idStopped = "stop0000000000000000"
	idNoNet   = "nonet000000000000000"
	idBroken  = "broken00000000000000"
	idMissing = "missing0000000000000"
)

// sandboxes stands in for the sandbox service, which needs root and a
// bridge to run; every running sandbox is at 127.0.0.1, where the tests'
// servers listen. It counts activity.
type sandboxes struct {
	mu      sync.Mutex
	lookups map[string]int
	touches map[string]int
}

func (s *sandboxes) PortTarget(ctx context.Context, id string) (netip.Addr, bool, error) {
	s.mu.Lock()
	s.lookups[id]++
	s.mu.Unlock()
	switch id {
	case idPublic:
		return netip.MustParseAddr("127.0.0.1"), true, nil
	case idPrivate:
		return netip.MustParseAddr("127.0.0.1"), false, nil
	case idStopped:
		return netip.Addr{}, false, fmt.Errorf("%w: sandbox %s is stopped, not running", errdefs.ErrUnavailable, id)
	case idNoNet:
		return netip.Addr{}, false, fmt.Errorf("%w: no networking", errdefs.ErrUnavailable)
	case idBroken:
		return netip.Addr{}, false, fmt.Errorf("database is locked")
	}
	return netip.Addr{}, false, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

func (s *sandboxes) Touch(id string) {
	s.mu.Lock()
	s.touches[id]++
	s.mu.Unlock()
}

type fixture struct {
	p    *Proxy
	sbs  *sandboxes
	srv  *httptest.Server // the proxy
	port int              // of the upstream, a sandbox's server
	seen chan *http.Request
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{sbs: &sandboxes{lookups: map[string]int{}, touches: map[string]int{}}, seen: make(chan *http.Request, 100)}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		f.seen <- r
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.RequestURI())
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Millisecond)
		}
	})
	// /duplex answers before it reads the request body, then echoes it.
	mux.HandleFunc("/duplex", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		io.WriteString(w, "ready\n")
		rc.Flush()
		br := bufio.NewReader(r.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			io.WriteString(w, "echo "+line)
			rc.Flush()
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw)
	})
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	f.port = up.Listener.Addr().(*net.TCPAddr).Port
	key := make([]byte, 32)
	copy(key, "test key of 32 bytes, no secret")
	var err error
	f.p, err = New(Config{Sandboxes: f.sbs, Key: key, Domain: "sb.test", URLPort: 7401})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.p)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) host(id string) string { return fmt.Sprintf("%d-%s.sb.test", f.port, id) }

// get sends a GET through the proxy with Host host, path and headers h.
func (f *fixture) get(t *testing.T, host, path string, h map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
	req.Host = host
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestParsePort(t *testing.T) {
	for _, s := range []string{"1", "80", "8080", "65535"} {
		if n, err := ParsePort(s); err != nil || strconv.Itoa(n) != s {
			t.Errorf("ParsePort(%q) = %d, %v", s, n, err)
		}
	}
	for _, s := range []string{"", "0", "00", "080", "65536", "99999", "100000", "-1", "+80", "8o", "0x50", " 80", "80 ", "８０"} {
		if n, err := ParsePort(s); err == nil {
			t.Errorf("ParsePort(%q) = %d, want an error", s, n)
		}
	}
}

func TestRouting(t *testing.T) {
	f := newFixture(t)
	port := strconv.Itoa(f.port)
	ok := []struct {
		name, host string
		h          map[string]string
	}{
		{"by host", f.host(idPublic), nil},
		{"by host with the proxy's port", f.host(idPublic) + ":7401", nil},
		{"by host in capitals", strings.ToUpper(f.host(idPublic)), nil},
		{"by host with a trailing dot", f.host(idPublic) + ".", nil},
		{"by headers", "anything.example", map[string]string{HeaderSandboxID: idPublic, HeaderSandboxPort: port}},
		{"the host wins over headers", f.host(idPublic), map[string]string{HeaderSandboxID: idMissing, HeaderSandboxPort: "1"}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.get(t, tc.host, "/x?y=1", tc.h)
			if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello ") || !strings.HasSuffix(body, " /x?y=1") {
				t.Fatalf("%d %q", resp.StatusCode, body)
			}
			r := <-f.seen
			for _, h := range []string{HeaderSandboxID, HeaderSandboxPort, HeaderToken} {
				if r.Header.Get(h) != "" {
					t.Errorf("the sandbox got header %s", h)
				}
			}
			if r.Header.Get("X-Forwarded-For") == "" {
				t.Error("no X-Forwarded-For")
			}
		})
	}
	bad := []struct {
		name, host string
		h          map[string]string
		status     int
		code       string
	}{
		{"port 0", "0-" + idPublic + ".sb.test", nil, 400, "invalid"},
		{"port 65536", "65536-" + idPublic + ".sb.test", nil, 400, "invalid"},
		{"non-numeric port", "http-" + idPublic + ".sb.test", nil, 400, "invalid"},
		{"no port", idPublic + ".sb.test", nil, 400, "invalid"},
		{"malformed ID", port + "-Pub00000000000000000x.sb.test", nil, 400, "invalid"},
		{"short ID", port + "-abc.sb.test", nil, 400, "invalid"},
		{"nested label", port + "-" + idPublic + ".x.sb.test", nil, 400, "invalid"},
		{"neither host nor headers", "sb.test", nil, 400, "invalid"},
		{"another domain", port + "-" + idPublic + ".example.com", nil, 400, "invalid"},
		{"header port 0", "x", map[string]string{HeaderSandboxID: idPublic, HeaderSandboxPort: "0"}, 400, "invalid"},
		{"header port 65536", "x", map[string]string{HeaderSandboxID: idPublic, HeaderSandboxPort: "65536"}, 400, "invalid"},
		{"header port missing", "x", map[string]string{HeaderSandboxID: idPublic}, 400, "invalid"},
		{"header ID malformed", "x", map[string]string{HeaderSandboxID: "../../etc", HeaderSandboxPort: port}, 400, "invalid"},
		{"unknown sandbox", f.host(idMissing), nil, 404, "not_found"},
		{"stopped sandbox", f.host(idStopped), nil, 503, "unavailable"},
		{"no network", f.host(idNoNet), nil, 503, "unavailable"},
		{"service failing", f.host(idBroken), nil, 503, "unavailable"},
		{"nothing listening", "1-" + idPublic + ".sb.test", nil, 502, "unavailable"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.get(t, tc.host, "/", tc.h)
			var e api.Error
			if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tc.status || e.Code != tc.code || e.Message == "" {
				t.Fatalf("%d %q, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if strings.Contains(body, "database") {
				t.Errorf("internal error shown: %s", body)
			}
		})
	}
}

func TestAccess(t *testing.T) {
	f := newFixture(t)
	host := f.host(idPrivate)
	status := func(path string, h map[string]string) int {
		t.Helper()
		resp, _ := f.get(t, host, path, h)
		return resp.StatusCode
	}
	signed := func(id string, port int, ttl time.Duration) string {
		u, err := url.Parse(f.p.URL(id, port, false, ttl).SignedURL)
		if err != nil {
			t.Fatal(err)
		}
		return u.RequestURI()
	}
	if s := status("/", nil); s != 401 {
		t.Errorf("no token: %d, want 401", s)
	}
	if s := status("/", map[string]string{HeaderToken: f.p.Token(idPrivate)}); s != 200 {
		t.Errorf("token: %d", s)
	}
	<-f.seen
	for name, tok := range map[string]string{"wrong": "atp_x", "another sandbox's": f.p.Token(idPublic)} {
		if s := status("/", map[string]string{HeaderToken: tok}); s != 401 {
			t.Errorf("%s token: %d, want 401", name, s)
		}
	}
	// A signed URL opens the port, sets a cookie for what a browser loads
	// next, and reaches the sandbox without its parameters.
	resp, body := f.get(t, host, signed(idPrivate, f.port, time.Minute)+"&q=1", nil)
	if resp.StatusCode != 200 || !strings.HasSuffix(body, " /?q=1") {
		t.Fatalf("signed URL: %d %q", resp.StatusCode, body)
	}
	<-f.seen
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatal("no cookie")
	}
	if s := status("/next", map[string]string{"Cookie": cookie.Name + "=" + cookie.Value + "; app=1"}); s != 200 {
		t.Errorf("cookie: %d", s)
	}
	if r := <-f.seen; r.Header.Get("Cookie") != "app=1" {
		t.Errorf("the sandbox got cookies %q, want only its own", r.Header.Get("Cookie"))
	}
	u := signed(idPrivate, f.port, time.Minute)
	exp := time.Now().Add(-time.Second).Unix()
	expired := fmt.Sprintf("/?%s=%d&%s=%s", ParamExpires, exp, ParamSig, f.p.sign(idPrivate, f.port, exp))
	refused := map[string]string{
		"expired":                     expired,
		"tampered signature":          strings.Replace(u, ParamSig+"=", ParamSig+"=A", 1),
		"extended expiry":             strings.Replace(u, ParamExpires+"=1", ParamExpires+"=2", 1),
		"another port's signature":    signed(idPrivate, f.port+1, time.Minute),
		"another sandbox's signature": signed(idPublic, f.port, time.Minute),
		"signature alone":             "/?" + ParamSig + "=" + f.p.sign(idPrivate, f.port, 0),
		"garbage":                     "/?" + ParamExpires + "=x&" + ParamSig + "=y",
	}
	for name, path := range refused {
		if s := status(path, nil); s != 401 {
			t.Errorf("%s: %d, want 401", name, s)
		}
	}
	if s := status("/", map[string]string{"Cookie": cookieName + "=" + strconv.FormatInt(exp, 10) + "." + f.p.sign(idPrivate, f.port, exp)}); s != 401 {
		t.Errorf("expired cookie: %d, want 401", s)
	}
	// Public ports need nothing.
	if resp, _ := f.get(t, f.host(idPublic), "/", nil); resp.StatusCode != 200 {
		t.Errorf("public: %d", resp.StatusCode)
	}
}

func TestURL(t *testing.T) {
	f := newFixture(t)
	u := f.p.URL(idPrivate, 8080, false, 0)
	if u.URL != "http://8080-"+idPrivate+".sb.test:7401/" || u.Token == "" || u.SignedURL != "" || u.ExpiresAt != nil {
		t.Errorf("%+v", u)
	}
	u = f.p.URL(idPublic, 8080, true, time.Hour)
	if u.Token != "" || !strings.HasPrefix(u.SignedURL, u.URL+"?") || u.ExpiresAt == nil || time.Until(*u.ExpiresAt) < 59*time.Minute {
		t.Errorf("%+v", u)
	}
	p, _ := New(Config{Sandboxes: f.sbs, Key: make([]byte, 32), URLPort: 80})
	if u := p.URL(idPublic, 3000, true, 0); u.URL != "http://3000-"+idPublic+".localhost/" {
		t.Errorf("default domain, port 80: %s", u.URL)
	}
}

func TestStreamAndUpgrade(t *testing.T) {
	f := newFixture(t)
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)

	// Streaming: the first chunk arrives before the sandbox has finished.
	fmt.Fprintf(conn, "GET /stream HTTP/1.1\r\nHost: %s\r\n\r\n", f.host(idPublic))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "chunk 0\n" || time.Since(t0) > 300*time.Millisecond {
		t.Errorf("first chunk %q %v after %v", line, err, time.Since(t0))
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// An upgrade becomes a two-way byte stream, on the same connection.
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", f.host(idPublic))
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo: %q %v", got, err)
		}
	}
	conn.Close()
	// The proxy touched the sandbox at the end of each request.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.sbs.mu.Lock()
		n, l := f.sbs.touches[idPublic], f.sbs.lookups[idPublic]
		f.sbs.mu.Unlock()
		if n >= 2 && l >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("touches %d, lookups %d; want 2 each", n, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAnswerBeforeBody: a sandbox's server may answer before it has read
// the whole request body (a streaming RPC, an execution service that starts
// its reply at once), and the proxy keeps passing the body on after the
// answer's headers have gone back.
func TestAnswerBeforeBody(t *testing.T) {
	f := newFixture(t)
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	fmt.Fprintf(conn, "POST /duplex HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", f.host(idPublic))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); line != "ready\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	for _, msg := range []string{"one\n", "two\n"} {
		fmt.Fprintf(conn, "%x\r\n%s\r\n", len(msg), msg)
		if line, err := body.ReadString('\n'); line != "echo "+msg {
			t.Fatalf("after sending %q the answer says %q, %v", msg, line, err)
		}
	}
	io.WriteString(conn, "0\r\n\r\n")
	if rest, err := io.ReadAll(body); err != nil || len(rest) != 0 {
		t.Errorf("the answer ends with %q, %v", rest, err)
	}
}

func TestLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "port-key")
	k1, err := LoadKey(path)
	if err != nil || len(k1) != 32 {
		t.Fatal(len(k1), err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v %v", fi.Mode(), err)
	}
	k2, err := LoadKey(path)
	if err != nil || string(k1) != string(k2) {
		t.Errorf("second load differs: %v", err)
	}
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := LoadKey(path); err == nil {
		t.Error("a malformed key loads")
	}
}

// ServePort is for a caller that routed the request and checked access
// itself (the E2B API): private ports open, lookups still decide.
func TestServePort(t *testing.T) {
	f := newFixture(t)
	serve := func(id string, port int) (int, string) {
		req := httptest.NewRequest("GET", "/x", nil)
		rec := httptest.NewRecorder()
		f.p.ServePort(rec, req, id, port, nil)
		return rec.Code, rec.Body.String()
	}
	if code, body := serve(idPrivate, f.port); code != 200 || !strings.HasSuffix(body, " /x") {
		t.Errorf("private sandbox: %d %s", code, body)
	}
	<-f.seen
	for _, c := range []struct {
		id   string
		port int
		want int
	}{
		{idPublic, 0, 400}, {idPublic, 70000, 400}, {"../x", f.port, 400}, {"nosuchsandbox0000000", f.port, 404},
		{idStopped, f.port, 503}, {idBroken, f.port, 503},
	} {
		if code, body := serve(c.id, c.port); code != c.want {
			t.Errorf("%s:%d: %d %s, want %d", c.id, c.port, code, body, c.want)
		}
	}

	// A caller's FailFunc answers instead, told whether the sandbox is gone.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	for _, c := range []struct {
		id   string
		port int
		want Failure
	}{
		{"nosuchsandbox0000000", f.port, Failure{Status: 404, Code: "not_found", SandboxGone: true}},
		{idStopped, f.port, Failure{Status: 503, Code: "unavailable", SandboxGone: true}},
		{idPublic, closed, Failure{Status: 502, Code: "unavailable"}},
	} {
		var got *Failure
		rec := httptest.NewRecorder()
		f.p.ServePort(rec, httptest.NewRequest("GET", "/x", nil), c.id, c.port, func(w http.ResponseWriter, f Failure) {
			got = &f
			w.WriteHeader(599)
		})
		if got == nil || rec.Code != 599 {
			t.Errorf("%s:%d: FailFunc not called: %d %s", c.id, c.port, rec.Code, rec.Body.String())
			continue
		}
		got.Message = ""
		if *got != c.want {
			t.Errorf("%s:%d: %+v, want %+v", c.id, c.port, *got, c.want)
		}
	}
}
