package atoll_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/testenv/memstore"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

const key = "sdk-test-key"

// sandboxes holds sandboxes in memory; all reach one test agent.
type sandboxes struct {
	sock  string
	m     *memstore.Table[api.Sandbox]
	snaps *memstore.Table[api.Snapshot]
	pols  *memstore.Table[api.NetworkPolicy]
}

// Placement answers as a cluster node does for a placed sandbox.
func (s *sandboxes) Placement(ctx context.Context, id string) (api.Placement, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return api.Placement{}, err
	}
	return api.Placement{Sandbox: id, Node: "n1", Passed: 1, Candidates: []api.PlacementCandidate{{Node: "n1", Score: 1.5,
		Parts: []api.PlacementPart{{Term: "free", Value: 1, Weighted: 1}}}},
		Filtered: []api.PlacementFiltered{{Node: "n2", Filter: "schedule", Reason: "cordoned"}}}, nil
}

func (s *sandboxes) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return api.SandboxNetwork{}, err
	}
	p, err := s.pols.Get(id)
	if err != nil {
		p = api.NetworkPolicy{Egress: "allow-all"}
	}
	return api.SandboxNetwork{IPv4: "10.213.0.2", IPv6: "fd00::2", Policy: p}, nil
}

// Metrics answers one sample at each of start and end that are set: the
// test checks what the client sends.
func (s *sandboxes) Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return nil, err
	}
	var out []api.Metric
	for _, t := range []time.Time{start, end} {
		if !t.IsZero() {
			out = append(out, api.Metric{Time: t.UTC(), CPUCount: 1})
		}
	}
	return out, nil
}

func (s *sandboxes) SetNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.SandboxNetwork, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return api.SandboxNetwork{}, err
	}
	s.pols.Put(id, p)
	return s.GetNetwork(ctx, id)
}

func (s *sandboxes) SetPorts(ctx context.Context, id string, p api.PortAccess) (api.Sandbox, error) {
	return s.m.Update(id, func(sb *api.Sandbox) error {
		sb.Ports = p
		return nil
	})
}

func (s *sandboxes) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return s.m.Insert(func(n int) (string, api.Sandbox) {
		id := fmt.Sprintf("sdk%017d", n)
		return id, api.Sandbox{ID: id, State: api.StateRunning, Template: req.Template, Labels: req.Labels}
	}), nil
}

func (s *sandboxes) Get(ctx context.Context, id string) (api.Sandbox, error) {
	return s.m.Get(id)
}

func (s *sandboxes) List(ctx context.Context, state string, labels map[string]string) ([]api.Sandbox, error) {
	return s.m.List(func(sb api.Sandbox) bool {
		return (state == "" || sb.State == state) && (labels["team"] == "" || sb.Labels["team"] == labels["team"])
	}), nil
}

func (s *sandboxes) set(id, from, to string) (api.Sandbox, error) {
	return s.m.Update(id, func(sb *api.Sandbox) error {
		if sb.State != from {
			return fmt.Errorf("sandbox is %s: %w", sb.State, errdefs.ErrConflict)
		}
		sb.State = to
		return nil
	})
}

func (s *sandboxes) Stop(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateRunning, api.StateStopped)
}

func (s *sandboxes) Start(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateStopped, api.StateRunning)
}

func (s *sandboxes) SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error) {
	return s.m.Update(id, func(sb *api.Sandbox) error {
		if sb.State != api.StateRunning && sb.State != api.StatePaused {
			return fmt.Errorf("sandbox is %s: %w", sb.State, errdefs.ErrConflict)
		}
		sb.ExpiresAt = nil
		if req.TimeoutSec > 0 {
			exp := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(req.TimeoutSec) * time.Second)
			sb.ExpiresAt = &exp
		}
		return nil
	})
}

func (s *sandboxes) Delete(ctx context.Context, id string) error {
	_, err := s.m.Delete(id, nil)
	return err
}

func (s *sandboxes) AgentDialer(ctx context.Context, id string) (func(context.Context) (net.Conn, error), error) {
	sb, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != api.StateRunning {
		return nil, errdefs.ErrConflict
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.sock)
	}, nil
}

type auth struct{}

func (auth) Authenticate(ctx context.Context, k string) (string, error) {
	if k != key {
		return "", errdefs.ErrUnauthorized
	}
	return "default", nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// agent imitates the agent protocol over a map of files.
func agent() http.Handler {
	var mu sync.Mutex
	files := map[string][]byte{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /exec", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Background {
			writeJSON(w, 200, api.Process{PID: 7, Cmd: req.Cmd, Running: true, PTY: req.PTY != nil})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		code := len(req.Cmd)
		enc.Encode(api.ExecEvent{Type: "start", PID: 7})
		enc.Encode(api.ExecEvent{Type: "stdout", Data: []byte(strings.Join(req.Cmd, " ") + "\n")})
		enc.Encode(api.ExecEvent{Type: "stderr", Data: []byte("warning\n")})
		enc.Encode(api.ExecEvent{Type: "exit", ExitCode: &code})
	})
	mux.HandleFunc("POST /processes/{pid}/signal", func(w http.ResponseWriter, r *http.Request) {
		var req api.SignalRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Signal != "SIGTERM" {
			writeJSON(w, 400, api.Error{Code: "invalid", Message: "unknown signal"})
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("PUT /files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p := r.URL.Query().Get("path")
		mu.Lock()
		files[p] = b
		mu.Unlock()
		writeJSON(w, 200, api.FileInfo{Name: filepath.Base(p), Path: p, Type: "file", Size: int64(len(b)), Mode: 0o644})
	})
	mux.HandleFunc("GET /files", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b, ok := files[r.URL.Query().Get("path")]
		mu.Unlock()
		if !ok {
			writeJSON(w, 404, api.Error{Code: "not_found", Message: "no such file"})
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("GET /files/watch", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.WatchEvent{Type: "create", Path: "/a"})
		enc.Encode(api.WatchEvent{Type: "remove", Path: "/a"})
	})
	mux.HandleFunc("GET /processes/{pid}/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				c.Write(ctx, websocket.MessageBinary, fmt.Appendf(nil, "resized %s\n", b))
				continue
			}
			if string(b) == "exit\r" {
				code := 5
				ev, _ := json.Marshal(api.ExecEvent{Type: "exit", ExitCode: &code})
				c.Write(ctx, websocket.MessageText, ev)
				c.Close(websocket.StatusNormalClosure, "")
				return
			}
			c.Write(ctx, websocket.MessageBinary, b)
		}
	})
	return mux
}

func newClient(t *testing.T, apiKey string) (*atoll.Client, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "atoll-sdk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	as := &http.Server{Handler: agent()}
	go as.Serve(ln)
	t.Cleanup(func() { as.Close() })
	sbs := &sandboxes{sock: sock, m: memstore.New[api.Sandbox]("sandbox"), snaps: memstore.New[api.Snapshot]("snapshot"), pols: memstore.New[api.NetworkPolicy]("network policy")}
	s, err := server.New(server.Config{Sandboxes: sbs, Templates: newTemplates(), Auth: auth{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	sb, _ := sbs.Create(context.Background(), api.CreateSandboxRequest{Template: "host"})
	return atoll.New(ts.URL+"/", apiKey), sb.ID
}

func TestSandboxes(t *testing.T) {
	c, _ := newClient(t, key)
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "host", Labels: map[string]string{"team": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.ID != sb.ID {
		t.Fatalf("GetSandbox = %+v, %v", got, err)
	}
	l, err := c.ListSandboxes(ctx, atoll.ListOptions{State: "running", Labels: map[string]string{"team": "x"}})
	if err != nil || len(l) != 1 {
		t.Fatalf("ListSandboxes = %v, %v", l, err)
	}
	if sb, err := c.StopSandbox(ctx, sb.ID); err != nil || sb.State != api.StateStopped {
		t.Fatalf("StopSandbox = %+v, %v", sb, err)
	}
	_, err = c.StopSandbox(ctx, sb.ID)
	if !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("second StopSandbox: %v, want ErrConflict", err)
	}
	if sb, err := c.StartSandbox(ctx, sb.ID); err != nil || sb.State != api.StateRunning {
		t.Fatalf("StartSandbox = %+v, %v", sb, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSandbox(ctx, sb.ID)
	var e *atoll.Error
	if !errors.As(err, &e) || e.StatusCode != 404 || e.Code != "not_found" || !errors.Is(err, atoll.ErrNotFound) || errors.Is(err, atoll.ErrConflict) {
		t.Errorf("GetSandbox of deleted: %#v", err)
	}
	_, err = c.GetSandbox(ctx, "NOT-AN-ID")
	if !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("GetSandbox of malformed ID: %v, want ErrInvalid", err)
	}
}

func TestNetwork(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	n, err := c.GetNetwork(ctx, id)
	if err != nil || n.IPv4 == "" || n.Policy.Egress != "allow-all" {
		t.Fatalf("GetNetwork = %+v, %v", n, err)
	}
	want := api.NetworkPolicy{Egress: "deny-all", Allow: []string{"example.com", "10.0.0.0/8"}, Deny: []string{"10.1.0.0/16"}}
	if n, err := c.SetNetwork(ctx, id, want); err != nil || n.Policy.Egress != "deny-all" || len(n.Policy.Allow) != 2 {
		t.Fatalf("SetNetwork = %+v, %v", n, err)
	}
	if _, err := c.SetNetwork(ctx, id, api.NetworkPolicy{Allow: []string{"*.*.example"}}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("SetNetwork with a bad wildcard: %v, want ErrInvalid", err)
	}
	if _, err := c.GetNetwork(ctx, "zzzzzzzzzzzzzzzzzzzz"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("GetNetwork of an unknown sandbox: %v", err)
	}
	p, err := c.GetPlacement(ctx, id)
	if err != nil || p.Node != "n1" || len(p.Candidates) != 1 || p.Candidates[0].Parts[0].Term != "free" ||
		len(p.Filtered) != 1 || p.Filtered[0].Reason != "cordoned" {
		t.Errorf("GetPlacement = %+v, %v", p, err)
	}
	if _, err := c.GetPlacement(ctx, "zzzzzzzzzzzzzzzzzzzz"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("GetPlacement of an unknown sandbox: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	if ms, err := c.Metrics(ctx, id, time.Time{}, time.Time{}); err != nil || len(ms) != 0 {
		t.Errorf("Metrics with open ends = %+v, %v", ms, err)
	}
	// Times go to the second, in any zone.
	start := time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("x", 3600))
	end := start.Add(time.Hour)
	ms, err := c.Metrics(ctx, id, start, end)
	if err != nil || len(ms) != 2 || !ms[0].Time.Equal(start.Truncate(time.Second)) || !ms[1].Time.Equal(end.Truncate(time.Second)) {
		t.Errorf("Metrics(%s, %s) = %+v, %v", start, end, ms, err)
	}
	if _, err := c.Metrics(ctx, id, end, start); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("Metrics with start after end: %v, want ErrInvalid", err)
	}
	if _, err := c.Metrics(ctx, "zzzzzzzzzzzzzzzzzzzz", start, end); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("Metrics of an unknown sandbox: %v", err)
	}
}

func TestSetTimeout(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		timeout time.Duration
		want    time.Duration // from base; 0: no expires_at
	}{
		{30 * time.Minute, 30 * time.Minute},
		{1500 * time.Millisecond, 2 * time.Second}, // rounded up, never to 0
		{0, 0},
	} {
		sb, err := c.SetTimeout(ctx, id, tc.timeout)
		switch {
		case err != nil:
			t.Errorf("SetTimeout(%v): %v", tc.timeout, err)
		case tc.want == 0 && sb.ExpiresAt != nil:
			t.Errorf("SetTimeout(%v): expires_at %v, want none", tc.timeout, sb.ExpiresAt)
		case tc.want != 0 && (sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(base.Add(tc.want))):
			t.Errorf("SetTimeout(%v): expires_at %v, want %v", tc.timeout, sb.ExpiresAt, base.Add(tc.want))
		}
	}
	for _, d := range []time.Duration{-time.Second, 366 * 24 * time.Hour} {
		if _, err := c.SetTimeout(ctx, id, d); !errors.Is(err, atoll.ErrInvalid) {
			t.Errorf("SetTimeout(%v): %v, want ErrInvalid", d, err)
		}
	}
	if _, err := c.StopSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetTimeout(ctx, id, time.Minute); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("SetTimeout of a stopped sandbox: %v, want ErrConflict", err)
	}
}

func TestUnauthorized(t *testing.T) {
	c, id := newClient(t, "wrong")
	if _, err := c.ListSandboxes(context.Background(), atoll.ListOptions{}); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("ListSandboxes with a wrong key: %v", err)
	}
	if _, err := c.Terminal(context.Background(), id, 7); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("Terminal with a wrong key: %v", err)
	}
	if h, err := c.Health(context.Background()); err != nil || h.Status != "ok" {
		t.Errorf("Health = %+v, %v", h, err)
	}
}

func TestExec(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	var stdout, stderr bytes.Buffer
	code, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "hi"}}, &stdout, &stderr)
	if err != nil || code != 2 || stdout.String() != "echo hi\n" || stderr.String() != "warning\n" {
		t.Errorf("Exec = %d, %v; stdout %q, stderr %q", code, err, stdout.String(), stderr.String())
	}
	s, err := c.ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var types []string
	for ev := range s.All() {
		types = append(types, ev.Type)
	}
	if diff := cmp.Diff([]string{"start", "stdout", "stderr", "exit"}, types); diff != "" || s.Err() != nil {
		t.Errorf("ExecStream events (-want +got):\n%s%v", diff, s.Err())
	}
	p, err := c.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "9"}})
	if err != nil || p.PID != 7 || !p.Running {
		t.Errorf("StartProcess = %+v, %v", p, err)
	}
	if err := c.Signal(ctx, id, 7, "SIGTERM"); err != nil {
		t.Errorf("Signal: %v", err)
	}
	if err := c.Signal(ctx, id, 7, "SIGNOPE"); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("Signal SIGNOPE: %v, want ErrInvalid", err)
	}
}

func TestFiles(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	fi, err := c.WriteFile(ctx, id, "/work/a.txt", strings.NewReader("hello"), 0o600)
	if err != nil || fi.Size != 5 {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	rc, err := c.ReadFile(ctx, id, "/work/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Errorf("ReadFile = %q", b)
	}
	if _, err := c.ReadFile(ctx, id, "/nope"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("ReadFile of a missing file: %v", err)
	}
	w, err := c.Watch(ctx, id, "/", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var evs []api.WatchEvent
	for w.Next() {
		evs = append(evs, w.Event())
	}
	if len(evs) != 2 || evs[1].Type != "remove" {
		t.Errorf("Watch events %+v", evs)
	}
}

func TestTerminal(t *testing.T) {
	c, id := newClient(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := c.Terminal(ctx, id, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if _, err := term.Write([]byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(term, buf); err != nil || string(buf) != "ls\r" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if err := term.Resize(30, 90); err != nil {
		t.Fatal(err)
	}
	buf = make([]byte, 64)
	n, err := term.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), `"rows":30`) {
		t.Fatalf("after resize read %q, %v", buf[:n], err)
	}
	term.Write([]byte("exit\r"))
	if code, err := term.Wait(); err != nil || code != 5 {
		t.Errorf("Wait = %d, %v; want 5", code, err)
	}
}
