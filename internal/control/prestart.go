package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
)

// Prestarted sandboxes are sandbox processes started ahead of demand
// (runtime.Preparer) and not yet bound to a template or files: namespaces,
// cgroup and a started agent process waiting for its root. A create that the
// warm pool cannot serve, a fork child and a create from a snapshot each take
// one and get its ID and uid range, which saves the process start, about two
// thirds of a cold start. They are store rows in a state the API never shows,
// so that their slots stay reserved; their processes die with the server, and
// a restart discards the rows.
const statePrestarted = lifecycle.Prestarted

// Prestart starts a sandbox process of the default runtime, not yet bound
// to files, for the pools to hand out.
func (s *Service) Prestart(ctx context.Context) (store.Sandbox, error) {
	if err := s.usable(); err != nil {
		return store.Sandbox{}, err
	}
	rt, ok := s.runtimes[s.defaults.Runtime].(runtime.Preparer)
	if !ok {
		return store.Sandbox{}, fmt.Errorf("%w: runtime %s cannot prestart sandboxes", errdefs.ErrUnavailable, s.defaults.Runtime)
	}
	return s.createPrestarted(ctx, rt)
}

func (s *Service) createPrestarted(ctx context.Context, rt runtime.Preparer) (store.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	d := s.defaults
	sb := store.Sandbox{Sandbox: api.Sandbox{
		ID: newID(), State: statePrestarted, Runtime: d.Runtime,
		CPU: d.CPU, MemoryMiB: d.MemoryMiB, DiskGiB: d.DiskGiB, PIDs: d.PIDs, CreatedAt: time.Now().UTC(),
	}}
	unlock := s.lock(sb.ID)
	defer unlock()
	if err := s.record(ctx, &sb); err != nil {
		return sb, err
	}
	spec := runtime.Spec{
		ID:     sb.ID,
		Limits: runtime.Limits{CPU: sb.CPU, MemoryBytes: sb.MemoryMiB << 20, PIDs: sb.PIDs, CPUWeight: poolWeight},
		IDMap:  idMap(sb.Slot), AgentPath: s.agentPath,
	}
	// Its process is born in the network its slot will have: denying all
	// until a sandbox takes it and its policy is set.
	if s.net != nil {
		att, err := s.attach(ctx, sb.Slot, egress.Policy{DenyByDefault: true})
		if err != nil {
			s.discard(ctx, sb)
			return sb, err
		}
		spec.Network = runtimeNetwork(att)
	}
	if err := rt.Prepare(ctx, spec); err != nil {
		s.discard(ctx, sb)
		return sb, err
	}
	return sb, nil
}

// newSandbox records sb, in the state it carries, under the ID and slot of a
// prestarted sandbox of its runtime if there is one, otherwise under a new
// ID. It returns with sb locked.
func (s *Service) newSandbox(ctx context.Context, sb *store.Sandbox) (unlock func(), err error) {
	for {
		taken := s.pools.TakePrestarted(sb.Runtime)
		if len(taken) == 0 {
			break
		}
		pre := taken[0]
		sb.ID, sb.Slot = pre.ID, pre.Slot
		unlock := s.lock(sb.ID)
		err := s.setState(ctx, sb, statePrestarted)
		if err == nil {
			return unlock, nil
		}
		unlock()
		if !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrNotFound) {
			// Taken out of the pool, it would be no one's: a tenant
			// over its quota (or a store that failed) leaves it to
			// be discarded, and the pool makes another.
			s.DiscardIf(ctx, pre.ID, statePrestarted)
			return nil, err
		}
	}
	sb.ID = newID()
	unlock = s.lock(sb.ID)
	if err := s.record(ctx, sb); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// newSandboxes records sbs as newSandbox does, those that take prestarted
// sandboxes in one transaction.
func (s *Service) newSandboxes(ctx context.Context, sbs []store.Sandbox) error {
	runtimes := make([]string, len(sbs))
	for i, sb := range sbs {
		runtimes[i] = sb.Runtime
	}
	pre := s.pools.TakePrestarted(runtimes...)
	n := len(pre)
	if n > 0 {
		adopt := make([]*store.Sandbox, n)
		for i := range pre {
			sbs[i].ID, sbs[i].Slot = pre[i].ID, pre[i].Slot
			adopt[i] = &sbs[i]
		}
		if err := s.setStates(ctx, adopt, statePrestarted); err != nil {
			// One went meanwhile: give up these and record anew.
			for i := range pre {
				s.DiscardIf(ctx, pre[i].ID, statePrestarted)
				sbs[i].ID = ""
			}
			n = 0
		}
	}
	for i := n; i < len(sbs); i++ {
		unlock, err := s.newSandbox(ctx, &sbs[i])
		if err != nil {
			for _, sb := range sbs[:i] {
				s.discard(ctx, sb)
			}
			return err
		}
		unlock()
	}
	return nil
}

// idMap is the host uid range of the sandbox in slot.
func idMap(slot int) runtime.IDMap {
	return runtime.IDMap{HostID: uint32(uidBase + slot*uidRange), Size: uidRange}
}

// servePrestarted has placed row sb, which the caller holds locked, served
// by a prestarted sandbox of its runtime if this node has one, as a warm
// sandbox serves a warm placement (runWarm): sb takes the prestarted
// sandbox's ID and slot, the placed row goes in the same write, and its
// placement record moves to sb. sb cannot keep the placed ID: the process
// is the runtime's under its own ID, and its uid range and network are
// those of its slot. It returns the unlock of sb's new ID; on any failure
// sb is left as it was, placed, to start cold.
func (s *Service) servePrestarted(ctx context.Context, sb *store.Sandbox) (unlock func(), ok bool) {
	taken := s.pools.TakePrestarted(sb.Runtime)
	if len(taken) == 0 {
		return nil, false
	}
	pre := taken[0]
	rec, err := s.store.Placement(ctx, sb.ID)
	if err != nil {
		s.DiscardIf(ctx, pre.ID, statePrestarted)
		return nil, false
	}
	placed := *sb
	sb.ID, sb.Slot, sb.Placement = pre.ID, pre.Slot, recordFor(rec, pre.ID)
	unlock = s.lock(sb.ID)
	if err := s.serveState(ctx, sb, placed.ID, statePrestarted); err != nil {
		// Taken out of the pool, it would be no one's (a tenant at its
		// quota counts the placed row and this one in that write): it
		// is discarded, the pool makes another, and the create starts
		// cold.
		unlock()
		s.log.Warn("serving a placement from a prestarted sandbox", "sandbox", pre.ID, "placed", placed.ID, "err", err)
		s.DiscardIf(ctx, pre.ID, statePrestarted)
		*sb = placed
		return nil, false
	}
	return unlock, true
}
