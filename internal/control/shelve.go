package control

import (
	"context"
	"fmt"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Shelve pauses a running or paused sandbox without its memory (E2B's
// pause with keepMemory false): its processes end, its files stay, and
// resume boots it again over them. Unlike a stop, a shelved sandbox is
// paused: its timeout is gone, no stopped-sandbox policy (ephemeral,
// auto-delete, auto-archive) applies to it, and resume brings it back.
func (s *Service) Shelve(ctx context.Context, id string) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "shelve")
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	from := sb.State
	// The record first: a crash before the processes end leaves a shelved
	// record over a live sandbox, which recovery cleans up as it does a
	// stopped one's leftovers, and the sandbox stays shelved (not stopping,
	// which recovery would finish as stopped and an ephemeral sandbox's
	// policy would then delete).
	sb.State, sb.ExpiresAt = api.StateShelved, nil
	if err := s.setState(ctx, &sb, from); err != nil {
		return api.Sandbox{}, err
	}
	if err := s.runtimes[sb.Runtime].Stop(ctx, sb.ID, instance(sb)); err != nil {
		s.log.Error("shelving sandbox", "sandbox", sb.ID, "err", err)
		sb.State, sb.Error = api.StateError, "shelving failed; delete it"
		_ = s.setState(ctx, &sb, api.StateShelved)
		return api.Sandbox{}, fmt.Errorf("%w: shelving sandbox failed", errdefs.ErrUnavailable)
	}
	s.releaseNetwork(ctx, sb)
	sb.PID, sb.StartTime, sb.Socket = 0, 0, ""
	if err := s.setState(ctx, &sb, api.StateShelved); err != nil {
		return api.Sandbox{}, err
	}
	return s.view(sb), nil
}

// bootShelvedLocked starts shelved sb again over its files. The record
// says shelved until the sandbox runs, so a failure or a crash in between
// leaves it shelved, resumable again.
func (s *Service) bootShelvedLocked(ctx context.Context, sb *store.Sandbox) error {
	tmpl, err := s.tmpls.SandboxStack(ctx, *sb)
	if err != nil {
		return err
	}
	if err := s.startLocked(ctx, sb, tmpl, api.StateShelved, api.StateRunning, 0); err != nil {
		_ = s.runtimes[sb.Runtime].Cleanup(ctx, sb.ID)
		return err
	}
	return nil
}
