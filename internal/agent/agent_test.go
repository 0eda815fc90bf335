package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
)

// helperEnv makes the test binary run Main instead of the tests.
const helperEnv = "ATOLL_AGENT_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		Main(nil, nil)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// needRoot skips a test that needs root, or fails it under ATOLL_TEST_STRICT=1.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("ATOLL_TEST_STRICT") == "1" {
		t.Fatal("test needs root and ATOLL_TEST_STRICT=1")
	}
	t.Skip("test needs root")
}

// shortTempDir is a temp dir whose paths fit in a unix socket address and
// that user 1000 may enter.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type testEnv struct {
	a    *Agent
	c    *Client
	dir  string // scratch space, also holds etc/ and home/
	home string // home of "user"
}

// startAgent runs an agent in this process on a unix socket. Its "user" is
// uid 1000 with supplementary group 1001, from an etc dir of its own.
func startAgent(t *testing.T, cfg Config) *testEnv {
	t.Helper()
	needRoot(t)
	dir := shortTempDir(t)
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	etc := filepath.Join(dir, "etc")
	os.Mkdir(etc, 0o755)
	passwd := "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::" + home + ":/bin/sh\n"
	group := "root:x:0:\nuser:x:1000:\nextra:x:1001:other,user\nnope:x:1002:other\n"
	os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte(group), 0o644)
	if cfg.EtcDir == "" {
		cfg.EtcDir = etc
	}

	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		a.Close()
	})
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &testEnv{a: a, c: c, dir: dir, home: home}
}

// wantStatus checks that err is an agent answer with this status and code.
func wantStatus(t *testing.T, err error, status int, code string) {
	t.Helper()
	var se *StatusError
	if !errors.As(err, &se) {
		t.Fatalf("got error %v, want a %d %s answer", err, status, code)
	}
	if se.Status != status || se.Code != code {
		t.Fatalf("got %d %s (%s), want %d %s", se.Status, se.Code, se.Message, status, code)
	}
}

func TestBadRequests(t *testing.T) {
	e := startAgent(t, Config{})
	os.MkdirAll(filepath.Join(e.dir, "full", "x"), 0o755)
	os.WriteFile(filepath.Join(e.dir, "file"), nil, 0o644)
	q := func(p string) string { return "path=" + p }
	huge := `{"cmd":["true"],"env":{"A":"` + strings.Repeat("x", 2<<20) + `"}}`
	tests := []struct {
		name, method, url, body string
		status                  int
		code                    string
	}{
		{"unknown endpoint", "GET", "/nope", "", 404, "not_found"},
		{"wrong method", "DELETE", "/health", "", 404, "not_found"},
		{"relative path", "GET", "/files/stat?" + q("etc/passwd"), "", 400, "invalid"},
		{"no path", "GET", "/files/stat", "", 400, "invalid"},
		{"NUL in path", "GET", "/files/stat?" + q("/etc%00/passwd"), "", 400, "invalid"},
		{"missing file", "GET", "/files?" + q(e.dir+"/missing"), "", 404, "not_found"},
		{"read a dir", "GET", "/files?" + q(e.dir), "", 400, "invalid"},
		{"read a device", "GET", "/files?" + q("/dev/null"), "", 400, "invalid"},
		{"list a file", "GET", "/files/list?" + q(e.dir+"/file"), "", 400, "invalid"},
		{"write over a dir", "PUT", "/files?" + q(e.dir+"/full"), "x", 400, "invalid"},
		{"write below a file", "PUT", "/files?" + q(e.dir+"/file/x"), "x", 400, "invalid"},
		{"bad mode", "PUT", "/files?" + q(e.dir+"/m") + "&mode=999", "x", 400, "invalid"},
		{"mode too big", "PUT", "/files?" + q(e.dir+"/m") + "&mode=17777", "x", 400, "invalid"},
		{"remove /", "DELETE", "/files?" + q("/") + "&recursive=true", "", 400, "invalid"},
		{"remove non-empty dir", "DELETE", "/files?" + q(e.dir+"/full"), "", 409, "conflict"},
		{"remove missing", "DELETE", "/files?" + q(e.dir+"/missing"), "", 404, "not_found"},
		{"bad recursive", "DELETE", "/files?" + q(e.dir+"/full") + "&recursive=maybe", "", 400, "invalid"},
		{"mkdir over a file", "POST", "/files/mkdir", `{"path":"` + e.dir + `/file"}`, 409, "conflict"},
		{"mkdir relative", "POST", "/files/mkdir", `{"path":"x/y"}`, 400, "invalid"},
		{"unknown field", "POST", "/files/mkdir", `{"path":"/tmp/x","owner":"me"}`, 400, "invalid"},
		{"bad JSON", "POST", "/files/mkdir", `{"path":`, 400, "invalid"},
		{"empty body", "POST", "/files/mkdir", ``, 400, "invalid"},
		{"trailing data", "POST", "/files/mkdir", `{"path":"/tmp/x"} {}`, 400, "invalid"},
		{"chmod bad mode", "POST", "/files/chmod", `{"path":"` + e.dir + `/file","mode":65535}`, 400, "invalid"},
		{"chmod missing", "POST", "/files/chmod", `{"path":"` + e.dir + `/missing","mode":420}`, 404, "not_found"},
		{"rename missing", "POST", "/files/rename", `{"from":"` + e.dir + `/missing","to":"` + e.dir + `/b"}`, 404, "not_found"},
		{"rename /", "POST", "/files/rename", `{"from":"/","to":"` + e.dir + `/b"}`, 400, "invalid"},
		{"tar into a file", "PUT", "/files/tar?" + q(e.dir+"/file"), "", 400, "invalid"},
		{"tar garbage", "PUT", "/files/tar?" + q(e.dir+"/t"), strings.Repeat("garbage!", 100), 400, "invalid"},
		{"watch missing", "GET", "/files/watch?" + q(e.dir+"/missing"), "", 404, "not_found"},
		{"huge JSON", "POST", "/exec", huge, 413, "too_large"},
		{"exec unknown field", "POST", "/exec", `{"cmd":["true"],"sudo":true}`, 400, "invalid"},
		{"exec nothing", "POST", "/exec", `{}`, 400, "invalid"},
		{"exec cmd and shell", "POST", "/exec", `{"cmd":["true"],"shell":"true"}`, 400, "invalid"},
		{"exec missing binary", "POST", "/exec", `{"cmd":["no-such-binary"]}`, 400, "invalid"},
		{"exec missing cwd", "POST", "/exec", `{"cmd":["true"],"cwd":"/no/such/dir"}`, 400, "invalid"},
		{"exec relative cwd", "POST", "/exec", `{"cmd":["true"],"cwd":"tmp"}`, 400, "invalid"},
		{"exec unknown user", "POST", "/exec", `{"cmd":["true"],"user":"admin"}`, 400, "invalid"},
		{"exec bad env", "POST", "/exec", `{"cmd":["true"],"env":{"A=B":"c"}}`, 400, "invalid"},
		{"exec negative timeout", "POST", "/exec", `{"cmd":["true"],"timeout_ms":-1}`, 400, "invalid"},
		{"exec empty pty", "POST", "/exec", `{"cmd":["true"],"pty":{"rows":0,"cols":80}}`, 400, "invalid"},
		{"unknown pid", "GET", "/processes/999999999", "", 404, "not_found"},
		{"bad pid", "GET", "/processes/abc", "", 400, "invalid"},
		{"signal unknown pid", "POST", "/processes/999999999/signal", `{"signal":"TERM"}`, 404, "not_found"},
		{"stdin unknown pid", "POST", "/processes/999999999/stdin", `x`, 404, "not_found"},
		{"attach unknown pid", "GET", "/processes/999999999/attach", ``, 404, "not_found"},
		{"ws unknown pid", "GET", "/processes/999999999/ws", ``, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, baseURL+tt.url, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := e.c.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var got api.Error
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatalf("decoding error body: %v", err)
			}
			if resp.StatusCode != tt.status || got.Code != tt.code {
				t.Errorf("got %d %+v, want %d %s", resp.StatusCode, got, tt.status, tt.code)
			}
			if got.Message == "" {
				t.Error("empty message")
			}
		})
	}
}

func TestRecoverer(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h := surface.Recover(a.log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	var got api.Error
	json.Unmarshal(w.Body.Bytes(), &got)
	if diff := cmp.Diff(api.Error{Code: "internal", Message: "internal error"}, got); w.Code != 500 || diff != "" {
		t.Errorf("status %d, body diff (-want +got):\n%s", w.Code, diff)
	}
}

// TestEarlyAnswerWithBody sends large bodies the way Python's http.client
// does, the whole body before reading the answer, to requests the agent
// refuses without reading them: the refusal must arrive, not a reset, and
// the connection stay usable.
func TestEarlyAnswerWithBody(t *testing.T) {
	env := startAgent(t, Config{})
	conn, err := net.Dial("unix", filepath.Join(env.dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	body := bytes.Repeat([]byte("x"), 8<<20) // far above what Go's server discards for us
	for _, target := range []string{"/files?path=relative", "/files?path=/x&mode=999999", "/files/tar?path=relative"} {
		req := fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: agent\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", target, len(body))
		if _, err := conn.Write(append([]byte(req), body...)); err != nil {
			t.Fatalf("%s: sending the body: %v", target, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", target, err)
		}
		var e api.Error
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Code != api.CodeInvalid {
			t.Errorf("%s: %d %+v, want 400 invalid", target, resp.StatusCode, e)
		}
		if resp.Close {
			t.Errorf("%s: the agent closes the connection after the answer", target)
		}
	}
	// The same connection still answers.
	if _, err := conn.Write([]byte("GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health after the refusals: %v %v", resp, err)
	}
	resp.Body.Close()
}
