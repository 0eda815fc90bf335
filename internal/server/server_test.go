package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"github.com/atoll-dev/atoll/internal/portproxy"
)

const testKey = "test-key-0123456789"

// memSandboxes is a small in-memory Sandboxes whose running sandboxes all reach
// one test agent over a real unix socket.
type memSandboxes struct {
	agentSock string

	mu    sync.Mutex
	sbs   map[string]api.Sandbox
	snaps map[string]api.Snapshot
	from  map[string]string // sandbox ID → the snapshot it was created from
	n     int
	// policies are the egress policies SetNetwork set, by sandbox ID.
	policies map[string]api.NetworkPolicy
}

func (m *memSandboxes) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	switch req.Template {
	case "explode":
		return api.Sandbox{}, errors.New("opening /var/lib/atoll/secret/layer: input/output error")
	case "missing":
		return api.Sandbox{}, fmt.Errorf("template missing: %w", errors.Join(errdefs.ErrNotFound,
			&fs.PathError{Op: "open", Path: "/var/lib/atoll/templates/missing", Err: fs.ErrNotExist}))
	case "big":
		return api.Sandbox{}, fmt.Errorf("%w: 10 sandboxes already running", errdefs.ErrQuota)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.Snapshot != "" {
		snap, ok := m.snaps[req.Snapshot]
		if !ok {
			return api.Sandbox{}, fmt.Errorf("snapshot %s: %w", req.Snapshot, errdefs.ErrNotFound)
		}
		req.Template = snap.Template
	}
	return m.create(req), nil
}

// create adds a running sandbox; m.mu must be held.
func (m *memSandboxes) create(req api.CreateSandboxRequest) api.Sandbox {
	m.n++
	if req.Template == "" {
		req.Template = "host"
	}
	sb := api.Sandbox{
		ID: fmt.Sprintf("sb%018d", m.n), State: api.StateRunning, Template: req.Template, Runtime: "ns",
		CPU: 1, MemoryMiB: 512, DiskGiB: 1, PIDs: 1024, Env: req.Env, Labels: req.Labels,
		CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Ephemeral: req.Ephemeral, AutoDeleteSec: req.AutoDeleteSec,
	}
	if req.TimeoutSec > 0 {
		exp := sb.CreatedAt.Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	m.sbs[sb.ID] = sb
	if req.Snapshot != "" {
		if m.from == nil {
			m.from = make(map[string]string)
		}
		m.from[sb.ID] = req.Snapshot
	}
	return sb
}

func (m *memSandboxes) Get(ctx context.Context, id string) (api.Sandbox, error) {
	if id == "panicpanicpanicpanic" {
		panic("boom at /var/lib/atoll/secret")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// Metrics answers three samples of any sandbox there is, at unix seconds
// 1000, 1005 and 1010, filtered as the real service does.
func (m *memSandboxes) Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error) {
	if _, err := m.Get(ctx, id); err != nil {
		return nil, err
	}
	var out []api.Metric
	for _, sec := range []int64{1000, 1005, 1010} {
		if (start.IsZero() || sec >= start.Unix()) && (end.IsZero() || sec <= end.Unix()) {
			out = append(out, api.Metric{Time: time.Unix(sec, 0).UTC(), CPUCount: 1, CPUUsedPct: 12.5, MemoryTotalBytes: 512 << 20, DiskTotalBytes: 1 << 30})
		}
	}
	return out, nil
}

func (m *memSandboxes) List(ctx context.Context, state string, labels map[string]string) ([]api.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []api.Sandbox
next:
	for _, sb := range m.sbs {
		if state != "" && sb.State != state {
			continue
		}
		for k, v := range labels {
			if sb.Labels[k] != v {
				continue next
			}
		}
		out = append(out, sb)
	}
	return out, nil
}

func (m *memSandboxes) setState(id, from, to string) (api.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if sb.State != from {
		return api.Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	sb.State = to
	m.sbs[id] = sb
	return sb, nil
}

func (m *memSandboxes) Stop(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateRunning, api.StateStopped)
}

func (m *memSandboxes) Start(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateStopped, api.StateRunning)
}

func (m *memSandboxes) Delete(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sbs[id]; !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	delete(m.sbs, id)
	delete(m.from, id)
	return nil
}

func (m *memSandboxes) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateRunning, api.StatePaused)
}

func (m *memSandboxes) Suspend(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateRunning, api.StateSuspended)
}

func (m *memSandboxes) Shelve(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateRunning, api.StateShelved)
}

func (m *memSandboxes) Archive(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StateStopped, api.StateArchived)
}

func (m *memSandboxes) Resume(ctx context.Context, id string) (api.Sandbox, error) {
	return m.setState(id, api.StatePaused, api.StateRunning)
}

func (m *memSandboxes) SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error) {
	if req.TimeoutSec < 0 || req.TimeoutSec > MaxLifetimeSec {
		return api.Sandbox{}, fmt.Errorf("timeout %d reached the backend", req.TimeoutSec)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if sb.State != api.StateRunning && sb.State != api.StatePaused {
		return api.Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	sb.ExpiresAt = nil
	if req.TimeoutSec > 0 {
		exp := time.Now().UTC().Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	m.sbs[id] = sb
	return sb, nil
}

func (m *memSandboxes) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	if req.Count < 1 || req.Count > MaxForks {
		return nil, fmt.Errorf("fork count %d reached the backend", req.Count)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, ok := m.sbs[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if parent.State != api.StateRunning && parent.State != api.StatePaused && parent.State != api.StateStopped {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, parent.State, errdefs.ErrConflict)
	}
	var out []api.Sandbox
	for range req.Count {
		out = append(out, m.create(api.CreateSandboxRequest{Template: parent.Template, Env: parent.Env, Labels: req.Labels}))
	}
	return out, nil
}

func (m *memSandboxes) Restore(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if _, ok := m.snaps[req.Snapshot]; !ok {
		return api.Sandbox{}, fmt.Errorf("snapshot %s: %w", req.Snapshot, errdefs.ErrNotFound)
	}
	if sb.State == api.StatePaused {
		return api.Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	return sb, nil
}

func (m *memSandboxes) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Snapshot{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if sb.State == api.StateError {
		return api.Snapshot{}, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	m.n++
	snap := api.Snapshot{
		ID: fmt.Sprintf("sn%018d", m.n), Name: req.Name, SandboxID: id, Template: sb.Template,
		State: api.SnapshotReady, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if m.snaps == nil {
		m.snaps = make(map[string]api.Snapshot)
	}
	m.snaps[snap.ID] = snap
	return snap, nil
}

// snapshot is snap with its count of sandboxes; m.mu must be held.
func (m *memSandboxes) snapshot(snap api.Snapshot) api.Snapshot {
	for _, from := range m.from {
		if from == snap.ID {
			snap.Sandboxes++
		}
	}
	return snap
}

func (m *memSandboxes) ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sbs[sandboxID]; sandboxID != "" && !ok {
		return nil, fmt.Errorf("sandbox %s: %w", sandboxID, errdefs.ErrNotFound)
	}
	var out []api.Snapshot
	for _, snap := range m.snaps {
		if sandboxID == "" || snap.SandboxID == sandboxID {
			out = append(out, m.snapshot(snap))
		}
	}
	return out, nil
}

func (m *memSandboxes) GetSnapshot(ctx context.Context, snapID string) (api.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap, ok := m.snaps[snapID]
	if !ok {
		return api.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, errdefs.ErrNotFound)
	}
	return m.snapshot(snap), nil
}

func (m *memSandboxes) DeleteSnapshot(ctx context.Context, snapID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap, ok := m.snaps[snapID]
	if !ok {
		return fmt.Errorf("snapshot %s: %w", snapID, errdefs.ErrNotFound)
	}
	if n := m.snapshot(snap).Sandboxes; n > 0 {
		return fmt.Errorf("snapshot %s: %d sandboxes were created from it: %w", snapID, n, errdefs.ErrConflict)
	}
	delete(m.snaps, snapID)
	return nil
}

func (m *memSandboxes) ArchiveSnapshot(ctx context.Context, snapID string) (api.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap, ok := m.snaps[snapID]
	if !ok {
		return api.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, errdefs.ErrNotFound)
	}
	if snap.State != api.SnapshotReady {
		return api.Snapshot{}, fmt.Errorf("snapshot %s is %s: %w", snapID, snap.State, errdefs.ErrConflict)
	}
	snap.State = api.SnapshotArchived
	m.snaps[snapID] = snap
	return m.snapshot(snap), nil
}

// GetNetwork answers like a server with networking, unless the sandbox is
// labelled nonet=1.
// Placement answers as a single machine does.
func (m *memSandboxes) Placement(ctx context.Context, id string) (api.Placement, error) {
	if _, err := m.Get(ctx, id); err != nil {
		return api.Placement{}, err
	}
	return api.Placement{}, fmt.Errorf("%w: this server is a single machine", errdefs.ErrConflict)
}

func (m *memSandboxes) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return api.SandboxNetwork{}, err
	}
	if sb.Labels["nonet"] == "1" {
		return api.SandboxNetwork{}, fmt.Errorf("%w: no networking", errdefs.ErrUnavailable)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := api.SandboxNetwork{IPv4: "10.213.0.2", IPv6: "fd00:1::2", Policy: api.NetworkPolicy{Egress: "allow-all"}}
	if p, ok := m.policies[id]; ok {
		n.Policy = p
	}
	return n, nil
}

func (m *memSandboxes) SetNetwork(ctx context.Context, id string, req api.NetworkPolicy) (api.SandboxNetwork, error) {
	if _, err := m.GetNetwork(ctx, id); err != nil {
		return api.SandboxNetwork{}, err
	}
	m.mu.Lock()
	if m.policies == nil {
		m.policies = make(map[string]api.NetworkPolicy)
	}
	m.policies[id] = req
	m.mu.Unlock()
	return m.GetNetwork(ctx, id)
}

func (m *memSandboxes) SetPorts(ctx context.Context, id string, req api.PortAccess) (api.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sbs[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sb.Ports = req
	m.sbs[id] = sb
	return sb, nil
}

func (m *memSandboxes) AgentDialer(ctx context.Context, id string) (func(ctx context.Context) (net.Conn, error), error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != api.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	sock := m.agentSock
	if sb.Labels["agent"] == "dead" {
		sock = filepath.Join(filepath.Dir(sock), "nobody-listens.sock")
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, nil
}

type keyAuth string

func (k keyAuth) Authenticate(ctx context.Context, key string) (string, error) {
	if key != string(k) {
		return "", errdefs.ErrUnauthorized
	}
	return "default", nil
}

// testAgent imitates a few agent endpoints, enough to check forwarding.
type testAgent struct {
	release chan struct{} // lets POST /exec finish its stream
}

func (a *testAgent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.Health{Status: "ok", Version: "agent"})
	})
	mux.HandleFunc("POST /exec", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSONError(w, 400, "invalid", err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		code := 3
		enc.Encode(api.ExecEvent{Type: api.EventStart, PID: 42})
		enc.Encode(api.ExecEvent{Type: api.EventStdout, Data: []byte(req.Shell)})
		http.NewResponseController(w).Flush()
		select {
		case <-a.release:
		case <-time.After(10 * time.Second):
		}
		enc.Encode(api.ExecEvent{Type: api.EventExit, ExitCode: &code})
	})
	mux.HandleFunc("GET /files", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || r.Header.Get("X-API-Key") != "" {
			writeJSONError(w, 400, "invalid", "the API key reached the agent")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		fmt.Fprintf(w, "contents of %s", r.URL.Query().Get("path"))
	})
	mux.HandleFunc("POST /files/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req api.MkdirRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSONError(w, 400, "invalid", err.Error())
			return
		}
		writeJSON(w, 200, api.FileInfo{Name: filepath.Base(req.Path), Path: req.Path, Type: api.FileTypeDir, Mode: 0o755, ModTime: time.Unix(0, 0).UTC()})
	})
	mux.HandleFunc("GET /processes/{pid}/ws", func(w http.ResponseWriter, r *http.Request) {
		// The agent trusts its socket: a key must never reach it
		// (wsauth.go).
		if strings.Contains(strings.Join(r.Header.Values("Sec-WebSocket-Protocol"), ","), wsKeyProtocol) {
			http.Error(w, "the agent was handed an API key", http.StatusBadRequest)
			return
		}
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
			if typ == websocket.MessageBinary {
				c.Write(ctx, websocket.MessageBinary, bytes.ToUpper(b))
				continue
			}
			code := 0
			ev, _ := json.Marshal(api.ExecEvent{Type: api.EventExit, ExitCode: &code})
			c.Write(ctx, websocket.MessageText, ev)
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	})
	return mux
}

type fixture struct {
	t     *testing.T
	s     *Server
	url   string
	sbs   *memSandboxes
	tpls  *memTemplates
	agent *testAgent
}

// wantDeleted DELETEs path, which must answer 204 with nothing, and then
// be gone: a GET of it not found.
func wantDeleted(t *testing.T, f *fixture, path string) {
	t.Helper()
	resp, body := f.do("DELETE", path, nil)
	if resp.StatusCode != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("delete: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", path, nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir, err := os.MkdirTemp("", "atoll-server-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	agent := &testAgent{release: make(chan struct{})}
	as := &http.Server{Handler: agent.handler()}
	go as.Serve(ln)
	t.Cleanup(func() { as.Close() })

	sbs := &memSandboxes{agentSock: sock, sbs: make(map[string]api.Sandbox)}
	tpls := newMemTemplates()
	ports, err := portproxy.New(portproxy.Config{Sandboxes: noTargets{}, Key: make([]byte, 32), URLPort: 7401})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{
		Sandboxes: sbs,
		Templates: tpls,
		Ports:     ports,
		Auth:      keyAuth(testKey),
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Version:   "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = NewHTTPServer("", s.Handler())
	ts.Start()
	t.Cleanup(ts.Close)
	return &fixture{t: t, s: s, url: ts.URL, sbs: sbs, tpls: tpls, agent: agent}
}

// with returns f reporting to t, for subtests.
func (f *fixture) with(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

// do sends a request with the test key (unless headers say otherwise), checks
// the answer against api/openapi.yaml and returns it with its body.
func (f *fixture) do(method, path string, body any, headers ...string) (*http.Response, []byte) {
	f.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", testKey)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	checkAgainstSpec(f.t, f.s, req, resp, b)
	return resp, b
}

// wantError checks that resp is status with a JSON api.Error of code.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) api.Error {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("%s %s: status %d, want %d; body %s", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", resp.Request.Method, resp.Request.URL.Path, ct)
	}
	var e api.Error
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Errorf("%s %s: body %q is not an api.Error: %v", resp.Request.Method, resp.Request.URL.Path, body, err)
	}
	if e.Code != code {
		t.Errorf("%s %s: code %q, want %q (message %q)", resp.Request.Method, resp.Request.URL.Path, e.Code, code, e.Message)
	}
	if e.Message == "" {
		t.Errorf("%s %s: empty error message", resp.Request.Method, resp.Request.URL.Path)
	}
	return e
}

func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	return v
}

func TestNewRequiresConfig(t *testing.T) {
	if _, err := New(Config{Auth: keyAuth("k")}); err == nil {
		t.Error("New without Sandboxes: no error")
	}
	if _, err := New(Config{Sandboxes: &memSandboxes{}}); err == nil {
		t.Error("New without Auth: no error")
	}
}

func TestHealth(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("GET", "/v1/health", nil, "X-API-Key", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got, want := decode[api.Health](t, body), (api.Health{Status: "ok", Version: "test"}); got != want {
		t.Errorf("health = %+v, want %+v", got, want)
	}
	// A cluster node that lost its store is up but not ready.
	f.s.cfg.Ready = func() error { return fmt.Errorf("%w: store unreachable", errdefs.ErrUnavailable) }
	resp, body = f.do("GET", "/v1/health", nil, "X-API-Key", "")
	if e := decode[api.Error](t, body); resp.StatusCode != 503 || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "store unreachable") {
		t.Errorf("health of a node without its store: %d %s", resp.StatusCode, body)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: "host", Labels: map[string]string{"team": "a"}})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: status %d: %s", resp.StatusCode, body)
	}
	sb := decode[api.Sandbox](t, body)
	if !idPattern.MatchString(sb.ID) || resp.Header.Get("Location") != "/v1/sandboxes/"+sb.ID {
		t.Fatalf("create: id %q, Location %q", sb.ID, resp.Header.Get("Location"))
	}
	// An empty body takes every default.
	if resp, body := f.do("POST", "/v1/sandboxes", nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create with empty body: status %d: %s", resp.StatusCode, body)
	}

	resp, body = f.do("GET", "/v1/sandboxes/"+sb.ID, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("get: %d %s", resp.StatusCode, body)
	}
	if diff := cmp.Diff(sb, decode[api.Sandbox](t, body)); diff != "" {
		t.Errorf("get (-created +got):\n%s", diff)
	}

	for _, tc := range []struct {
		query string
		want  int
	}{
		{"", 2},
		{"?state=running", 2},
		{"?state=stopped", 0},
		{"?state=archived", 0},
		{"?label=team=a", 1},
		{"?label=team=a&label=x=y", 0},
		{"?state=running&label=team=a", 1},
	} {
		wantListed(t, f, "/v1/sandboxes"+tc.query, "sandboxes", tc.want, func(l api.SandboxList) int { return len(l.Sandboxes) })
	}

	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/stop", nil)
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).State != api.StateStopped {
		t.Fatalf("stop: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/stop", nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")
	resp, body = f.do("GET", "/v1/sandboxes/"+sb.ID+"/health", nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")
	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/start", nil)
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).State != api.StateRunning {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	wantDeleted(t, f, "/v1/sandboxes/"+sb.ID)
}

func TestLifecyclePolicies(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{TimeoutSec: 3600, Ephemeral: true, AutoDeleteSec: 31536000})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: status %d: %s", resp.StatusCode, body)
	}
	sb := decode[api.Sandbox](t, body)
	if want := sb.CreatedAt.Add(time.Hour); sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(want) {
		t.Errorf("create: expires_at %v, want %v", sb.ExpiresAt, want)
	}
	if !sb.Ephemeral || sb.AutoDeleteSec != 31536000 {
		t.Errorf("create: ephemeral %v, auto_delete_sec %d; want true, 31536000", sb.Ephemeral, sb.AutoDeleteSec)
	}

	before := time.Now()
	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", api.TimeoutRequest{TimeoutSec: 60})
	if resp.StatusCode != 200 {
		t.Fatalf("timeout 60: status %d: %s", resp.StatusCode, body)
	}
	got := decode[api.Sandbox](t, body)
	if got.ExpiresAt == nil || got.ExpiresAt.Before(before.Add(time.Minute-time.Second)) || got.ExpiresAt.After(time.Now().Add(time.Minute)) {
		t.Errorf("timeout 60: expires_at %v, want about a minute from %v", got.ExpiresAt, before)
	}

	// Paused sandboxes take a timeout too; 0 removes it.
	if resp, body := f.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", nil); resp.StatusCode != 200 {
		t.Fatalf("pause: status %d: %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", `{"timeout_sec":0}`)
	if resp.StatusCode != 200 {
		t.Fatalf("timeout 0: status %d: %s", resp.StatusCode, body)
	}
	if got := decode[api.Sandbox](t, body); got.ExpiresAt != nil || bytes.Contains(body, []byte("expires_at")) {
		t.Errorf("timeout 0: body %s: want no expires_at", body)
	}

	// A stopped sandbox has nothing to time out.
	f.do("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	if resp, body := f.do("POST", "/v1/sandboxes/"+sb.ID+"/stop", nil); resp.StatusCode != 200 {
		t.Fatalf("stop: status %d: %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", api.TimeoutRequest{TimeoutSec: 60})
	wantError(t, resp, body, http.StatusConflict, "conflict")
}

func TestBadInput(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{})
	id := decode[api.Sandbox](t, body).ID
	big := `{"template":"` + strings.Repeat("a", 2<<20) + `"}`

	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		headers      []string
		status       int
		code         string
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"template":"host","cpus":2}`, nil, 400, "invalid"},
		{"malformed JSON", "POST", "/v1/sandboxes", `{"template":`, nil, 400, "invalid"},
		{"not an object", "POST", "/v1/sandboxes", `[1,2]`, nil, 400, "invalid"},
		{"wrong type", "POST", "/v1/sandboxes", `{"cpu":"two"}`, nil, 400, "invalid"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, nil, 400, "invalid"},
		{"negative memory", "POST", "/v1/sandboxes", `{"memory_mib":-1}`, nil, 400, "invalid"},
		{"bad env", "POST", "/v1/sandboxes", `{"env":{"A=B":"c"}}`, nil, 400, "invalid"},
		{"2 MiB body", "POST", "/v1/sandboxes", big, nil, 413, "too_large"},
		{"2 MiB chunked body", "POST", "/v1/sandboxes", io.MultiReader(strings.NewReader(big)), nil, 413, "too_large"},
		{"2 MiB forwarded JSON", "POST", "/v1/sandboxes/" + id + "/files/mkdir", big, nil, 413, "too_large"},
		{"2 MiB chunked forwarded JSON", "POST", "/v1/sandboxes/" + id + "/files/mkdir", io.MultiReader(strings.NewReader(big)), nil, 413, "too_large"},
		{"bad state filter", "GET", "/v1/sandboxes?state=sleeping", nil, nil, 400, "invalid"},
		{"bad label filter", "GET", "/v1/sandboxes?label=novalue", nil, nil, 400, "invalid"},
		{"upper-case ID", "GET", "/v1/sandboxes/ABCDEFGHIJ0123456789", nil, nil, 400, "invalid"},
		{"short ID", "GET", "/v1/sandboxes/abc", nil, nil, 400, "invalid"},
		{"long ID", "DELETE", "/v1/sandboxes/abcdefghij0123456789x", nil, nil, 400, "invalid"},
		{"ID with dots", "POST", "/v1/sandboxes/..........%2e%2e......../stop", nil, nil, 400, "invalid"},
		{"malformed ID on agent route", "GET", "/v1/sandboxes/x/files?path=/etc/passwd", nil, nil, 400, "invalid"},
		{"malformed pid", "GET", "/v1/sandboxes/" + id + "/processes/-1", nil, nil, 400, "invalid"},
		{"unknown ID", "GET", "/v1/sandboxes/abcdefghij0123456789", nil, nil, 404, "not_found"},
		{"unknown ID stop", "POST", "/v1/sandboxes/abcdefghij0123456789/stop", nil, nil, 404, "not_found"},
		{"unknown ID agent route", "POST", "/v1/sandboxes/abcdefghij0123456789/exec", `{"cmd":["true"]}`, nil, 404, "not_found"},
		{"no key", "GET", "/v1/sandboxes", nil, []string{"X-API-Key", ""}, 401, "unauthorized"},
		{"wrong key", "GET", "/v1/sandboxes", nil, []string{"X-API-Key", "nope"}, 401, "unauthorized"},
		{"wrong bearer", "GET", "/v1/sandboxes/" + id, nil, []string{"X-API-Key", "", "Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"basic auth", "GET", "/v1/sandboxes/" + id, nil, []string{"X-API-Key", "", "Authorization", "Basic Zm9vOmJhcg=="}, 401, "unauthorized"},
		{"no key on agent route", "GET", "/v1/sandboxes/" + id + "/files?path=/etc/passwd", nil, []string{"X-API-Key", ""}, 401, "unauthorized"},
		{"oversize headers", "GET", "/v1/sandboxes", nil, []string{"X-Big", strings.Repeat("x", 100<<10)}, 431, "too_large"},
		{"unknown route", "GET", "/v1/nothing", nil, nil, 404, "not_found"},
		{"wrong method", "PATCH", "/v1/sandboxes/" + id, nil, nil, 405, "invalid"},
		{"quota", "POST", "/v1/sandboxes", `{"template":"big"}`, nil, 429, "quota_exceeded"},
		{"negative timeout", "POST", "/v1/sandboxes", `{"timeout_sec":-1}`, nil, 400, "invalid"},
		{"timeout over a year", "POST", "/v1/sandboxes", `{"timeout_sec":31536001}`, nil, 400, "invalid"},
		{"negative auto-delete", "POST", "/v1/sandboxes", `{"auto_delete_sec":-1}`, nil, 400, "invalid"},
		{"auto-delete over a year", "POST", "/v1/sandboxes", `{"auto_delete_sec":31536001}`, nil, 400, "invalid"},
		{"huge timeout", "POST", "/v1/sandboxes", `{"timeout_sec":9223372036854775807}`, nil, 400, "invalid"},
		{"ephemeral not a bool", "POST", "/v1/sandboxes", `{"ephemeral":"yes"}`, nil, 400, "invalid"},
		{"set timeout negative", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout_sec":-5}`, nil, 400, "invalid"},
		{"set timeout over a year", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout_sec":31536001}`, nil, 400, "invalid"},
		{"set timeout overflow", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout_sec":1e30}`, nil, 400, "invalid"},
		{"set timeout unknown field", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout_sec":60,"ephemeral":true}`, nil, 400, "invalid"},
		{"set timeout empty body", "POST", "/v1/sandboxes/" + id + "/timeout", nil, nil, 400, "invalid"},
		{"set timeout malformed ID", "POST", "/v1/sandboxes/x/timeout", `{"timeout_sec":60}`, nil, 400, "invalid"},
		{"set timeout unknown ID", "POST", "/v1/sandboxes/abcdefghij0123456789/timeout", `{"timeout_sec":60}`, nil, 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do(tc.method, tc.path, tc.body, tc.headers...)
			wantError(t, resp, body, tc.status, tc.code)
		})
	}
}

func TestBearerAuth(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("GET", "/v1/sandboxes", nil, "X-API-Key", "", "Authorization", "Bearer "+testKey)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestErrorsHideInternals(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"error of no kind", "POST", "/v1/sandboxes", `{"template":"explode"}`, 500, "internal"},
		{"kind wrapping a path error", "POST", "/v1/sandboxes", `{"template":"missing"}`, 404, "not_found"},
		{"panic", "GET", "/v1/sandboxes/panicpanicpanicpanic", nil, 500, "internal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do(tc.method, tc.path, tc.body)
			e := wantError(t, resp, body, tc.status, tc.code)
			if strings.Contains(e.Message, "/var/lib") || strings.Contains(e.Message, "goroutine") {
				t.Errorf("message %q shows server internals", e.Message)
			}
		})
	}
}

func TestForwardAgent(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID

	resp, body := f.do("GET", "/v1/sandboxes/"+id+"/health", nil)
	if resp.StatusCode != 200 || decode[api.Health](t, body).Version != "agent" {
		t.Fatalf("health: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/sandboxes/"+id+"/files?path=/etc/hostname", nil)
	if resp.StatusCode != 200 || string(body) != "contents of /etc/hostname" {
		t.Fatalf("read file: %d %q", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/sandboxes/"+id+"/files?path=/x", nil, "X-API-Key", "", "Authorization", "Bearer "+testKey)
	if resp.StatusCode != 200 {
		t.Fatalf("read file with bearer key: %d %q", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/files/mkdir", api.MkdirRequest{Path: "/work/a"})
	if resp.StatusCode != 200 || decode[api.FileInfo](t, body).Path != "/work/a" {
		t.Fatalf("mkdir: %d %s", resp.StatusCode, body)
	}
}

func TestForwardAgentUnreachable(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Labels: map[string]string{"agent": "dead"}})
	id := decode[api.Sandbox](t, body).ID
	resp, body := f.do("GET", "/v1/sandboxes/"+id+"/processes", nil)
	e := wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
	if strings.Contains(e.Message, "sock") {
		t.Errorf("message %q shows the socket", e.Message)
	}
}

// TestForwardStreamFlushes reads the first events of an exec stream while the
// agent is still holding the stream open: they must not wait in a buffer.
func TestForwardStreamFlushes(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, _ := json.Marshal(api.ExecRequest{Shell: "echo hi"})
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/sandboxes/"+id+"/exec", bytes.NewReader(j))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var got []api.ExecEvent
	for len(got) < 2 && sc.Scan() {
		got = append(got, decode[api.ExecEvent](t, sc.Bytes()))
	}
	want := []api.ExecEvent{{Type: "start", PID: 42}, {Type: "stdout", Data: []byte("echo hi")}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events before the agent finished (-want +got):\n%s", diff)
	}
	close(f.agent.release)
	if !sc.Scan() {
		t.Fatalf("no exit event: %v", sc.Err())
	}
	if ev := decode[api.ExecEvent](t, sc.Bytes()); ev.Type != "exit" || ev.ExitCode == nil || *ev.ExitCode != 3 {
		t.Errorf("last event %+v, want exit 3", ev)
	}
}

func TestForwardWebsocket(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Without a key the upgrade is refused with JSON.
	_, resp, err := websocket.Dial(ctx, f.url+"/v1/sandboxes/"+id+"/processes/7/ws", nil)
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("dial without key: err %v, resp %v", err, resp)
	}
	c, _, err := websocket.Dial(ctx, f.url+"/v1/sandboxes/"+id+"/processes/7/ws", &websocket.DialOptions{
		HTTPHeader: http.Header{"X-API-Key": {testKey}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("ls\n")); err != nil {
		t.Fatal(err)
	}
	typ, b, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || string(b) != "LS\n" {
		t.Fatalf("read: %v %v %q", typ, err, b)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":40,"cols":100}`)); err != nil {
		t.Fatal(err)
	}
	typ, b, err = c.Read(ctx)
	if err != nil || typ != websocket.MessageText {
		t.Fatalf("read exit: %v %v %q", typ, err, b)
	}
	if ev := decode[api.ExecEvent](t, b); ev.Type != "exit" || ev.ExitCode == nil || *ev.ExitCode != 0 {
		t.Errorf("exit event %+v", ev)
	}
}

func TestStatusTable(t *testing.T) {
	// Every kind has a code, and the server answers it with the status and
	// code of api.ErrorCodes' row.
	s := &Server{log: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("GET", "/", nil)
	for _, row := range api.ErrorCodes {
		kind := errdefs.FromCode(row.Code)
		if kind == nil {
			if row.Code != api.CodeInternal {
				t.Errorf("code %s has no kind", row.Code)
			}
			continue
		}
		if code := errdefs.Code(kind); code == "internal" {
			t.Errorf("kind %v has no code", kind)
		}
		status, body := s.errorBody(r, fmt.Errorf("%w: something", kind))
		if status != row.Status || body.Code != row.Code {
			t.Errorf("kind %v: answered %d %s, want %d %s", kind, status, body.Code, row.Status, row.Code)
		}
	}
	// Every kind errdefs knows has a status.
	for _, code := range []string{"invalid", "not_found", "conflict", "unavailable", "unauthorized", "forbidden", "quota_exceeded", "too_large"} {
		kind := errdefs.FromCode(code)
		if kind == nil || api.StatusOf(code) == http.StatusInternalServerError {
			t.Errorf("code %s has no status", code)
		}
	}
	if status, body := s.errorBody(r, errors.New("a bug")); status != http.StatusInternalServerError || body.Code != "internal" {
		t.Errorf("an error of no kind: %d %s", status, body.Code)
	}
}

// TestPlacementRoutes: ?explain takes 1/0 only, and a server answers the
// placement of its sandboxes as its Sandboxes says (here a single
// machine's: 409), another's or none as not found.
func TestPlacementRoutes(t *testing.T) {
	f := newFixture(t)
	if resp, body := f.do("POST", "/v1/sandboxes?explain=maybe", nil); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "explain") {
		t.Errorf("create ?explain=maybe: %d %s, want 400 naming explain", resp.StatusCode, body)
	}
	resp, body := f.do("POST", "/v1/sandboxes?explain=1", nil)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create ?explain=1: %d %s", resp.StatusCode, body)
	}
	sb := decode[api.Sandbox](t, body)
	resp, body = f.do("GET", "/v1/sandboxes/"+sb.ID+"/placement", nil)
	if e := decode[api.Error](t, body); resp.StatusCode != http.StatusConflict || e.Code != api.CodeConflict {
		t.Errorf("placement on a single machine: %d %s, want 409 conflict", resp.StatusCode, body)
	}
	if resp, body := f.do("GET", "/v1/sandboxes/zzzzzzzzzzzzzzzzzzzz/placement", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("placement of no sandbox: %d %s, want 404", resp.StatusCode, body)
	}
}
