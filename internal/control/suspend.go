package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
)

// A suspended sandbox is paused to disk: its runtime (a Checkpointer) saved
// its memory and processes into checkpointDir(id) and stopped it, so it
// holds no memory, CPU or network. Resume restores it over the same files,
// its processes going on where they were, also after a daemon or host
// restart. The image is complete once its marker file is written, before
// the state says suspended; a crash during suspend is settled at start-up
// by the marker, and one during resume by restoring again from the image,
// which is removed only after the record says running.

// completeMarker is written, and synced, once an image is whole.
const completeMarker = "atoll-complete"

func (s *Service) checkpointDir(id string) string { return filepath.Join(s.checkpoints, id) }

func (s *Service) checkpointComplete(id string) bool {
	_, err := os.Stat(filepath.Join(s.checkpointDir(id), completeMarker))
	return err == nil
}

// checkpointer is sb's runtime as a Checkpointer, or an error saying that
// it cannot save memory.
func (s *Service) checkpointer(sb store.Sandbox) (runtime.Checkpointer, error) {
	rt := s.runtimes[sb.Runtime]
	cp, ok := rt.(runtime.Checkpointer)
	if !ok || !runtime.CapsOf(rt).MemorySnapshot || s.checkpoints == "" {
		return nil, fmt.Errorf("%w: runtime %s cannot save a sandbox's memory to disk (capability memory_snapshot); pause it in memory or stop it",
			errdefs.ErrInvalid, sb.Runtime)
	}
	return cp, nil
}

// Suspend pauses a running sandbox to disk.
func (s *Service) Suspend(ctx context.Context, id string) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, api.StateRunning)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	cp, err := s.checkpointer(sb)
	if err != nil {
		return api.Sandbox{}, err
	}
	t0 := time.Now()
	dir := s.checkpointDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return api.Sandbox{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return api.Sandbox{}, err
	}
	sb.State = api.StateSuspending
	if err := s.store.Update(ctx, &sb, api.StateRunning); err != nil {
		return api.Sandbox{}, err
	}
	err = cp.Checkpoint(ctx, id, instance(sb), dir)
	if err == nil {
		err = writeMarker(dir)
	}
	if err != nil {
		s.log.Error("checkpointing sandbox", "sandbox", id, "err", err)
		_ = os.RemoveAll(dir)
		if s.runtimes[sb.Runtime].Alive(instance(sb)) {
			sb.State = api.StateRunning
			_ = s.store.Update(ctx, &sb, api.StateSuspending)
			return api.Sandbox{}, fmt.Errorf("%w: saving the sandbox's memory failed; it runs on", errdefs.ErrUnavailable)
		}
		_ = s.stopLocked(ctx, &sb, "saving its memory to disk failed")
		return api.Sandbox{}, fmt.Errorf("%w: saving the sandbox's memory failed; it is stopped, its files kept", errdefs.ErrUnavailable)
	}
	s.settleSuspended(ctx, &sb)
	if err := s.store.Update(ctx, &sb, api.StateSuspending); err != nil {
		return api.Sandbox{}, err
	}
	s.log.Debug("suspended", "sandbox", id, "op", "suspend", "ms", ms(t0))
	return s.view(sb), nil
}

// settleSuspended releases what a suspended sb no longer holds and sets
// its fields; the caller records it.
func (s *Service) settleSuspended(ctx context.Context, sb *store.Sandbox) {
	s.releaseNetwork(ctx, *sb)
	sb.State, sb.Error = api.StateSuspended, ""
	sb.PID, sb.StartTime, sb.Socket = 0, 0, ""
	// Like a paused sandbox it has no timeout: resume sets a new one.
	sb.ExpiresAt = nil
}

// restoreLocked resumes suspended sb from its image. The caller holds its
// lock.
func (s *Service) restoreLocked(ctx context.Context, sb *store.Sandbox) error {
	cp, err := s.checkpointer(*sb)
	if err != nil {
		return err
	}
	if !s.checkpointComplete(sb.ID) {
		return fmt.Errorf("%w: sandbox %s has no memory image to resume from", errdefs.ErrConflict, sb.ID)
	}
	tmpl, err := s.template(ctx, sb.Template)
	if err != nil {
		return err
	}
	t0 := time.Now()
	netw, err := s.attachNetwork(ctx, *sb)
	if err != nil {
		s.log.Error("attaching network", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: giving the sandbox its network failed", errdefs.ErrUnavailable)
	}
	spec, err := s.spec(*sb, tmpl, netw, 0)
	if err == nil {
		var inst runtime.Instance
		if inst, err = cp.Restore(ctx, spec, s.checkpointDir(sb.ID)); err == nil {
			sb.PID, sb.StartTime, sb.Socket = inst.PID, inst.StartTime, inst.Socket
		}
	}
	if err != nil {
		s.log.Error("restoring sandbox", "sandbox", sb.ID, "err", err)
		_ = s.runtimes[sb.Runtime].Cleanup(ctx, sb.ID)
		s.releaseNetwork(ctx, *sb)
		return fmt.Errorf("%w: restoring the sandbox from its memory image failed; it stays suspended", errdefs.ErrUnavailable)
	}
	sb.State = api.StateRunning
	s.setTimeout(sb, time.Now().UTC())
	s.touch(sb.ID)
	if err := s.store.Update(ctx, sb, api.StateSuspended); err != nil {
		_ = s.runtimes[sb.Runtime].Stop(ctx, sb.ID, instance(*sb))
		s.releaseNetwork(ctx, *sb)
		return err
	}
	if err := os.RemoveAll(s.checkpointDir(sb.ID)); err != nil {
		s.log.Error("removing memory image", "sandbox", sb.ID, "err", err)
	}
	s.log.Debug("restored", "sandbox", sb.ID, "op", "restore", "ms", ms(t0))
	return nil
}

// recoverSuspend settles sb, found suspending or suspended at start-up.
func (s *Service) recoverSuspend(ctx context.Context, sb store.Sandbox, rt runtime.Runtime) {
	switch {
	case sb.State == api.StateSuspending && rt.Alive(instance(sb)):
		// The checkpoint had not stopped it.
		_ = os.RemoveAll(s.checkpointDir(sb.ID))
		sb.State = api.StateRunning
		_ = s.store.Update(ctx, &sb, api.StateSuspending)
	case !s.checkpointComplete(sb.ID):
		s.log.Warn("memory image of a suspended sandbox is incomplete; stopping it", "sandbox", sb.ID)
		_ = os.RemoveAll(s.checkpointDir(sb.ID))
		_ = rt.Cleanup(ctx, sb.ID)
		_ = s.stopLocked(ctx, &sb, "its memory image was not saved whole")
	default:
		// A restore that the crash cut short may have left it running
		// unrecorded: it restores again from the image.
		_ = rt.Cleanup(ctx, sb.ID)
		if sb.State == api.StateSuspending {
			s.settleSuspended(ctx, &sb)
			_ = s.store.Update(ctx, &sb, api.StateSuspending)
		}
	}
}

// discardImage drops sb's memory image, if any, for a stop or delete.
func (s *Service) discardImage(sb store.Sandbox) error {
	if s.checkpoints == "" {
		return nil
	}
	if err := os.RemoveAll(s.checkpointDir(sb.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing memory image: %w", err)
	}
	return nil
}

// writeMarker syncs the image's files, then writes the marker and syncs
// it and the directory.
func writeMarker(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		return syncFile(p, os.O_RDONLY)
	})
	if err != nil {
		return fmt.Errorf("syncing memory image: %w", err)
	}
	if err := syncFile(filepath.Join(dir, completeMarker), os.O_CREATE|os.O_WRONLY); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncFile opens path with flag and syncs it.
func syncFile(path string, flag int) error {
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
