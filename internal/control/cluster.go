package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/templates"
)

// A Service is one node of a cluster when its node has a name
// (node.Config.Name). Then:
//
//   - Everything it does on its own (Recover, the sweeps, the lifecycle
//     policies, metrics, networks, pools) is about the rows of its node
//     (store.ListNode); the API's List and Get still see the whole cluster.
//   - Rows it makes itself (forks, pool fills, prestarts, build scratch
//     sandboxes) carry its name: record sets it.
//   - Every create is placed by Config.Placer (one from a snapshot on the
//     node that holds it, or, archived, on any node: snapshotsplace.go),
//     and run here (RunPlaced) or on the chosen node (Config.Peers.RunOn),
//     which serves it from its warm pool if it can (pool.go): this node's
//     pool is not taken without a placement, so that placement checks
//     every create (capacity, quotas) and the scheduler counts the warm
//     sandboxes right.
//   - Its store is the fenced view store.Cluster.As(name, epoch): a write
//     refused with store.ErrFenced means the sandbox is no longer this
//     node's to run (the node lost its lease, or the sandbox moved), so its
//     processes here are stopped, nothing is retried, and the caller gets
//     the error (an errdefs.ErrUnavailable). Relinquish stops everything
//     once the cluster layer learns the whole node was fenced.
//
// With no name and no Placer, none of this changes what a single machine
// does.

// Placer chooses the node a new sandbox runs on and records it there.
type Placer interface {
	// Place sets sb.Node to the node chosen for sb (made for req; its ID,
	// resources, runtime and template version set, in state creating)
	// and records sb on that node (store.Cluster.Place), trying other
	// nodes while they have no room. A create from a snapshot
	// (sb.FromSnapshot) takes no warm sandbox, and goes to node
	// snapshotNode if it is not "" (the node that holds the snapshot's
	// files). An error means sb is recorded nowhere.
	Place(ctx context.Context, sb *store.Sandbox, req api.CreateSandboxRequest, snapshotNode string) error
}

// Peers reaches the other nodes of the cluster.
type Peers interface {
	// RunOn has node run sandbox id, placed on it and recorded in state
	// creating (the node's RunPlaced), and returns the sandbox as it
	// answered.
	RunOn(ctx context.Context, node, id string) (api.Sandbox, error)
	// StartOn has node start sandbox id, archived on it (moved there:
	// move.go), and returns the sandbox as it answered.
	StartOn(ctx context.Context, node, id string) (api.Sandbox, error)
}

// ElsewhereError is an operation asked of this node about a sandbox another
// node runs: the cluster layer routes such requests to Node, and this node
// never acts on another's sandbox (its processes, socket and slot are that
// node's). It is an errdefs.ErrUnavailable.
type ElsewhereError struct {
	ID, Node string
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("sandbox %s runs on node %s, not this one", e.ID, e.Node)
}

func (e *ElsewhereError) Unwrap() error { return errdefs.ErrUnavailable }

// here returns an *ElsewhereError if sb is another node's, or a conflict
// if it is another node's lost sandbox: no node runs it, so no retry or
// routing helps (the router serves requests for lost sandboxes locally).
func (s *Service) here(sb store.Sandbox) error {
	if sb.Node != s.name && sb.State == api.StateLost {
		return fmt.Errorf("%w: sandbox %s is lost: %s", errdefs.ErrConflict, sb.ID, sb.Error)
	}
	if sb.Node != s.name {
		return &ElsewhereError{ID: sb.ID, Node: sb.Node}
	}
	return nil
}

// placedTTL bounds how long a placed row may wait in state creating for
// the RunPlaced that runs it. The node it is placed on discards it after
// that (sweepPlaced), so that a placing node that died between Place and
// RunOn leaves nothing behind but a short-lived reservation.
const placedTTL = 2 * time.Minute

// Node is the name of the cluster node this Service runs; "" on a single
// machine.
func (s *Service) Node() string { return s.name }

// createPlaced records the sandbox for req through the placer and has the
// chosen node run it: snapshotNode if it is not "" (see snapshotNode).
func (s *Service) createPlaced(ctx context.Context, sb store.Sandbox, req api.CreateSandboxRequest, snapshotNode string) (api.Sandbox, error) {
	if err := s.usable(); err != nil {
		return api.Sandbox{}, err
	}
	sb.ID = newID()
	t0 := time.Now()
	if err := s.placer.Place(ctx, &sb, req, snapshotNode); err != nil {
		if snapshotNode != "" && errors.Is(err, errdefs.ErrUnavailable) {
			return api.Sandbox{}, snapshotUnplaceable(sb.FromSnapshot, snapshotNode, err)
		}
		return api.Sandbox{}, err
	}
	s.log.Debug("placed", "sandbox", sb.ID, "node", sb.Node, "op", "create", "ms", ms(t0))
	if sb.FromSnapshot == "" {
		s.pools.Count(sb.TemplateVersion) // the demand the warm pools follow
	}
	// As for a local create: once placed, finish whatever the client does.
	ctx = context.WithoutCancel(ctx)
	var out api.Sandbox
	var err error
	switch {
	case sb.Node == s.name:
		out, err = s.RunPlaced(ctx, sb.ID)
	case s.peers == nil:
		// The row waits for its node's sweep (placedTTL).
		err = fmt.Errorf("%w: sandbox placed on node %s, which this node cannot reach", errdefs.ErrUnavailable, sb.Node)
	default:
		out, err = s.peers.RunOn(ctx, sb.Node, sb.ID)
	}
	if err == nil && req.Explain && len(sb.Placement) > 0 {
		var p api.Placement
		if json.Unmarshal(sb.Placement, &p) == nil {
			p.Sandbox = out.ID // another, if a warm or prestarted sandbox served it
			out.Placement = &p
		}
	}
	return out, err
}

// errNotPlaced answers for the placement of a single machine's sandbox.
var errNotPlaced = fmt.Errorf("%w: this server is a single machine: its one node runs every sandbox, and nothing is placed", errdefs.ErrConflict)

// Placement returns the placement record of sandbox id: how the scheduler
// chose its node. On a single machine it is a conflict (nothing is
// placed); a sandbox the scheduler did not place (a fork: made on its
// parent's node) has none, not found.
func (s *Service) Placement(ctx context.Context, id string) (api.Placement, error) {
	sb, err := s.get(ctx, id)
	if err != nil {
		return api.Placement{}, err
	}
	if s.name == "" {
		return api.Placement{}, errNotPlaced
	}
	rec, err := s.store.Placement(ctx, id)
	if err != nil {
		return api.Placement{}, err
	}
	if rec == nil {
		return api.Placement{}, fmt.Errorf("%w: sandbox %s has no placement record: it was made on node %s (a fork), not placed by the scheduler", errdefs.ErrNotFound, id, sb.Node)
	}
	var p api.Placement
	if err := json.Unmarshal(rec, &p); err != nil {
		return api.Placement{}, fmt.Errorf("sandbox %s: reading its placement record: %w", id, err)
	}
	return p, nil
}

// RunPlaced runs sandbox id, placed on this node and recorded in state
// creating by a Placer (here or on another node), as Create runs one it
// recorded itself. A node's internal endpoint calls it for Peers.RunOn.
// Another node's sandbox, or one not creating, is a conflict; one the
// placed-row sweep discarded meanwhile is not found. A create refused for
// want of a turn (a Busy error) gives its placement back at once. A
// sandbox served warm or from a prestarted process is answered under that
// one's ID, the placed row gone.
func (s *Service) RunPlaced(ctx context.Context, id string) (api.Sandbox, error) {
	if err := checkID(id); err != nil {
		return api.Sandbox{}, err
	}
	if err := s.usable(); err != nil {
		return api.Sandbox{}, err
	}
	// The lock first: while the create waits for its turn, the row is
	// held, and the placed-row sweep leaves it alone.
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.Get(context.WithoutCancel(ctx), id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if sb.Node != s.name || sb.State != api.StateCreating {
		return api.Sandbox{}, fmt.Errorf("%w: sandbox %s is %s on node %q, not placed on this node", errdefs.ErrConflict, id, sb.State, sb.Node)
	}
	// A warm sandbox starts nothing: no turn to wait for.
	if out, ok := s.runWarm(context.WithoutCancel(ctx), sb); ok {
		s.log.Debug("created from the warm pool", "sandbox", out.ID, "placed", id, "op", "create")
		return out, nil
	}
	leave, err := s.admit.enter(ctx)
	if err != nil {
		// Give the capacity back now rather than at the sweep.
		s.discard(context.WithoutCancel(ctx), sb)
		return api.Sandbox{}, err
	}
	defer leave()
	ctx = context.WithoutCancel(ctx)
	t0 := time.Now()
	// The layers this node lacks come from the object store first; the
	// create's answer says how long that took.
	pull, err := s.pullFor(ctx, sb)
	if err != nil {
		s.discard(ctx, sb)
		return api.Sandbox{}, err
	}
	tmpl, err := s.tmpls.SandboxStack(ctx, sb)
	if err != nil {
		s.discard(ctx, sb)
		return api.Sandbox{}, err
	}
	// A create from a snapshot: from its files here, or, archived,
	// fetched from the object store first.
	var snap store.Snapshot
	if sb.FromSnapshot != "" {
		if snap, err = s.store.GetSnapshot(ctx, sb.FromSnapshot); err != nil {
			s.discard(ctx, sb)
			return api.Sandbox{}, err
		}
	}
	// A prestarted process saves the process start, as on one machine;
	// the sandbox is then its, under its ID.
	if unlockPre, ok := s.servePrestarted(ctx, &sb); ok {
		defer unlockPre()
		s.log.Debug("serving a placement from a prestarted sandbox", "sandbox", sb.ID, "placed", id, "op", "create")
	}
	snapPull, err := s.startCreated(ctx, &sb, tmpl, snap)
	if err != nil {
		return api.Sandbox{}, err
	}
	out := s.view(sb)
	out.SnapshotPull = snapPull
	if pull.Layers > 0 {
		out.TemplatePull = &api.TemplatePull{Layers: pull.Layers, Bytes: pull.Bytes, MS: float64(pull.Duration.Microseconds()) / 1000}
		s.log.Info("created after pulling the template's layers", "sandbox", sb.ID, "op", "create", "template", sb.Template,
			"layers", pull.Layers, "bytes", pull.Bytes, "pull_ms", out.TemplatePull.MS, "ms", ms(t0))
	} else {
		s.log.Debug("created", "sandbox", sb.ID, "op", "create", "ms", ms(t0))
	}
	return out, nil
}

// pullFor fetches the layers of sb's template version that this node
// lacks (templates.Service.Pull).
func (s *Service) pullFor(ctx context.Context, sb store.Sandbox) (templates.Pull, error) {
	if sb.TemplateVersion == "" {
		return templates.Pull{}, nil
	}
	v, err := s.store.TemplateVersion(ctx, sb.TemplateVersion)
	if err != nil {
		return templates.Pull{}, err
	}
	return s.tmpls.Pull(ctx, v)
}

// HeldTemplates are the template versions whose layers this node holds,
// for the heartbeat (store.NodeStatus.Templates).
func (s *Service) HeldTemplates() []string { return s.tmpls.Held() }

// sweepPlaced discards this node's rows left creating for longer than
// placedTTL on which no operation of this Service ever began. It is safe:
// every operation that records or takes a row in state creating here
// (Create, RunPlaced, a fork's children) locks it first, which leaves the
// row's entry in s.locks, and the sweep takes a row only by making that
// entry itself (lockUnseen), atomically. So a row it takes is one that
// nothing here has begun to run: a placement whose RunPlaced never came
// (the placing node died between Place and RunOn) or comes after the
// sweep and then finds it gone, or the half-made create of a process of
// this node that crashed. Only a cluster node sweeps: on a single machine
// creating rows are Recover's.
func (s *Service) sweepPlaced(ctx context.Context, sbs []store.Sandbox) {
	if s.name == "" {
		return
	}
	for _, sb := range sbs {
		if sb.State == api.StateCreating && time.Since(sb.CreatedAt) > placedTTL {
			s.discardPlaced(ctx, sb.ID)
		}
	}
}

// discardPlaced discards placed row id if it is still creating on this
// node, older than placedTTL, and no operation here ever began on it.
func (s *Service) discardPlaced(ctx context.Context, id string) {
	unlock, ok := s.lockUnseen(id)
	if !ok {
		return
	}
	defer unlock()
	cur, err := s.store.Get(ctx, id)
	if err != nil || cur.Node != s.name || cur.State != api.StateCreating || time.Since(cur.CreatedAt) < placedTTL {
		return
	}
	s.log.Info("discarding placed sandbox nobody ran", "sandbox", id, "node", s.name)
	s.discard(ctx, cur)
}

// lockUnseen locks sandbox id if this Service has never locked it.
func (s *Service) lockUnseen(id string) (unlock func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks[id] != nil {
		return nil, false
	}
	l := &sync.Mutex{}
	l.Lock()
	s.locks[id] = l
	return l.Unlock, true
}

// fencedWrite is what every store write of sandboxes goes through (states.go):
// an error other than store.ErrFenced is returned as it is. ErrFenced means
// the sandboxes of sbs are no longer this node's to run: their processes
// here are stopped (nothing is written: the store would refuse it), the
// sweeps leave them alone from now on, and the caller gets the error, an
// errdefs.ErrUnavailable, to return without retrying.
func (s *Service) fencedWrite(ctx context.Context, err error, sbs ...*store.Sandbox) error {
	if !store.IsFenced(err) {
		return err
	}
	for _, sb := range sbs {
		s.mu.Lock()
		already := s.fenced[sb.ID]
		s.fenced[sb.ID] = true
		s.mu.Unlock()
		if already {
			continue
		}
		s.log.Warn("the cluster refused a write; stopping the sandbox here", "sandbox", sb.ID, "node", s.name, "err", err)
		s.stopHere(ctx, *sb)
	}
	if len(sbs) == 1 {
		return fmt.Errorf("sandbox %s: %w", sbs[0].ID, err)
	}
	return err
}

// stopHere stops what of sb runs on this node and its network, without a
// write to the store. A copy of another node's row (a sandbox that moved)
// names nothing here.
func (s *Service) stopHere(ctx context.Context, sb store.Sandbox) {
	if sb.Node != s.name {
		return
	}
	if rt := s.runtimes[sb.Runtime]; rt != nil {
		if err := rt.Cleanup(ctx, sb.ID); err != nil {
			s.log.Error("stopping sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	// The network goes with it: the cluster runs the sandbox elsewhere,
	// if anywhere.
	s.releaseNetwork(ctx, sb)
}

// isFenced reports whether a write about sandbox id was refused as fenced.
func (s *Service) isFenced(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced[id]
}

// errRelinquished is what a Service that relinquished its sandboxes
// answers.
var errRelinquished = fmt.Errorf("%w: this node lost its cluster lease and no longer runs sandboxes", errdefs.ErrUnavailable)

// usable refuses work once the node relinquished its sandboxes.
func (s *Service) usable() error {
	if s.relinquished.Load() {
		return errRelinquished
	}
	return nil
}

// Relinquish stops every sandbox process of this node, without a write to
// the store, for the cluster layer to call when it learns this node was
// fenced: the cluster has recorded its sandboxes lost and restores them
// elsewhere, so nothing of them may go on running here. From then on the
// Service starts nothing, its sweeps and policies stop, and the creates it
// is asked for are refused as unavailable; the node joins again (a new
// epoch, a new Service whose Recover settles its rows) to serve again.
//
// It finds the sandboxes without the store, which a partitioned node may
// not reach: every writable layer on the node, the pools' sandboxes, every
// sandbox this Service has locked, and the node's rows if the store
// answers.
func (s *Service) Relinquish(ctx context.Context) error {
	s.relinquished.Store(true)
	ids := map[string]bool{}
	for _, id := range s.pools.Forget() {
		ids[id] = true
	}
	wids, werr := s.layers.WritableIDs()
	for _, id := range wids {
		ids[id] = true
	}
	s.mu.Lock()
	for id := range s.locks {
		ids[id] = true
	}
	s.mu.Unlock()
	if sbs, err := s.store.ListNode(ctx, s.name); err == nil {
		for _, sb := range sbs {
			ids[sb.ID] = true
		}
	}
	var errs []error
	if werr != nil {
		errs = append(errs, fmt.Errorf("listing writable layers: %w", werr))
	}
	for id := range ids {
		for _, rt := range s.runtimes {
			if err := rt.Cleanup(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("stopping sandbox %s: %w", id, err))
			}
		}
	}
	if s.net != nil {
		if err := s.net.Sweep(ctx, nil); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox networks: %w", err))
		}
	}
	s.log.Warn("relinquished every sandbox of the node", "node", s.name, "sandboxes", len(ids))
	return errors.Join(errs...)
}

// relinquishLost stops the local processes of this node's sandboxes the
// cluster recorded lost (api.StateLost) while this Service ran: the
// cluster restores them elsewhere. It writes nothing, and does it once per
// sandbox; every other policy and sweep leaves lost sandboxes alone.
func (s *Service) relinquishLost(ctx context.Context, sbs []store.Sandbox) {
	for _, sb := range sbs {
		if sb.State != api.StateLost || s.isFenced(sb.ID) {
			continue
		}
		s.mu.Lock()
		s.fenced[sb.ID] = true
		s.mu.Unlock()
		s.log.Warn("sandbox recorded lost; stopping it here", "sandbox", sb.ID, "node", s.name)
		unlock := s.lock(sb.ID)
		s.stopHere(ctx, sb)
		unlock()
	}
}
