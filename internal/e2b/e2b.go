// Package e2b serves an E2B-compatible API over atoll, so that agent code
// written for E2B's SDKs runs on atoll with two environment variables
// changed. It has two halves on one handler: the control plane (E2B's REST
// API: create, list, get, kill, timeout, pause, connect, fork, snapshots),
// mapped onto atoll's sandbox service, and the sandbox traffic E2B SDKs
// address to a sandbox's port 49983, which package envd serves on the host
// by calling the sandbox's atoll agent. docs/e2b.md says what is supported.
package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/e2b/envd"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/portproxy"
	"github.com/atoll-dev/atoll/internal/telemetry"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Sandboxes is the part of atoll's sandbox service (server.Sandboxes) the
// E2B API uses. Errors carry errdefs kinds.
type Sandboxes interface {
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	List(ctx context.Context, state string, labels map[string]string) ([]api.Sandbox, error)
	Start(ctx context.Context, id string) (api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) (api.Sandbox, error)
	Resume(ctx context.Context, id string) (api.Sandbox, error)
	Shelve(ctx context.Context, id string) (api.Sandbox, error)
	SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error)
	Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error)
	CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error)
	GetSnapshot(ctx context.Context, snapID string) (api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, snapID string) error
	AgentDialer(ctx context.Context, id string) (func(ctx context.Context) (net.Conn, error), error)
	SetNetwork(ctx context.Context, id string, req api.NetworkPolicy) (api.SandboxNetwork, error)
	// Metrics returns a sandbox's samples from start to end (inclusive,
	// to the second; zero for an open end); LatestMetrics the newest of
	// each of ids that the caller's tenant has (at most 100 ids).
	Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error)
	LatestMetrics(ctx context.Context, ids []string) (map[string]api.Metric, error)
}

// Ports is the port proxy (portproxy.Proxy), which serves sandbox ports
// other than envd's.
type Ports interface {
	// ServePort serves r to port of sandbox id, its access already
	// checked by the caller; fail answers what it cannot deliver.
	ServePort(w http.ResponseWriter, r *http.Request, id string, port int, fail portproxy.FailFunc)
	// Token is the access token of every port of sandbox id.
	Token(id string) string
}

// Authenticator checks an API key and returns the tenant it belongs to
// (package tenant); an error wrapping errdefs.ErrUnauthorized when the key
// is not accepted.
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (tenant string, err error)
}

// Config configures a Server. Sandboxes, Auth and TokenKey are required.
type Config struct {
	Sandboxes Sandboxes
	Auth      Authenticator
	// TokenKey signs the sandboxes' envd access tokens; at least 32 bytes,
	// kept secret and stable: changing it invalidates every token.
	TokenKey []byte
	// Ports serves sandbox ports other than envd's (getHost URLs); nil
	// answers them 502, as for a server without networking.
	Ports Ports
	// Templates builds templates for E2B's template SDK (admin keys only)
	// and tells which templates exist; nil answers the build routes 501
	// and takes the first of each alias's list.
	Templates Templates
	// Aliases maps E2B template names to atoll templates, each to the
	// first of its list that exists; default DefaultAliases.
	Aliases map[string][]string
	Logger  *slog.Logger // default slog.Default()
}

// DefaultAliases: E2B's default template is atoll's base template
// (atoll template bootstrap base), which has what E2B's has, or the
// built-in host template on a server without one. The code-interpreter
// SDK's default template (code-interpreter-v1) is atoll's code-interpreter
// template (templates/code-interpreter), which serves E2B's protocol.
var DefaultAliases = map[string][]string{"base": {"base", "host"}, "code-interpreter-v1": {"code-interpreter"}}

// Server serves the E2B-compatible API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	api     *routeMux
	envd    *envd.Server
	reverse map[string]string // atoll template → E2B alias
	builds  *builds
	handler http.Handler
}

// MaxJSONBody is the largest control-plane request body read.
const MaxJSONBody = 1 << 20

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Sandboxes == nil:
		return nil, errors.New("e2b: Config.Sandboxes is required")
	case cfg.Auth == nil:
		return nil, errors.New("e2b: Config.Auth is required")
	case len(cfg.TokenKey) < 32:
		return nil, errors.New("e2b: Config.TokenKey must be at least 32 bytes")
	}
	if cfg.Aliases == nil {
		cfg.Aliases = DefaultAliases
	}
	s := &Server{cfg: cfg, log: cfg.Logger, api: &routeMux{ServeMux: http.NewServeMux()}, reverse: map[string]string{}, builds: newBuilds()}
	if s.log == nil {
		s.log = slog.Default()
	}
	for alias, tmpls := range cfg.Aliases {
		for _, t := range tmpls {
			s.reverse[t] = alias
		}
	}
	s.envd = envd.New(envd.Config{Logger: s.log})
	s.routes()
	s.handler = telemetry.Instrument("e2b", httpkit.LogRequests(s.log, "e2b request", httpkit.E2B.Recover(s.log, http.HandlerFunc(s.dispatch))))
	return s, nil
}

// ServeHTTP serves the control plane and sandbox traffic.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close stops what the server keeps between requests (polling watchers)
// and ends the template builds running, waiting for them.
func (s *Server) Close() {
	s.envd.Close()
	s.builds.close()
}

func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	if t, ok := sandboxTarget(r); ok {
		telemetry.SetRoute(w, "sandbox traffic")
		s.serveSandbox(w, r, t)
		return
	}
	if id, ok := s.signedFileSandbox(r); ok {
		telemetry.SetRoute(w, "sandbox traffic")
		s.serveSandbox(w, r, target{id: id, port: strconv.Itoa(envd.Port)})
		return
	}
	defer audit.Matched(r)
	s.api.ServeHTTP(w, r)
}

// signedFileSandbox finds the sandbox a signed file URL without routing is
// for. With E2B_SANDBOX_URL, SDKs make uploadUrl and downloadUrl on that
// one URL, naming no sandbox; the signature names it in effect, since only
// that sandbox's envd access token makes it. So the running sandbox whose
// token does is the one: a list of the running sandboxes and a hash for
// each per such request, which only a signature of the right shape costs.
func (s *Server) signedFileSandbox(r *http.Request) (string, bool) {
	if r.URL.Path != "/files" || !envd.SignatureShaped(r.URL.Query().Get("signature")) {
		return "", false
	}
	// No tenant in the context: the signature, not a key, authorises it.
	sbs, err := s.cfg.Sandboxes.List(r.Context(), api.StateRunning, nil)
	if err != nil {
		return "", false
	}
	for _, sb := range sbs {
		if envd.SignedBy(r, s.accessToken(sb.ID)) {
			return sb.ID, true
		}
	}
	return "", false
}

// routeMux is a ServeMux that lists its patterns (Routes).
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Routes lists the control plane's route patterns ("POST
// /sandboxes/{sandboxID}/pause"), for the tests of what wraps the server.
func (s *Server) Routes() []string { return slices.Clone(s.api.patterns) }

func (s *Server) routes() {
	auth := func(h http.HandlerFunc) http.Handler { return s.authenticate(h) }
	m := s.api
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.Handle("POST /sandboxes", auth(s.create(15)))
	m.Handle("POST /v2/sandboxes", auth(s.create(300)))
	m.Handle("GET /sandboxes", auth(s.listV1))
	m.Handle("GET /v2/sandboxes", auth(s.list))
	m.Handle("GET /sandboxes/{sandboxID}", auth(s.get))
	m.Handle("DELETE /sandboxes/{sandboxID}", auth(s.kill))
	m.Handle("POST /sandboxes/{sandboxID}/timeout", auth(s.setTimeout))
	m.Handle("POST /sandboxes/{sandboxID}/refreshes", auth(s.refresh))
	m.Handle("POST /sandboxes/{sandboxID}/pause", auth(s.pause))
	m.Handle("POST /sandboxes/{sandboxID}/resume", auth(s.resume))
	m.Handle("POST /sandboxes/{sandboxID}/connect", auth(s.connect))
	m.Handle("POST /v2/sandboxes/{sandboxID}/connect", auth(s.connect))
	m.Handle("POST /sandboxes/{sandboxID}/fork", auth(s.fork))
	m.Handle("PUT /sandboxes/{sandboxID}/network", auth(s.updateNetwork))
	m.Handle("POST /sandboxes/{sandboxID}/snapshots", auth(s.createSnapshot))
	m.Handle("GET /snapshots", auth(s.listSnapshots))
	m.Handle("GET /sandboxes/{sandboxID}/metrics", auth(s.metrics))
	m.Handle("GET /sandboxes/metrics", auth(s.latestMetrics))
	m.Handle("GET /sandboxes/{sandboxID}/logs", auth(s.logs))
	m.Handle("GET /v2/sandboxes/{sandboxID}/logs", auth(s.logsV2))
	m.Handle("DELETE /templates/{templateID}", auth(s.deleteSnapshot))
	s.templateRoutes()
	// Parts of E2B's API atoll does not offer answer so, not "not found".
	for _, p := range []struct{ pattern, what string }{
		{"/templates/", "this template call (use atoll template)"},
		{"/templates", "listing and legacy builds of templates (use atoll template)"},
		{"/v2/templates/", "this template call (use atoll template)"},
		{"/v2/templates", "listing and legacy builds of templates (use atoll template)"},
		{"/v3/templates", "template builds on this server (it has no template service)"},
		{"/volumes", "volumes"},
		{"/volumes/", "volumes"},
		{"/secrets", "secrets"},
		{"/secrets/", "secrets"},
	} {
		m.Handle(p.pattern, auth(notImplemented(p.what)))
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
}

func notImplemented(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, what+" is not supported by atoll's E2B-compatible API")
	}
}

// authenticate requires an atoll API key in X-API-Key, as E2B SDKs send
// it. Keys are accepted in E2B's format too: "e2b_" and the hex part of an
// atoll key, which E2B's Python SDK insists on.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			writeError(w, http.StatusUnauthorized, "missing API key: send it in the X-API-Key header")
			return
		}
		t, err := s.cfg.Auth.Authenticate(r.Context(), key)
		if rest, ok := strings.CutPrefix(key, "e2b_"); ok && errors.Is(err, errdefs.ErrUnauthorized) {
			t, err = s.cfg.Auth.Authenticate(r.Context(), "atoll_"+rest)
		}
		if err != nil {
			if errors.Is(err, errdefs.ErrUnauthorized) {
				writeError(w, http.StatusUnauthorized, "invalid API key")
				return
			}
			s.writeErr(w, r, fmt.Errorf("authenticating: %w", err))
			return
		}
		// A key sees its tenant's sandboxes only; another's are not found,
		// as another team's are on E2B.
		next.ServeHTTP(w, r.WithContext(tenant.NewContext(r.Context(), t)))
	})
}
