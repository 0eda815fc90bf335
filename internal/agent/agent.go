// Package agent is atoll-agent, the PID 1 of every sandbox: it starts and
// supervises processes, reaps orphans, and serves files, all over the HTTP
// protocol of docs/agent-protocol.md on a listener the node hands it. The same
// package holds Client, the node's side of that protocol.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// Limits.
const (
	maxJSONBody     = 1 << 20  // bytes of a JSON request body
	chunkSize       = 32 << 10 // bytes of output per stdout/stderr event
	keepExited      = 256      // exited background processes still listed
	defaultTarBytes = 16 << 30 // file content bytes of one uploaded tar
	defaultTarFiles = 1 << 20  // entries of one uploaded tar
	shutdownGrace   = 5 * time.Second
)

// Config configures an Agent. The zero value of every field but Listener is a
// documented default.
type Config struct {
	// Listener is where Run serves the protocol.
	Listener net.Listener
	// DefaultEnv is added to every process's environment; requests override it.
	DefaultEnv map[string]string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Reap makes the agent reap every child of the process, not just its own,
	// with one wait4(-1) loop: set it when the agent is PID 1 or a child
	// subreaper. Without it each started process is waited for by pid.
	Reap bool
	// EtcDir holds the passwd and group files users are looked up in;
	// default "/etc".
	EtcDir string
	// DefaultUser and DefaultCwd apply to requests that name none: a
	// template's image USER and WORKDIR. Empty means root and the user's home.
	DefaultUser string
	DefaultCwd  string
	// StartOn, if not nil, runs the function it is given where processes
	// must start: on the one thread of a namespace sandbox's init whose
	// capability bounding set was dropped (confine.Starter); a process
	// inherits the bounding set of the thread that forked it.
	StartOn func(func())
}

// Agent serves the agent protocol. Create it with New.
//
// Lock order: procMu, then a process's mu (Close and supervise kill
// processes under procMu). reapMu and envMu are taken on their own, never
// with another lock held or taken under them.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	etcDir string

	maxTarBytes int64
	maxTarFiles int

	wg        sync.WaitGroup // process monitors, output readers, waiters
	closing   chan struct{}  // closed by Close; unblocks stalled streams
	closeOnce sync.Once

	reaperStop chan struct{}
	reaperDone chan struct{}

	// reapMu is held across starting a process and registering it in waiters
	// so the reaper cannot collect a status before the pid is known.
	reapMu  sync.Mutex
	waiters map[int]*process

	// envMu guards defaultEnv, which starts as cfg.DefaultEnv and which the
	// node may replace (PUT /env) when it hands a pre-started sandbox out.
	envMu      sync.Mutex
	defaultEnv map[string]string

	// logs keeps what background processes print (logs.go).
	logs *logRing

	procMu sync.Mutex
	procs  map[int]*process // running processes and the last exited background ones
	exited []*process       // exited background processes, oldest first
	closed bool
}

// New returns an Agent for cfg. With cfg.Reap it starts reaping at once.
func New(cfg Config) (*Agent, error) {
	for k, v := range cfg.DefaultEnv {
		if err := checkEnv(k, v); err != nil {
			return nil, fmt.Errorf("default env: %w", err)
		}
	}
	a := &Agent{
		cfg:         cfg,
		log:         cfg.Logger,
		etcDir:      cfg.EtcDir,
		maxTarBytes: defaultTarBytes,
		maxTarFiles: defaultTarFiles,
		closing:     make(chan struct{}),
		waiters:     make(map[int]*process),
		procs:       make(map[int]*process),
		defaultEnv:  maps.Clone(cfg.DefaultEnv),
		logs:        newLogRing(logBytes),
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.etcDir == "" {
		a.etcDir = "/etc"
	}
	if cfg.Reap {
		a.reaperStop = make(chan struct{})
		a.reaperDone = make(chan struct{})
		go a.reaper()
	}
	return a, nil
}

// Run serves the protocol on cfg.Listener until ctx is done, then shuts the
// server down. Requests in flight see their context cancelled.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.Listener == nil {
		return errors.New("agent: no listener")
	}
	return a.Serve(ctx, a.cfg.Listener)
}

// Serve serves the protocol on ln until ctx is done, then shuts the server
// down and closes ln; the agent's processes keep running.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// Close kills every process the agent started, waits for them, and stops
// reaping. Call it after Run has returned.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.procMu.Lock()
		a.closed = true
		for _, p := range a.procs {
			p.kill()
		}
		a.procMu.Unlock()
		close(a.closing)
		a.wg.Wait()
		if a.reaperStop != nil {
			close(a.reaperStop)
			<-a.reaperDone
		}
	})
	return nil
}

// Handler returns the protocol's HTTP handler.
func (a *Agent) Handler() http.Handler {
	mux := &router{}
	mux.handleFunc("GET /health", a.handleHealth)

	mux.handleFunc("PUT /env", a.handleSetEnv)
	mux.handleFunc("POST /exec", a.handleExec)
	mux.handleFunc("GET /logs", a.handleLogs)
	mux.handleFunc("GET /processes", a.handleListProcesses)
	mux.handleFunc("GET /processes/{pid}", a.handleGetProcess)
	mux.handleFunc("GET /processes/{pid}/attach", a.handleAttach)
	mux.handleFunc("POST /processes/{pid}/stdin", a.handleStdin)
	mux.handleFunc("POST /processes/{pid}/stdin/close", a.handleStdinClose)
	mux.handleFunc("POST /processes/{pid}/signal", a.handleSignal)
	mux.handleFunc("POST /processes/{pid}/resize", a.handleResize)
	mux.handleFunc("GET /processes/{pid}/ws", a.handleWebsocket)

	mux.handleFunc("GET /files", a.handleReadFile)
	mux.handleFunc("PUT /files", a.handleWriteFile)
	mux.handleFunc("DELETE /files", a.handleRemove)
	mux.handleFunc("GET /files/stat", a.handleStat)
	mux.handleFunc("GET /files/list", a.handleList)
	mux.handleFunc("POST /files/mkdir", a.handleMkdir)
	mux.handleFunc("POST /files/rename", a.handleRename)
	mux.handleFunc("POST /files/chmod", a.handleChmod)
	mux.handleFunc("GET /files/tar", a.handleTarGet)
	mux.handleFunc("PUT /files/tar", a.handleTarPut)
	mux.handleFunc("GET /files/watch", a.handleWatch)

	code := codeProxy()
	for _, p := range []string{"POST /code/execute", "GET /code/contexts", "POST /code/contexts",
		"DELETE /code/contexts/{ctx}", "POST /code/contexts/{ctx}/restart"} {
		mux.handle(p, code)
	}

	// The API's request ID comes along with a forwarded request: the
	// agent's errors name it too.
	return httpkit.RequestID(surface.Recover(a.log, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := mux.match(r)
		if h == nil {
			writeError(w, errorf(errdefs.ErrNotFound, "no endpoint %s %s", r.Method, r.URL.Path))
			return
		}
		h.ServeHTTP(w, r)
		drainBody(r)
	})))
}

// drainBody reads what the client sent of r's body that the handler did
// not, before the answer goes out. Go's server reads at most 256 KiB of
// an unread body and then closes the connection; a client that sends its
// whole body before it reads the answer (Python's http.client, curl with
// a file) is then reset mid-send and never sees the answer, a refusal such
// as 400 for a bad path included. A connection the handler hijacked (the
// terminal's websocket) has no body to drain.
func drainBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Upgrade") != "" {
		return
	}
	io.Copy(io.Discard, r.Body)
}

// handleSetEnv replaces the default environment of processes started from now on.
func (a *Agent) handleSetEnv(w http.ResponseWriter, r *http.Request) {
	var env map[string]string
	if err := decodeJSON(w, r, &env); err != nil {
		writeError(w, err)
		return
	}
	for k, v := range env {
		if err := checkEnv(k, v); err != nil {
			writeError(w, err)
			return
		}
	}
	a.envMu.Lock()
	a.defaultEnv = env
	a.envMu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Health is the agent's answer to GET /health.
type Health struct {
	Status string `json:"status"` // "ok"
	// Procs is the Ps its Go runtime runs on (GOMAXPROCS), which the
	// node chooses for the sandbox's cores.
	Procs int `json:"procs"`
}

func (a *Agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, Health{Status: "ok", Procs: goruntime.GOMAXPROCS(0)})
}

// kindError is an error of one errdefs kind whose message is shown to clients
// as is.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// surface is how the agent answers: atoll's shape and statuses, except that
// its one quota, a full disk (ENOSPC, EDQUOT), is 507 Insufficient Storage:
// the disk is the sandbox's own, not a tenant's limit (docs/agent-protocol.md).
var surface = httpkit.Surface{
	Body:     httpkit.Atoll.Body,
	Statuses: map[string]int{api.CodeQuota: http.StatusInsufficientStorage},
}

func writeError(w http.ResponseWriter, err error) {
	status := surface.Status(err)
	msg := errdefs.Message(err)
	if status == http.StatusInternalServerError {
		msg = "internal error: " + err.Error()
	}
	writeJSON(w, status, api.Error{Code: errdefs.Code(err), Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) { surface.JSON(w, status, v) }

// respondEmpty answers 204, or err if there is one.
func respondEmpty(w http.ResponseWriter, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// respond writes v as JSON with 200, or err if there is one.
func respond(w http.ResponseWriter, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// decodeJSON decodes exactly one JSON value of at most maxJSONBody bytes,
// rejecting unknown fields.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return httpkit.DecodeJSON(w, r, v, httpkit.Body{Limit: maxJSONBody})
}

// ndjson writes a stream of JSON lines, flushing each.
type ndjson struct {
	rc  *http.ResponseController
	enc *json.Encoder
}

// startNDJSON sends the stream's headers at once, so the client knows the
// stream (and any subscription behind it) is established.
func startNDJSON(w http.ResponseWriter) (*ndjson, error) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	s := &ndjson{rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	return s, s.rc.Flush()
}

func (s *ndjson) send(v any) error {
	if err := s.enc.Encode(v); err != nil {
		return err
	}
	return s.rc.Flush()
}
