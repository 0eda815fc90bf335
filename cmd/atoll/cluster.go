package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/cluster/membership"
	"github.com/atoll-dev/atoll/internal/cluster/peer"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/scheduler"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
)

// clusterConfig is `atoll serve`'s cluster flags (docs/cluster.md).
type clusterConfig struct {
	url      string // --cluster: the PostgreSQL database; "" for one machine
	name     string
	listen   string // the node-to-node listener
	address  string // how other nodes reach it; default listen's
	capacity string
	labels   []string
	lease    time.Duration
}

// clustering is what the cluster steps of serve build.
type clustering struct {
	cfg   clusterConfig
	store *postgres.Store
	// capacity is the node's (--node-capacity), as it joined.
	capacity store.Resources
	member   *membership.Member
	sched    *scheduler.Scheduler
	ca       *peer.CA
	id       *peer.Identity
	dir      *peer.Directory
	client   *peer.Client
	router   *peer.Router
	ln       net.Listener
	srv      *http.Server
}

// nodeAddress is the address other nodes reach this one at: --node-address,
// else --node-listen's if it names a host. It goes into the node's
// certificate, so it must be the real one.
func (c clusterConfig) nodeAddress() (string, error) {
	a := c.address
	if a == "" {
		a = c.listen
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("--node-address %q: want HOST:PORT", a)
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		return "", fmt.Errorf("--node-listen %s listens on every address: give --node-address, the address other nodes reach this one at", c.listen)
	}
	return net.JoinHostPort(host, port), nil
}

// openCluster opens the cluster's PostgreSQL store.
func (s *serving) openCluster(ctx context.Context) error {
	c := &s.cluster
	if c.cfg.listen == "" {
		return errors.New("--cluster needs --node-listen: the address of this node's node-to-node listener")
	}
	if !api.ValidNodeName(c.cfg.name) {
		return fmt.Errorf("--node-name %q: want 1-63 of [a-z0-9-], starting with a letter or digit", c.cfg.name)
	}
	if _, err := c.cfg.nodeAddress(); err != nil {
		return err
	}
	pg, err := postgres.Open(ctx, c.cfg.url, c.cfg.name)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	c.store = pg
	s.onClose(func() { pg.Close() })
	return nil
}

// joinCluster joins the cluster as this node, under a new epoch, and
// makes what the node needs to take part: its writes fenced by the epoch,
// its certificate from the cluster CA, the directory of nodes, the client
// for calls to them and the router of requests to them, and the scheduler.
func (s *serving) joinCluster(ctx context.Context) error {
	c := &s.cluster
	if c.store == nil {
		return nil // one machine
	}
	capacity, err := nodeCapacity(c.cfg.capacity, s.dir.Layers())
	if err != nil {
		return err
	}
	c.capacity = capacity
	labels, err := nodeLabels(c.cfg.labels)
	if err != nil {
		return err
	}
	labels[api.NodeNameLabel] = c.cfg.name
	address, _ := c.cfg.nodeAddress()
	var runtimes []string
	for name := range s.node.Runtimes() {
		runtimes = append(runtimes, name)
	}
	sort.Strings(runtimes)
	c.ca, err = peer.LoadCA(ctx, c.store.Secret)
	if err != nil {
		return fmt.Errorf("the cluster CA: %w", err)
	}
	if c.id, err = c.ca.NewIdentity(c.cfg.name, address, 0); err != nil {
		return err
	}
	// Heartbeats go over connections of their own: in a burst, the
	// store's pool is busy with placements, and a lease must not run out
	// waiting behind them.
	hb, err := postgres.Open(ctx, c.cfg.url, c.cfg.name)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	s.onClose(func() { hb.Close() })
	c.member, err = membership.Join(ctx, membership.Config{
		Store: hb,
		Node: store.Node{Name: c.cfg.name, Address: address, Version: version, Runtimes: runtimes,
			Labels: labels, Capacity: capacity},
		Lease: c.cfg.lease,
		// Status and OnFenced need the control plane, made after this
		// step: they read s.svc when they run.
		Status:   s.nodeStatus,
		OnFenced: s.relinquish,
		Logger:   s.log,
	})
	if err != nil {
		return err
	}
	s.state = c.store.As(c.cfg.name, c.member.Epoch())
	c.dir = peer.NewDirectory(c.store.Nodes, 0)
	c.client = peer.NewClient(c.id, c.member.Epoch)
	s.onClose(c.client.Close)
	c.router = peer.NewRouter(peer.RouterConfig{Self: c.cfg.name, Listener: "api", Client: c.client, Logger: s.log,
		Locate: peer.LocateBy(func(ctx context.Context, id string) (string, string, error) {
			sb, err := c.store.Get(ctx, id)
			return sb.Node, sb.State, err
		}, c.dir)})
	c.sched = scheduler.New(scheduler.Config{Store: c.store, Logger: s.log})
	s.onClose(func() { c.sched.Close() })
	return nil
}

// ready is GET /v1/health's answer on a cluster node: an error while its
// heartbeats have not reached the store for a lease.
func (c *clustering) ready() error {
	if c.member != nil && !c.member.Healthy() {
		return fmt.Errorf("%w: node %s has not reached the cluster's store for a lease (%s)", errdefs.ErrUnavailable, c.cfg.name, c.cfg.lease)
	}
	return nil
}

// gate answers 503 at once, rather than after the store's retries (up to
// 30 s), to the API requests a node gets while it has not reached the
// cluster's store for a lease: nearly every request needs the store (to
// authenticate, to find the sandbox's node), and a client told so can try
// again later or elsewhere. Requests already under way when the store went
// away wait for it, within the store's bound. Health says the same in its
// own words.
func (c *clustering) gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" && r.URL.Path != "/health" {
			if err := c.ready(); err != nil {
				httpkit.Atoll.Error(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// nodeStatus is what each heartbeat reports: the template versions whose
// layers the node holds (for the scheduler's locality), the warm pools, and
// the creates it placed lately (the demand the warm pools follow).
func (s *serving) nodeStatus() store.NodeStatus {
	if s.svc == nil {
		return store.NodeStatus{}
	}
	return store.NodeStatus{Templates: s.svc.HeldTemplates(), Pooled: s.svc.Pooled(), Demand: s.svc.Demand(), Drain: s.drainStatus()}
}

// relinquish stops every sandbox of a node the cluster fenced.
func (s *serving) relinquish(ctx context.Context) {
	if s.svc != nil {
		if err := s.svc.Relinquish(ctx); err != nil {
			s.log.Error("stopping the sandboxes of a fenced node", "err", err)
		}
	}
}

// placer places a create through the scheduler.
type placer struct{ sched *scheduler.Scheduler }

func (p placer) Place(ctx context.Context, sb *store.Sandbox, req api.CreateSandboxRequest, snapshotNode string) error {
	// The scheduler sets sb.Placement, the placement record, before the
	// store records sb.
	_, err := p.sched.Place(ctx, sb, scheduler.Request{Sandbox: sb.ID, CPU: sb.CPU, MemoryMiB: sb.MemoryMiB,
		DiskGiB: sb.DiskGiB, Runtime: sb.Runtime, TemplateVersion: sb.TemplateVersion, Tenant: sb.Tenant,
		Snapshot: sb.FromSnapshot, SnapshotNode: snapshotNode,
		Selector: req.NodeSelector, Spread: req.Spread, Explain: req.Explain})
	return err
}

// peers has another node run a sandbox placed on it.
type peers struct{ c *clustering }

// runPath is the node-to-node endpoint that runs a placed sandbox.
const runPath = "/cluster/v1/sandboxes/{id}/run"

func (p peers) RunOn(ctx context.Context, node, id string) (api.Sandbox, error) {
	// The store placed it there, so the node was live then: if the cached
	// list says otherwise, it is behind (a node that joined, or joined
	// again).
	return p.postLive(ctx, node, true, "was placed", runPath, id)
}

// postLive POSTs path, with {id} as id, to node if it is live, and returns
// the sandbox it answers. The node is looked up in the store, or first in
// the cached list when cached; where says what the node is to the sandbox
// in the error that it is not live.
func (p peers) postLive(ctx context.Context, node string, cached bool, where, path, id string) (api.Sandbox, error) {
	n, ok, err := p.c.dir.Node(ctx, node, !cached)
	if cached && err == nil && (!ok || n.State != store.NodeLive) {
		n, ok, err = p.c.dir.Node(ctx, node, true)
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	if !ok || n.State != store.NodeLive {
		return api.Sandbox{}, fmt.Errorf("%w: node %s, where the sandbox %s, is not live", errdefs.ErrUnavailable, node, where)
	}
	var sb api.Sandbox
	err = p.c.client.Call(ctx, peer.Node{Name: n.Name, Address: n.Address}, "POST", strings.Replace(path, "{id}", id, 1), nil, &sb)
	return sb, err
}

// nodes answers the node routes from the cluster store.
type nodes struct{ st *postgres.Store }

func (n nodes) List(ctx context.Context) ([]api.Node, error) {
	ns, err := n.st.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Node, 0, len(ns))
	for _, x := range ns {
		out = append(out, api.Node{Name: x.Name, Address: x.Address, Version: x.Version, Runtimes: x.Runtimes,
			Labels: x.Labels, Capacity: api.NodeResources(x.Capacity), Committed: api.NodeResources(x.Committed),
			State: x.State, Schedule: x.Schedule, Epoch: x.Epoch, JoinedAt: x.JoinedAt, Heartbeat: x.Heartbeat,
			LeaseExpires: x.LeaseExpires, Templates: x.Status.Templates, Drain: (*api.NodeDrain)(x.Status.Drain),
			Warm: x.Status.Pooled, Demand: x.Status.Demand})
	}
	return out, nil
}

func (n nodes) SetSchedule(ctx context.Context, name, schedule string) error {
	return n.st.SetSchedule(ctx, name, schedule)
}

// internalHandler serves the nodes' own calls (/cluster/v1/...).
func (s *serving) internalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
		sb, err := s.svc.RunPlaced(r.Context(), r.PathValue("id"))
		if err == nil {
			err = s.mountPlaced(r.Context(), sb)
		}
		if err != nil {
			writeNodeError(w, err, s.log)
			return
		}
		httpkit.Atoll.JSON(w, http.StatusCreated, sb)
	})
	mux.HandleFunc("POST "+startPath, s.handleStart)
	return mux
}

// writeNodeError answers a node's call with err's kind.
func writeNodeError(w http.ResponseWriter, err error, log *slog.Logger) {
	kind := errdefs.Kind(err)
	if kind == nil {
		log.Error("internal error in a node-to-node call", "err", err)
		httpkit.Atoll.Error(w, http.StatusInternalServerError, api.CodeInternal, "internal error")
		return
	}
	httpkit.Atoll.Error(w, httpkit.Atoll.Status(err), errdefs.Code(err), httpkit.ClientMessage(err, kind))
}

// listenNode opens the node-to-node listener: mutual TLS under the cluster
// CA, admitting live members under their current epoch, serving routed
// requests with the handler of the listener they came in on, and the
// nodes' own calls.
func (s *serving) listenNode(context.Context) error {
	c := &s.cluster
	if c.member == nil {
		return nil // one machine
	}
	ln, err := s.listenFor("--node-listen", c.cfg.listen)
	if err != nil {
		return err
	}
	c.ln = ln
	handlers := map[string]http.Handler{"": s.internalHandler(), "api": s.local}
	if s.proxy != nil {
		handlers["ports"] = s.proxy
	}
	hs := server.NewHTTPServer(c.cfg.listen, peer.Guard(c.dir.Live, peer.Listeners(handlers), s.log))
	hs.TLSConfig = c.id.ServerTLS()
	c.srv = hs
	return nil
}

// runCluster heartbeats and serves the node listener until ctx ends. A
// fenced node's sandboxes are stopped (relinquish) and it returns
// membership.ErrFenced, for serve to exit with.
func (s *serving) runCluster(ctx context.Context, errc chan<- error) {
	c := &s.cluster
	go func() {
		if err := c.srv.ServeTLS(c.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("node listener: %w", err)
		}
	}()
	go func() {
		if err := c.member.Run(ctx); err != nil {
			errc <- err
		}
	}()
	go s.runDrain(ctx)
}

// hostName is the default node name: the host's, made a valid one.
func hostName() string {
	h, _ := os.Hostname()
	h = strings.ToLower(strings.SplitN(h, ".", 2)[0])
	var b strings.Builder
	for _, r := range h {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		}
	}
	return strings.TrimLeft(b.String(), "-")
}
