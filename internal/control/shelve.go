package control

import (
	"context"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
)

// Shelve pauses a running or paused sandbox without its memory (E2B's
// pause with keepMemory false): its processes end, its files stay, and
// resume boots it again over them. Unlike a stop, a shelved sandbox is
// paused: its timeout is gone, no stopped-sandbox policy (ephemeral,
// auto-delete, auto-archive) applies to it, and resume brings it back.
func (s *Service) Shelve(ctx context.Context, id string) (api.Sandbox, error) {
	return s.locked(ctx, id, "shelve", s.shelveLocked)
}

// shelveLocked ends running or paused sb's processes and records it
// shelved. The caller holds its lock.
func (s *Service) shelveLocked(ctx context.Context, sb *store.Sandbox) error {
	from := sb.State
	// The record first: a crash before the processes end leaves a shelved
	// record over a live sandbox, which recovery cleans up as it does a
	// stopped one's leftovers, and the sandbox stays shelved (not stopping,
	// which recovery would finish as stopped and an ephemeral sandbox's
	// policy would then delete).
	sb.State, sb.ExpiresAt = api.StateShelved, nil
	if err := s.setState(ctx, sb, from); err != nil {
		return err
	}
	if err := s.endLocked(ctx, sb, "shelving"); err != nil {
		return err
	}
	sb.PID, sb.StartTime, sb.Socket = 0, 0, ""
	return s.setState(ctx, sb, api.StateShelved)
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
