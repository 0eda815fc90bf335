package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/store"
)

// Owner is the node a sandbox is on, and that node's state.
type Owner struct {
	Node
	State string // store.NodeLive or store.NodeFenced
}

// Locate returns the owner of sandbox id: an Owner with no Name for a
// sandbox no node runs (lost, or not placed yet), which any node serves;
// an error of kind errdefs.ErrNotFound for no such sandbox, which the
// local handler answers too. LocateBy builds one.
type Locate func(ctx context.Context, id string) (Owner, error)

// LocateBy is a Locate over sandbox, which returns a sandbox's node and
// state (from the store), and the directory of nodes. A lost sandbox is
// any node's: its node is gone, and what remains of it (its record, its
// restore) is the control plane's.
func LocateBy(sandbox func(ctx context.Context, id string) (node, state string, err error), dir *Directory) Locate {
	return func(ctx context.Context, id string) (Owner, error) {
		node, state, err := sandbox(ctx, id)
		if err != nil || node == "" || state == api.StateLost {
			return Owner{}, err
		}
		n, ok, err := dir.Node(ctx, node, false)
		if err != nil {
			return Owner{}, err
		}
		if !ok || n.State != store.NodeLive {
			// A node the store names but the cached list does not: one
			// that just joined; or one the list has fenced, which may
			// have joined again since.
			if n, ok, err = dir.Node(ctx, node, true); err != nil {
				return Owner{}, err
			}
		}
		if !ok {
			return Owner{Node: Node{Name: node}, State: "unknown"}, nil
		}
		return Owner{Node: Node{Name: n.Name, Address: n.Address}, State: n.State}, nil
	}
}

// RouterConfig configures a Router.
type RouterConfig struct {
	// Self is this node's name: its sandboxes are served here.
	Self string
	// Listener names the public listener the router serves, for the owner
	// to serve a routed request with the same listener's handler
	// (Listeners). For only the API's listener, any name, even "", will do.
	Listener string
	// Locate finds a sandbox's owner.
	Locate Locate
	// Client carries routed requests to their owners (required).
	Client *Client
	// Surface is the shape of the router's own error answers to r;
	// httpkit.Atoll when nil.
	Surface func(r *http.Request) httpkit.Surface
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
}

// Router sends each request about a sandbox that another node runs to
// that node, and serves the rest locally.
type Router struct {
	cfg RouterConfig
}

// NewRouter returns a Router.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Surface == nil {
		cfg.Surface = func(*http.Request) httpkit.Surface { return httpkit.Atoll }
	}
	return &Router{cfg: cfg}
}

// For returns a Router like rt for the public listener named listener,
// with the same locator and client.
func (rt *Router) For(listener string) *Router {
	cfg := rt.cfg
	cfg.Listener = listener
	return &Router{cfg: cfg}
}

// Wrap returns local behind the router: a request is served by local
// unless it is about a sandbox that a live other node owns, when it is
// proxied there (streams and upgraded connections included). A request
// routed here already (From) is local's whatever the locator says, so a
// request never travels twice.
//
// The router does not authenticate: the owner does, or local. So where it
// cannot route (the owner is fenced, or cannot be reached), local answers,
// after its own checks: the sandbox's tenant hears that it runs on another
// node (503), anyone else what a sandbox not theirs gets (401, 404). An
// answer of the router's own would tell an unauthenticated client that
// the ID exists, and where.
func (rt *Router) Wrap(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := From(r); ok {
			local.ServeHTTP(w, r)
			return
		}
		// Only Guard, on the node-to-node listener, trusts these.
		stripPeerHeaders(r.Header)
		id := sandboxOf(r)
		if id == "" {
			local.ServeHTTP(w, r)
			return
		}
		owner, err := rt.cfg.Locate(r.Context(), id)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			local.ServeHTTP(w, r)
			return
		case err != nil:
			rt.cfg.Logger.Warn("locating a sandbox", "sandbox", id, "err", err)
			rt.fail(w, r, fmt.Sprintf("cannot locate sandbox %s now; try again", id))
			return
		case owner.Name == "" || owner.Name == rt.cfg.Self:
			local.ServeHTTP(w, r)
			return
		case owner.State != store.NodeLive:
			local.ServeHTTP(w, r)
			return
		}
		// The body goes to the owner through body, which the proxy's
		// transport cannot close: if the owner cannot be reached before
		// any of it went, local still has all of it.
		var body *untouched
		if r.Body != nil && r.Body != http.NoBody {
			body = &untouched{r: r.Body}
			r.Body = body
		}
		rt.proxy(w, owner.Node, id, func(w http.ResponseWriter, r *http.Request) {
			if body != nil {
				rc, ok := body.take()
				if !ok {
					rt.fail(w, r, "the request broke off on its way to the node that runs the sandbox; try again")
					return
				}
				r.Body = rc
			}
			local.ServeHTTP(w, r)
		}).ServeHTTP(w, r)
	})
}

// untouched is a request body on its way to another node that records
// whether any of it was read. Its Close leaves the body open, for the
// server to close; once taken back, the transport (which may still hold
// it after its round trip failed) reads nothing more of it.
type untouched struct {
	mu          sync.Mutex
	r           io.ReadCloser
	read, taken bool
}

func (u *untouched) Read(p []byte) (int, error) {
	u.mu.Lock()
	if u.taken {
		u.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	u.read = true
	u.mu.Unlock()
	return u.r.Read(p)
}

func (u *untouched) Close() error { return nil }

// take returns the body for another handler to read, if none of it was
// read here.
func (u *untouched) take() (io.ReadCloser, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.taken = true
	return u.r, !u.read
}

func (rt *Router) fail(w http.ResponseWriter, r *http.Request, msg string) {
	rt.cfg.Surface(r).Error(w, http.StatusServiceUnavailable, api.CodeUnavailable, msg)
}

// proxy is a reverse proxy to node n for a request about sandbox id;
// unreached answers a request that could not be carried there.
func (rt *Router) proxy(w http.ResponseWriter, n Node, id string, unreached http.HandlerFunc) *httputil.ReverseProxy {
	c := rt.cfg.Client
	return &httputil.ReverseProxy{
		// The request's body may go on streaming to the owner while its
		// answer streams back (stdin and exec output, uploads answered
		// early, and the last read of any body, which sees its end):
		// without full duplex, Go's HTTP/1 server ends the request body
		// once the answer begins, and the proxy then cuts the owner's
		// answer off mid-stream. Enabled once the owner has answered, not
		// before: a request that never reached the owner is answered
		// while nothing reads its body, as the server expects.
		ModifyResponse: func(resp *http.Response) error {
			_ = http.NewResponseController(w).EnableFullDuplex()
			// The request's ID went to the owner with the request,
			// and this node's answer carries it already.
			if w.Header().Get(httpkit.RequestIDHeader) != "" {
				httpkit.DropRequestID(resp)
			}
			return nil
		},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "https", Host: n.Address})
			// The owner's handlers route by host too: envd and the port
			// proxy by {port}-{id}.{domain}.
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(HeaderEpoch, strconv.FormatInt(c.epoch(), 10))
			pr.Out.Header.Set(HeaderRouted, rt.cfg.Self)
			pr.Out.Header.Set(HeaderListener, rt.cfg.Listener)
			pr.Out.Header.Set(HeaderClient, pr.In.RemoteAddr)
		},
		Transport: c.transport(n),
		// Streams (exec output, watches, logs) flush as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			rt.cfg.Logger.Warn("routing to a node", "sandbox", id, "node", n.Name, "err", err)
			unreached(w, r)
		},
		ErrorLog: slog.NewLogLogger(rt.cfg.Logger.Handler(), slog.LevelWarn),
	}
}
