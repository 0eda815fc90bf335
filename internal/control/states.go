package control

import (
	"context"

	"github.com/atoll-dev/atoll/api"

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
	return s.fencedWrite(ctx, s.store.Update(ctx, sb, from...), sb)
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
	return s.fencedWrite(ctx, ws.ServeWarm(ctx, placed, sb, from...), sb)
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
	return s.fencedWrite(ctx, s.store.UpdateAll(ctx, sbs, from...), sbs...)
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
	return s.store.Create(ctx, sb)
}

// removeRecord removes sandbox id's record; the store records its move to
// deleted. It reads the stored state rather than trusting a caller's copy:
// a failed create's discard holds the copy it started from.
func (s *Service) removeRecord(ctx context.Context, id string) error {
	cur, err := s.store.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := lifecycle.Check(cur.State, api.StateDeleted); err != nil {
		return err
	}
	return s.fencedWrite(ctx, s.store.Delete(ctx, id), &cur)
}

// hidden reports whether sb is one the API must not show.
func hidden(sb store.Sandbox) bool { return !lifecycle.Visible(sb.State) }
