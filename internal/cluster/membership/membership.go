// Package membership keeps a node in its cluster: it joins under a new
// epoch, renews the node's lease by heartbeat, and fences the nodes whose
// leases ran out (store.Cluster.Expire), so that their sandboxes are marked
// lost and can be restored elsewhere.
//
// Two rules keep a PostgreSQL outage from looking like every node dying at
// once, since after one every stored lease has run out:
//
//   - A node fences others only after its own heartbeats have reached the
//     store without a gap for a whole lease: by then every live node has
//     had a lease's time to renew since the store came back.
//   - A node that cannot reach the store keeps its sandboxes running: until
//     somebody fences it, they are still its own. When it reaches the store
//     again and learns it was fenced (store.ErrFenced), it stops them all
//     (OnFenced) and Run returns ErrFenced: a fenced node's epoch is over,
//     and the process exits so that its supervisor starts it again, to join
//     under a new epoch. Nothing it ran is resurrected: its sandboxes are
//     recorded lost, and the new epoch's recovery only stops what is left.
package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
)

// Defaults. A lease of 15 s renewed every 5 s survives two lost heartbeats.
const (
	DefaultLease = 15 * time.Second
)

// Config configures a Member.
type Config struct {
	Store store.Cluster
	// Node is what the node tells the cluster about itself: name,
	// address, version, runtimes, labels, capacity.
	Node store.Node
	// Lease is how long a heartbeat keeps the node live (default
	// DefaultLease); heartbeats go every third of it.
	Lease time.Duration
	// Status is what each heartbeat reports (templates held, warm pools);
	// nil reports nothing.
	Status func() store.NodeStatus
	// OnFenced stops everything the node runs, without writing to the
	// store: called once, when the node learns it was fenced.
	OnFenced func(ctx context.Context)
	Logger   *slog.Logger
}

// ErrFenced is Run's answer when the cluster fenced this node.
var ErrFenced = errors.New("this node was fenced: its lease expired and its sandboxes were marked lost; start it again to rejoin")

// Member is a node's membership.
type Member struct {
	cfg   Config
	epoch int64
	log   *slog.Logger

	mu sync.Mutex
	// connectedSince is when the current unbroken run of successful
	// heartbeats began; zero while the store is unreachable.
	connectedSince time.Time
	lastRenew      time.Time
}

// Join records the node in the cluster under a new epoch.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	epoch, err := cfg.Store.Join(ctx, cfg.Node, cfg.Lease)
	if err != nil {
		return nil, fmt.Errorf("joining the cluster as %s: %w", cfg.Node.Name, err)
	}
	now := time.Now()
	m := &Member{cfg: cfg, epoch: epoch, log: cfg.Logger.With("node", cfg.Node.Name, "epoch", epoch),
		connectedSince: now, lastRenew: now}
	m.log.Info("joined the cluster", "address", cfg.Node.Address)
	return m, nil
}

// Name is the node's name.
func (m *Member) Name() string { return m.cfg.Node.Name }

// Epoch is the epoch the node joined under: every write it makes carries it
// (store.Cluster.As).
func (m *Member) Epoch() int64 { return m.epoch }

// Run heartbeats and fences expired nodes until ctx ends (nil) or the node
// learns it was fenced (ErrFenced, after OnFenced).
func (m *Member) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := m.heartbeat(ctx); err != nil {
			if errors.Is(err, store.ErrFenced) {
				m.log.Error("fenced by the cluster: stopping every sandbox of this node", "err", err)
				if m.cfg.OnFenced != nil {
					m.cfg.OnFenced(context.WithoutCancel(ctx))
				}
				return ErrFenced
			}
			if ctx.Err() != nil {
				return nil
			}
			m.log.Warn("heartbeat failed; the node keeps its sandboxes until it learns otherwise", "err", err)
			continue
		}
		m.expireOthers(ctx)
	}
}

// heartbeat renews the lease.
func (m *Member) heartbeat(ctx context.Context) error {
	var st store.NodeStatus
	if m.cfg.Status != nil {
		st = m.cfg.Status()
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/3)
	defer cancel()
	err := m.cfg.Store.Renew(cctx, m.cfg.Node.Name, m.epoch, m.cfg.Lease, st)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if err != nil {
		m.connectedSince = time.Time{}
		return err
	}
	if m.connectedSince.IsZero() {
		m.connectedSince = now
	}
	m.lastRenew = now
	return nil
}

// expireOthers fences the nodes whose leases ran out, once this node has
// been connected for a whole lease (see the package comment).
func (m *Member) expireOthers(ctx context.Context) {
	m.mu.Lock()
	since := m.connectedSince
	m.mu.Unlock()
	if since.IsZero() || time.Since(since) < m.cfg.Lease {
		return
	}
	// Bounded as a heartbeat is: Run heartbeats only between calls, and a
	// store that goes away mid-call would hold it for the store's whole
	// retry time, long enough for this node's own lease to run out.
	cctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/3)
	defer cancel()
	fenced, err := m.cfg.Store.Expire(cctx, time.Now(), "lease expired: no heartbeat for "+m.cfg.Lease.String())
	if err != nil {
		m.log.Warn("fencing expired nodes", "err", err)
		return
	}
	for _, n := range fenced {
		m.log.Warn("fenced a node whose lease expired; its sandboxes are lost", "fenced", n.Name, "fenced_epoch", n.Epoch,
			"last_heartbeat", n.Heartbeat)
	}
}

// Healthy reports whether the node's last heartbeat reached the store
// within a lease.
func (m *Member) Healthy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.lastRenew) < m.cfg.Lease
}
