// Package server is atoll's HTTP API: the /v1 REST routes over sandboxes and
// templates, the forwarding of in-sandbox agent routes, authentication, and the
// one table that turns error kinds into status codes. It holds no state of its
// own; sandboxes live behind the Sandboxes interface, templates behind Templates.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/telemetry"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Sandboxes is what the API serves. Errors carry errdefs kinds; their messages
// are shown to clients, so they must not contain host paths or secrets.
type Sandboxes interface {
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	List(ctx context.Context, state string, labels map[string]string) ([]api.Sandbox, error)
	Stop(ctx context.Context, id string) (api.Sandbox, error)
	Start(ctx context.Context, id string) (api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	// Pause freezes a running sandbox's processes; errdefs.ErrConflict in any other state.
	Pause(ctx context.Context, id string) (api.Sandbox, error)
	// Suspend pauses a running sandbox to disk (its runtime saves its
	// memory and stops it); errdefs.ErrInvalid for a runtime that cannot.
	Suspend(ctx context.Context, id string) (api.Sandbox, error)
	Shelve(ctx context.Context, id string) (api.Sandbox, error)
	// Archive moves a stopped sandbox's files to object storage.
	Archive(ctx context.Context, id string) (api.Sandbox, error)
	// Resume thaws a paused sandbox or restores a suspended one;
	// errdefs.ErrConflict in any other state.
	Resume(ctx context.Context, id string) (api.Sandbox, error)
	// SetTimeout makes a running or paused sandbox stop req.TimeoutSec (0 to
	// MaxLifetimeSec, already checked) from now; 0 removes the timeout.
	// errdefs.ErrConflict in any other state.
	SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error)
	// Fork creates req.Count (1-100, already checked) sandboxes from the files of id.
	Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error)
	// Restore puts the files of snapshot req.Snapshot back into sandbox id.
	Restore(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error)
	CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	// ListSnapshots lists the snapshots of sandboxID, or all when it is "".
	ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error)
	GetSnapshot(ctx context.Context, snapID string) (api.Snapshot, error)
	// DeleteSnapshot deletes a snapshot; sandboxes created from it keep their
	// own copy-on-write copies of its files.
	DeleteSnapshot(ctx context.Context, snapID string) error
	// ArchiveSnapshot moves a snapshot's files to object storage;
	// errdefs.ErrConflict unless it is ready.
	ArchiveSnapshot(ctx context.Context, snapID string) (api.Snapshot, error)
	// GetNetwork returns a sandbox's network; errdefs.ErrUnavailable if the
	// server runs sandboxes without networking.
	GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error)
	// Placement returns how the cluster chose sandbox id's node;
	// errdefs.ErrConflict on a single machine, ErrNotFound for a sandbox
	// the scheduler did not place.
	Placement(ctx context.Context, id string) (api.Placement, error)
	// SetNetwork replaces a sandbox's egress policy (already checked); a
	// running sandbox's connections that the new policy forbids are cut.
	SetNetwork(ctx context.Context, id string, req api.NetworkPolicy) (api.SandboxNetwork, error)
	// SetPorts changes who may open the sandbox's ports through the port
	// proxy.
	SetPorts(ctx context.Context, id string, req api.PortAccess) (api.Sandbox, error)
	// Metrics returns the samples of a sandbox's use of CPU, memory and
	// disk taken from start to end (inclusive, to the second; zero for an
	// open end), oldest first.
	Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error)
	// AgentDialer returns how to reach the sandbox's agent; errdefs.ErrConflict if it is not running.
	AgentDialer(ctx context.Context, id string) (func(ctx context.Context) (net.Conn, error), error)
}

// Ports gives the URLs of sandboxes' ports on the port proxy.
type Ports interface {
	// URL is where port of sandbox id is served, with a signed URL valid
	// for ttl if ttl > 0.
	URL(id string, port int, public bool, ttl time.Duration) api.PortURL
}

// Runtimes lists the sandbox runtimes a server knows.
type Runtimes interface {
	Runtimes() []api.Runtime
}

// Nodes are a cluster's nodes (the cluster layer of `atoll serve --cluster`).
type Nodes interface {
	List(ctx context.Context) ([]api.Node, error)
	// SetSchedule cordons (api.NodeCordoned), drains (api.NodeDraining)
	// or uncordons ("") node name; errdefs.ErrNotFound for no such node.
	SetSchedule(ctx context.Context, name, schedule string) error
}

// Keys issues and revokes API keys (auth.Keys).
type Keys interface {
	Create(ctx context.Context, req api.CreateKeyRequest) (api.APIKey, error)
	List(ctx context.Context) ([]api.APIKey, error)
	// Delete revokes a key at once; errdefs.ErrConflict for the last admin key.
	Delete(ctx context.Context, id string) error
}

// Tenants are the tenants' quotas and use (the control plane's).
type Tenants interface {
	List(ctx context.Context) ([]api.Tenant, error)
	// Get returns one tenant; one nothing names has no quota and no use.
	Get(ctx context.Context, name string) (api.Tenant, error)
	// SetQuota replaces a tenant's quota; errdefs.ErrInvalid for a bad
	// name or a negative limit.
	SetQuota(ctx context.Context, name string, q api.TenantQuota) (api.Tenant, error)
}

// Authenticator checks an API key and returns the tenant it belongs to
// (package tenant); an error wrapping errdefs.ErrUnauthorized when the key
// is not accepted.
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (tenant string, err error)
}

// Config configures a Server. Sandboxes and Auth are required.
type Config struct {
	Sandboxes Sandboxes
	Templates Templates // nil: the template routes answer 503 unavailable
	Ports     Ports     // nil: GET .../ports/{port} answers 503 unavailable
	Runtimes  Runtimes  // nil: GET /v1/runtimes answers 503 unavailable
	Auth      Authenticator
	Keys      Keys    // nil: the key routes answer 503 unavailable
	Nodes     Nodes   // nil (one machine, not a cluster): the node routes answer 409 conflict
	Tenants   Tenants // nil: the tenant routes answer 503 unavailable
	Vaults    Vaults  // nil: the vault routes answer 503 unavailable
	Usage     Usage   // nil: GET /v1/usage answers 503 unavailable
	// VaultMounts clone vaults into sandboxes and check their tokens;
	// nil: a create with vaults is 503 and the git endpoint takes API
	// keys only.
	VaultMounts VaultMounts
	// MCP serves the Model Context Protocol at /v1/mcp (internal/mcp's
	// streamable HTTP handler) to authenticated requests; nil: 503
	// unavailable.
	MCP http.Handler
	// Audit, Events and Webhooks are the journal (packages audit, events,
	// webhooks); nil: their routes answer 503 unavailable.
	Audit    Audit
	Events   Events
	Webhooks Webhooks
	Logger   *slog.Logger // default slog.Default()
	Version  string       // reported by GET /v1/health
	// Ready, if set, is asked by GET /v1/health: an error makes it answer
	// 503 with the error's message (a cluster node that has lost its
	// store).
	Ready func() error
	// Metrics serves the Prometheus metrics at GET /v1/metrics to admin
	// keys (telemetry.Handler); nil: that route answers 503 unavailable.
	Metrics http.Handler
}

// Server serves the /v1 API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler
}

// Limits of the API.
const (
	// MaxJSONBody is the largest JSON request body the server decodes itself.
	MaxJSONBody = 1 << 20
	// MaxHeaderBytes is the largest request header block answered normally;
	// larger ones get 431 too_large.
	MaxHeaderBytes = 64 << 10
)

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Sandboxes == nil {
		return nil, errors.New("server: Config.Sandboxes is required")
	}
	if cfg.Auth == nil {
		return nil, errors.New("server: Config.Auth is required")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, rt := range s.routes() {
		h := http.Handler(rt.handler)
		if rt.auth {
			h = s.authenticate(h)
		}
		s.mux.Handle(rt.pattern(), h)
	}
	s.mux.HandleFunc(gitPattern, s.serveGit)
	s.handler = telemetry.Instrument("atoll", httpkit.LogRequests(s.log, "http request",
		httpkit.Atoll.Recover(s.log, s.limitHeaders(http.HandlerFunc(s.route)))))
	return s, nil
}

// Handler returns the http.Handler of the API.
func (s *Server) Handler() http.Handler { return s.handler }

// NewHTTPServer returns an http.Server for h with atoll's connection limits.
// Header blocks above MaxHeaderBytes get a JSON 431 from the handler; the
// http.Server's own, plain-text limit sits above that as a hard cap. There is
// no write timeout because exec, attach and watch stream for as long as they run.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		MaxHeaderBytes:    4 * MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// route dispatches to the mux and answers unknown routes with JSON.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		defer audit.Matched(r)
		s.mux.ServeHTTP(w, r)
		return
	}
	// No route: let the mux decide between redirect, 404 and 405, then answer
	// 404 and 405 in JSON.
	rec := &headerRecorder{header: make(http.Header)}
	h.ServeHTTP(rec, r)
	switch rec.status {
	case http.StatusNotFound:
		writeJSONError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.header.Get("Allow"))
		writeJSONError(w, http.StatusMethodNotAllowed, "invalid", fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
	default:
		if loc := rec.header.Get("Location"); loc != "" {
			w.Header().Set("Location", loc)
		}
		w.WriteHeader(rec.status)
	}
}

type headerRecorder struct {
	header http.Header
	status int
}

func (r *headerRecorder) Header() http.Header { return r.header }
func (r *headerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *headerRecorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return len(p), nil
}

// authenticate requires an API key in "Authorization: Bearer KEY" or
// "X-API-Key: KEY", or for a websocket handshake in its subprotocols
// (wsauth.go).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if h := r.Header.Get("Authorization"); len(h) > 7 && equalFold(h[:7], "bearer ") {
				key = h[7:]
			}
		}
		if key == "" {
			key = wsKey(r)
		}
		if key == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="atoll"`)
			writeJSONError(w, http.StatusUnauthorized, "unauthorized", "missing API key: send Authorization: Bearer KEY or X-API-Key: KEY")
			return
		}
		t, err := s.cfg.Auth.Authenticate(r.Context(), key)
		if err != nil {
			if errors.Is(err, errdefs.ErrUnauthorized) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="atoll"`)
				writeJSONError(w, http.StatusUnauthorized, "unauthorized", "invalid API key")
				return
			}
			s.writeError(w, r, fmt.Errorf("authenticating: %w", err))
			return
		}
		// Everything below acts for the key's tenant: the sandbox service
		// shows it only what it owns.
		next.ServeHTTP(w, r.WithContext(tenant.NewContext(r.Context(), t)))
	})
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// limitHeaders answers 431 in JSON for header blocks over MaxHeaderBytes.
func (s *Server) limitHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.Method) + len(r.RequestURI) + len(r.Host) + 16
		for k, vs := range r.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4
			}
		}
		if n > MaxHeaderBytes {
			w.Header().Set("Connection", "close")
			writeJSONError(w, http.StatusRequestHeaderFieldsTooLarge, "too_large",
				fmt.Sprintf("request headers are larger than %d bytes", MaxHeaderBytes))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// idPattern is the shape of sandbox and snapshot IDs: 20 characters of [a-z0-9].
var idPattern = regexp.MustCompile(`^[a-z0-9]{20}$`)
