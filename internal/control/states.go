package control

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/atoll-dev/atoll/api"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
)

// The sandbox's states and transitions are internal/lifecycle's tables; the
// functions here are the only ones that write a sandbox's record, so every
// change of state is checked against them before the store records it.
// (TestStateWritesGoThroughTheTable holds the rest of the package to that.)

// setState records sb, whose State is the state it moves to, if its
// stored state is one of from. A move the table does not allow is refused
// with a conflict naming both states, and nothing is written.
func (s *Service) setState(ctx context.Context, sb *store.Sandbox, from ...string) error {
	for _, f := range from {
		if err := lifecycle.Check(f, sb.State); err != nil {
			return err
		}
	}
	err := s.quotaHit(ctx, s.fencedWrite(ctx, s.store.Update(ctx, sb, from...), sb))
	if err == nil {
		s.announce([]*store.Sandbox{sb}, "", from...)
	}
	return err
}

// warmServer is a cluster store that records a pooled sandbox serving a
// warm placement, and removes the placed row, in one transaction
// (postgres.Store.ServeWarm).
type warmServer interface {
	ServeWarm(ctx context.Context, placed string, sb *store.Sandbox, from ...string) error
}

// serveState is setState for pooled sandbox sb serving placed row placed,
// which goes: in one write where the store can (warmServer), else one
// after the other.
func (s *Service) serveState(ctx context.Context, sb *store.Sandbox, placed string, from ...string) error {
	ws, ok := s.store.(warmServer)
	if !ok {
		if err := s.setState(ctx, sb, from...); err != nil {
			return err
		}
		if err := s.removeRecord(ctx, placed); err != nil {
			// Its reservation lapses with it at the placed-row sweep.
			s.log.Warn("removing a placed row served warm", "sandbox", placed, "err", err)
		}
		return nil
	}
	for _, f := range from {
		if err := lifecycle.Check(f, sb.State); err != nil {
			return err
		}
	}
	err := s.quotaHit(ctx, s.fencedWrite(ctx, ws.ServeWarm(ctx, placed, sb, from...), sb))
	if err == nil {
		s.announce([]*store.Sandbox{sb}, "", from...)
	}
	return err
}

// setStates is setState for every sandbox of sbs, in one transaction.
func (s *Service) setStates(ctx context.Context, sbs []*store.Sandbox, from ...string) error {
	for _, sb := range sbs {
		for _, f := range from {
			if err := lifecycle.Check(f, sb.State); err != nil {
				return err
			}
		}
	}
	err := s.quotaHit(ctx, s.fencedWrite(ctx, s.store.UpdateAll(ctx, sbs, from...), sbs...))
	if err == nil {
		s.announce(sbs, "", from...)
	}
	return err
}

// record makes sb's record, in the state it carries, on this node: the
// rows a node makes itself (not placed ones) are its own.
func (s *Service) record(ctx context.Context, sb *store.Sandbox) error {
	if err := lifecycle.Check("", sb.State); err != nil {
		return err
	}
	sb.Node = s.name
	// Nothing of sb runs yet: a refusal (store.ErrFenced, unavailable)
	// only goes back to the caller.
	err := s.quotaHit(ctx, s.store.Create(ctx, sb))
	if err == nil {
		s.announce([]*store.Sandbox{sb}, "")
	}
	return err
}

// removeRecord removes sandbox id's record; the store records its move to
// deleted. The store checks the stored state, not a caller's copy (a
// failed create's discard holds the copy it started from), in the same
// write, and hands back the row it removed for the announcement.
func (s *Service) removeRecord(ctx context.Context, id string) error {
	cur, err := s.store.Delete(ctx, id, lifecycle.Sources(api.StateDeleted)...)
	switch {
	case errors.Is(err, errdefs.ErrConflict) && cur.ID != "":
		return lifecycle.Check(cur.State, api.StateDeleted)
	case store.IsFenced(err) && cur.ID == "":
		// Refused before the row was read: the fence's stop needs it.
		if got, gerr := s.store.Get(ctx, id); gerr == nil {
			cur = got
		}
	}
	if err = s.fencedWrite(ctx, err, &cur); err == nil {
		s.announce([]*store.Sandbox{&cur}, api.StateDeleted, cur.State)
	}
	return err
}

// hidden reports whether sb is one the API must not show.
func hidden(sb store.Sandbox) bool { return !lifecycle.Visible(sb.State) }

// An opening is the states of a sandbox an operation acts on; acquire
// refuses one in any other state with a conflict.
type opening struct {
	// in lists the states it acts on; nil: every state but those of out.
	in, out []string
	// why follows "sandbox <id> is <state>" in the refusal.
	why string
}

// opens holds, per operation that acts on one sandbox, the states it acts
// on. An operation not listed acts on a sandbox in any state (and sees
// for itself what to do with it).
var opens = map[string]opening{
	"pause":    {in: []string{api.StateRunning}, why: ", not running"},
	"suspend":  {in: []string{api.StateRunning}, why: ", not running"},
	"archive":  {in: []string{api.StateStopped}, why: ", not stopped"},
	"shelve":   {in: []string{api.StateRunning, api.StatePaused}, why: ", not running or paused"},
	"stop":     {in: []string{api.StateRunning, api.StatePaused, api.StateSuspended, api.StateShelved}, why: ", not running"},
	"start":    {in: []string{api.StateArchived, api.StateStopped}, why: ", not stopped"},
	"resume":   {in: keys(resumes), why: ", not paused"},
	"timeout":  {in: liveStates(), why: "; a timeout applies to running sandboxes"},
	"snapshot": {in: []string{api.StateRunning, api.StatePaused, api.StateStopped, api.StateSuspended, api.StateShelved}},
	"restore":  {in: []string{api.StateRunning, api.StatePaused, api.StateSuspended, api.StateStopped}},
	"move":     {in: keys(drainStates)},
	"ports":    {out: []string{api.StateCreating, api.StateDeleting}, why: "; try again"},
	"network": {out: []string{api.StateCreating, api.StateStarting, api.StateStopping, api.StateDeleting, api.StateArchiving, api.StateSuspending},
		why: "; try again"},
}

func keys[V any](m map[string]V) []string { return slices.Collect(maps.Keys(m)) }

// liveStates are the states lifecycle calls live.
func liveStates() []string {
	var out []string
	for _, st := range lifecycle.States {
		if st.Live {
			out = append(out, st.Name)
		}
	}
	return out
}

// refuses returns the conflict operation op answers sb with, nil if op
// acts on it in its state.
func refuses(op string, sb store.Sandbox) error {
	o, ok := opens[op]
	if !ok || o.in != nil && slices.Contains(o.in, sb.State) || o.in == nil && !slices.Contains(o.out, sb.State) {
		return nil
	}
	return fmt.Errorf("%w: sandbox %s is %s%s", errdefs.ErrConflict, sb.ID, sb.State, o.why)
}

// acquire opens operation op on sandbox id: it locks the sandbox, reads
// it as the tenant of ctx may see it, and checks that it runs here and is
// in a state op acts on (opens). The caller must call unlock.
func (s *Service) acquire(ctx context.Context, id, op string) (sb store.Sandbox, unlock func(), err error) {
	if err := checkID(id); err != nil {
		return sb, nil, err
	}
	unlock = s.lock(id)
	sb, err = s.get(ctx, id)
	if err == nil {
		err = s.here(sb)
	}
	if err == nil {
		err = refuses(op, sb)
	}
	if err != nil {
		unlock()
		return sb, nil, err
	}
	return sb, unlock, nil
}

// locked runs op's step f on sandbox id under its lock (acquire), through
// to its end even if the client gives up (a half-done step is worse than
// an unused one), and returns the sandbox as f leaves it.
func (s *Service) locked(ctx context.Context, id, op string, f func(context.Context, *store.Sandbox) error) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, op)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	if err := f(ctx, &sb); err != nil {
		return api.Sandbox{}, err
	}
	return s.view(sb), nil
}
