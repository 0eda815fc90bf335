package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/control"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/scheduler"
	"github.com/atoll-dev/atoll/internal/store"
)

// Moving sandboxes between nodes (internal/control/move.go): the mover
// that picks their new node, the node-to-node call that starts one there,
// and the drain loop of a node whose schedule is draining.

// mover picks a moving sandbox's node as a create's is picked
// (scheduler.Rank), and records the move there (store.Cluster.Move),
// trying the next candidate while one has no room.
type mover struct{ c *clustering }

// rank ranks the nodes sb could move to.
func (m mover) rank(ctx context.Context, sb store.Sandbox) (scheduler.Decision, error) {
	nodes, err := m.c.store.Nodes(ctx)
	if err != nil {
		return scheduler.Decision{}, err
	}
	return scheduler.Rank(nodes, scheduler.Request{Sandbox: sb.ID, CPU: sb.CPU, MemoryMiB: sb.MemoryMiB,
		DiskGiB: sb.DiskGiB, Runtime: sb.Runtime, TemplateVersion: sb.TemplateVersion, Tenant: sb.Tenant,
		Avoid: []string{sb.Node}}, time.Now()), nil
}

func (m mover) Room(ctx context.Context, sb store.Sandbox) error {
	d, err := m.rank(ctx, sb)
	if err != nil || len(d.Candidates) > 0 {
		return err
	}
	return noRoom(sb, d, nil)
}

// noRoom is the error of a move no node can take: why each could not.
func noRoom(sb store.Sandbox, d scheduler.Decision, refused []string) error {
	var why []string
	for _, f := range d.Filtered {
		if f.Node != sb.Node {
			why = append(why, f.Node+": "+f.Reason)
		}
	}
	return fmt.Errorf("no other node has room for sandbox %s (%s): %w", sb.ID,
		strings.Join(append(why, refused...), "; "), store.ErrNoRoom)
}

func (m mover) Move(ctx context.Context, sb store.Sandbox, reason string) (store.Sandbox, error) {
	d, err := m.rank(ctx, sb)
	if err != nil {
		return store.Sandbox{}, err
	}
	var refused []string
	for _, cand := range d.Candidates {
		moved, err := m.c.store.Move(ctx, sb.ID, sb.Node, cand.Node, reason)
		if errors.Is(err, store.ErrNoRoom) {
			refused = append(refused, cand.Node+": "+err.Error())
			continue
		}
		return moved, err
	}
	return store.Sandbox{}, noRoom(sb, d, refused)
}

func (m mover) DeleteLost(ctx context.Context, sb store.Sandbox, cleanup func() error) error {
	// Unfenced: the node that ran it is fenced, and its rows are the
	// cluster's. The compare-and-set from lost keeps a restore and a
	// delete from both going ahead.
	sb.State = api.StateDeleting
	if err := m.c.store.Update(ctx, &sb, api.StateLost); err != nil {
		return err
	}
	if err := cleanup(); err != nil {
		return fmt.Errorf("%w: deleting the lost sandbox's objects failed; delete it again: %v", errdefs.ErrUnavailable, err)
	}
	_, err := m.c.store.Delete(ctx, sb.ID)
	return err
}

// startPath is the node-to-node endpoint that starts a sandbox moved to
// the node.
const startPath = "/cluster/v1/sandboxes/{id}/start"

func (p peers) StartOn(ctx context.Context, node, id string) (api.Sandbox, error) {
	return p.postLive(ctx, node, false, "moved", startPath, id)
}

// drainer runs the drain rounds of this node while its schedule is
// draining, and keeps what the last one left for the heartbeat to report.
type drainer struct {
	mu   sync.Mutex
	last *store.DrainStatus
}

// drainEvery is how often a draining node looks at its schedule and tries
// again to move what it still holds.
const drainEvery = 2 * time.Second

// runDrain drains this node, in rounds, while its schedule says so.
func (s *serving) runDrain(ctx context.Context) {
	every(ctx, drainEvery, func() { s.drainRound(ctx) })
}

// drainRound moves what this node holds if its schedule is draining, and
// ends the drain once it is not.
func (s *serving) drainRound(ctx context.Context) {
	ns, err := s.cluster.store.Nodes(ctx)
	if err != nil {
		return
	}
	draining := false
	for _, n := range ns {
		if n.Name == s.cluster.cfg.name {
			draining = n.Schedule == store.NodeDraining
		}
	}
	if !draining {
		s.drain.mu.Lock()
		was := s.drain.last != nil
		s.drain.last = nil
		s.drain.mu.Unlock()
		if was {
			s.svc.Undrain(ctx)
		}
		return
	}
	rep, err := s.svc.Drain(ctx)
	st := &store.DrainStatus{Moved: rep.Moved, Left: rep.Left, At: time.Now().UTC()}
	if err != nil {
		st.Error = err.Error()
	}
	s.drain.mu.Lock()
	if s.drain.last != nil {
		st.Moved += s.drain.last.Moved
	}
	s.drain.last = st
	s.drain.mu.Unlock()
	if rep.Moved > 0 || len(rep.Left) > 0 {
		s.log.Info("drain round", "node", s.cluster.cfg.name, "moved", rep.Moved, "left", len(rep.Left))
	}
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

// drainStatus is what the heartbeat reports of the drain.
func (s *serving) drainStatus() *store.DrainStatus {
	s.drain.mu.Lock()
	defer s.drain.mu.Unlock()
	return s.drain.last
}

// handleStart serves startPath.
func (s *serving) handleStart(w http.ResponseWriter, r *http.Request) {
	sb, err := s.svc.Start(r.Context(), r.PathValue("id"))
	if err != nil {
		writeNodeError(w, err, s.log)
		return
	}
	s.renewStarted(r.Context(), sb)
	httpkit.Atoll.JSON(w, http.StatusOK, sb)
}

var _ control.Mover = mover{}
