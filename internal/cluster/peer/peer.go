// Package peer is how the nodes of a cluster talk to each other: mutual TLS
// under a cluster CA that the first node makes and the store keeps, a
// Guard on each node's node-to-node listener that admits only live members
// under their current epoch, a Router on the public listeners that sends a
// request about a sandbox to the node that runs it, and a Client for the
// nodes' own calls.
//
// Wiring, on each node:
//
//	ca, _ := peer.LoadCA(ctx, cluster.Secret)
//	id, _ := ca.NewIdentity(name, nodeAddress, 0) // nodeAddress: store.Node.Address
//	dir := peer.NewDirectory(cluster.Nodes, 0)
//	client := peer.NewClient(id, currentEpoch)
//	router := peer.NewRouter(peer.RouterConfig{Self: name, Client: client, Listener: "api",
//		Locate: peer.LocateBy(sandboxNodeAndState, dir)})
//	// the public listeners, each behind its router
//	public := router.Wrap(api)
//	ports := router.For("ports").Wrap(portProxy)
//	// the node-to-node listener: each listener's handler as is, and the
//	// nodes' own endpoints (/cluster/v1/...)
//	handlers := map[string]http.Handler{"": internal, "api": api, "ports": portProxy}
//	nodeSrv := &http.Server{TLSConfig: id.ServerTLS(), Handler: peer.Guard(dir.Live, peer.Listeners(handlers), log)}
//	nodeSrv.ListenAndServeTLS("", "")
//
// A routed request reaches the owner on its node-to-node listener, where
// Guard marks it (in its context) as routed; the Router serves a routed
// request locally whatever its locator says, so a request is forwarded at
// most once. The marks travel in headers only between nodes, over mutual
// TLS: on a public listener the Router strips them first, so nothing sent
// from outside, or from inside a sandbox, passes for a node.
//
// Authentication of the client is not the router's: its Authorization and
// API key headers reach the owner unchanged, and the owner checks them
// against the shared store, so a tenant's key opens on another node what
// it opens on its own, and no more.
package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/store"
)

// Headers between nodes. A public listener drops every header with
// headerPrefix before it looks at a request.
const (
	headerPrefix = "Atoll-Peer-"
	// HeaderEpoch is the sending node's epoch: a node fenced since keeps
	// its certificate until it expires, but not its epoch.
	HeaderEpoch = headerPrefix + "Epoch"
	// HeaderRouted names the node that routed a client's request, for the
	// owner's logs.
	HeaderRouted = headerPrefix + "Routed-By"
	// HeaderListener names the public listener a routed request came in
	// on (RouterConfig.Listener): the same request means different things
	// on different listeners (a host {port}-{id}.{domain} is envd's on the
	// API's listener, a sandbox's port on the port proxy's), so the owner
	// serves it with that listener's handler (Listeners).
	HeaderListener = headerPrefix + "Listener"
	// HeaderClient is the client's address as the routing node saw it:
	// the owner serves the request as from it (what its audit log and
	// logs record), not from the routing node.
	HeaderClient = headerPrefix + "Client"
)

// stripPeerHeaders removes the node-to-node headers from h.
func stripPeerHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, headerPrefix) {
			delete(h, k)
		}
	}
}

type peerKey struct{}

// sender is what Guard knows of a request: the node that sent it, and for
// a routed request the listener it came in on.
type sender struct {
	node, listener string
}

// From returns the node that sent r, if r came in through Guard from a
// live member: a request routed to this node, or a node's own call.
func From(r *http.Request) (node string, ok bool) {
	s, ok := r.Context().Value(peerKey{}).(sender)
	return s.node, ok
}

// Listeners serves the node-to-node listener with the handler of the
// public listener each routed request came in on, by RouterConfig.Listener
// name; a node's own call names none and goes to handlers[""] (the
// /cluster/v1/ endpoints, say). A name with no handler is a 404. Put it
// behind Guard.
func Listeners(handlers map[string]http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, _ := r.Context().Value(peerKey{}).(sender)
		h, ok := handlers[s.listener]
		if !ok {
			httpkit.Atoll.Error(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("this node serves no listener %q", truncate(s.listener, 64)))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Live reports nil if node name is a live member of the cluster under
// epoch, its current one. A refusal is an errdefs.ErrForbidden whose
// message the caller sees; any other error (the store's) is answered 503.
type Live func(ctx context.Context, name string, epoch int64) error

// Guard admits to next only requests from live members under their current
// epoch: the client's certificate (verified against the cluster CA by
// ServerTLS) names the node, HeaderEpoch its epoch, and live checks both.
// Others get 403 {"code":"forbidden"}. It serves the node-to-node
// listener; a request that reached it without a verified certificate (the
// listener is misconfigured) is refused too.
func Guard(live Live, next http.Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			httpkit.Atoll.Error(w, http.StatusForbidden, api.CodeForbidden, "node-to-node calls need a cluster certificate")
			return
		}
		name := r.TLS.VerifiedChains[0][0].Subject.CommonName
		epoch, err := strconv.ParseInt(r.Header.Get(HeaderEpoch), 10, 64)
		if err != nil || epoch <= 0 {
			httpkit.Atoll.Error(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("node %q sent no valid %s header", truncate(name, 64), HeaderEpoch))
			return
		}
		if err := live(r.Context(), name, epoch); err != nil {
			log.Warn("refused a node-to-node call", "node", truncate(name, 64), "epoch", epoch, "err", err)
			if errors.Is(err, errdefs.ErrForbidden) {
				httpkit.Atoll.Error(w, http.StatusForbidden, api.CodeForbidden, errdefs.Message(err))
			} else {
				// The store did not answer: say so, not what it said.
				httpkit.Atoll.Error(w, http.StatusServiceUnavailable, api.CodeUnavailable, "cannot check the cluster's membership now")
			}
			return
		}
		ctx := context.WithValue(r.Context(), peerKey{}, sender{node: name, listener: r.Header.Get(HeaderListener)})
		client := r.Header.Get(HeaderClient)
		stripPeerHeaders(r.Header)
		r = r.WithContext(ctx)
		if _, err := netip.ParseAddrPort(client); err == nil {
			r.RemoteAddr = client
		}
		next.ServeHTTP(w, r)
	})
}

// Directory is the cluster's nodes as the store lists them, cached for a
// short while: the router asks it where an owner is and Guard whether a
// caller is live, on every request.
type Directory struct {
	list func(ctx context.Context) ([]store.Node, error)
	ttl  time.Duration

	// mu is held while listing, so that requests arriving together wait
	// for one listing rather than each making its own.
	mu    sync.Mutex
	nodes map[string]store.Node
	at    time.Time // when nodes was listed
	// failed is when listing last failed, with err: the store is asked
	// again only minRefresh later, so that an outage costs each request a
	// wait for one listing at most.
	failed time.Time
	err    error
}

// DirectoryTTL is how long a Directory trusts its list by default: a node
// fenced is refused within that long of its fencing.
const DirectoryTTL = 2 * time.Second

// minRefresh bounds how often a Directory lists the nodes again ahead of
// its TTL, for a name or epoch it has not seen (a node that just joined).
const minRefresh = 200 * time.Millisecond

// NewDirectory returns a Directory over list (store.Cluster.Nodes), which
// it trusts for ttl (DirectoryTTL when 0).
func NewDirectory(list func(ctx context.Context) ([]store.Node, error), ttl time.Duration) *Directory {
	if ttl <= 0 {
		ttl = DirectoryTTL
	}
	return &Directory{list: list, ttl: ttl}
}

// Node returns node name as last listed. With fresh, it lists the nodes
// again unless it did within minRefresh.
func (d *Directory) Node(ctx context.Context, name string, fresh bool) (store.Node, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	age := time.Since(d.at)
	if d.nodes == nil || age > d.ttl || fresh && age > minRefresh {
		if time.Since(d.failed) < minRefresh {
			return store.Node{}, false, d.err
		}
		ns, err := d.list(ctx)
		if err != nil {
			d.failed, d.err = time.Now(), fmt.Errorf("listing the cluster's nodes: %w", err)
			return store.Node{}, false, d.err
		}
		d.nodes = make(map[string]store.Node, len(ns))
		for _, n := range ns {
			d.nodes[n.Name] = n
		}
		d.at = time.Now()
	}
	n, ok := d.nodes[name]
	return n, ok, nil
}

// Live is a Live: node name is known, live, and at epoch. A name or an
// epoch newer than the list is checked against a fresh one.
func (d *Directory) Live(ctx context.Context, name string, epoch int64) error {
	n, ok, err := d.Node(ctx, name, false)
	if err == nil && (!ok || n.Epoch < epoch) {
		n, ok, err = d.Node(ctx, name, true)
	}
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%w: node %q is not a member of the cluster", errdefs.ErrForbidden, truncate(name, 64))
	case n.State != store.NodeLive:
		return fmt.Errorf("%w: node %q is %s", errdefs.ErrForbidden, name, n.State)
	case n.Epoch != epoch:
		return fmt.Errorf("%w: node %q called under epoch %d; its epoch is %d", errdefs.ErrForbidden, name, epoch, n.Epoch)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
