package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/atomicfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
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
	return s.locked(ctx, id, "suspend", s.suspendLocked)
}

// suspendLocked pauses running sb to disk and records it suspended. The
// caller holds its lock.
func (s *Service) suspendLocked(ctx context.Context, sb *store.Sandbox) error {
	cp, err := s.checkpointer(*sb)
	if err != nil {
		return err
	}
	t0 := time.Now()
	id := sb.ID
	dir := s.checkpointDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	sb.State = api.StateSuspending
	if err := s.setState(ctx, sb, api.StateRunning); err != nil {
		return err
	}
	s.finalUsage(ctx, *sb)
	err = cp.Checkpoint(ctx, id, instance(*sb), dir)
	if err == nil {
		err = writeMarker(dir)
	}
	if err != nil {
		s.log.Error("checkpointing sandbox", "sandbox", id, "err", err)
		_ = os.RemoveAll(dir)
		if s.runtimes[sb.Runtime].Alive(instance(*sb)) {
			sb.State = api.StateRunning
			_ = s.setState(ctx, sb, api.StateSuspending)
			return fmt.Errorf("%w: saving the sandbox's memory failed; it runs on", errdefs.ErrUnavailable)
		}
		_ = s.stopLocked(ctx, sb, "saving its memory to disk failed")
		return fmt.Errorf("%w: saving the sandbox's memory failed; it is stopped, its files kept", errdefs.ErrUnavailable)
	}
	s.settleSuspended(ctx, sb)
	if err := s.setState(ctx, sb, api.StateSuspending); err != nil {
		return err
	}
	s.log.Debug("suspended", "sandbox", id, "op", "suspend", "ms", ms(t0))
	return nil
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
	tmpl, err := s.tmpls.SandboxStack(ctx, *sb)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := s.restoreFrom(ctx, cp, sb, tmpl, s.checkpointDir(sb.ID)); err != nil {
		return fmt.Errorf("%w; it stays suspended", err)
	}
	if err := s.setState(ctx, sb, api.StateSuspended); err != nil {
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

// restoreFrom starts sb from the memory image in dir, over its files, and
// sets its fields for running without recording them.
func (s *Service) restoreFrom(ctx context.Context, cp runtime.Checkpointer, sb *store.Sandbox, tmpl layers.Template, dir string) error {
	netw, err := s.attachNetwork(ctx, *sb)
	if err != nil {
		s.log.Error("attaching network", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: giving the sandbox its network failed", errdefs.ErrUnavailable)
	}
	spec, err := s.spec(ctx, *sb, tmpl, netw, 0)
	if err == nil {
		var inst runtime.Instance
		if inst, err = cp.Restore(ctx, spec, dir); err == nil {
			sb.PID, sb.StartTime, sb.Socket = inst.PID, inst.StartTime, inst.Socket
		}
	}
	if err != nil {
		s.log.Error("restoring sandbox", "sandbox", sb.ID, "err", err)
		_ = s.runtimes[sb.Runtime].Cleanup(ctx, sb.ID)
		s.releaseNetwork(ctx, *sb)
		return fmt.Errorf("%w: restoring the sandbox from its memory image failed", errdefs.ErrUnavailable)
	}
	now := time.Now().UTC()
	sb.State, sb.Error = api.StateRunning, ""
	if sb.StartedAt == nil {
		sb.StartedAt = &now
	}
	s.setTimeout(sb, now)
	s.touch(sb.ID)
	return nil
}

// A fork with memory pauses the parent to disk, links its image aside for
// the children, copies its files to theirs while nothing runs, and brings
// the parent back; each child is then restored from the image over its own
// files. The parent is suspended, with its image complete, from the moment
// its processes stop until they go on, so a crash in between loses
// nothing of it.

// forkImageSuffix names a fork's image beside its parent's.
const forkImageSuffix = ".fork"

// memoryForkable checks that parent's children can start from its memory.
func (s *Service) memoryForkable(parent store.Sandbox) (runtime.Checkpointer, error) {
	rt := s.runtimes[parent.Runtime]
	if !runtime.CapsOf(rt).MemoryFork {
		return nil, fmt.Errorf("%w: runtime %s cannot start a fork's children from its memory (capability memory_fork); fork without memory", errdefs.ErrInvalid, parent.Runtime)
	}
	cp, err := s.checkpointer(parent)
	if err != nil {
		return nil, err
	}
	if parent.State != api.StateRunning {
		return nil, fmt.Errorf("%w: sandbox %s is %s; a fork with memory needs it running", errdefs.ErrConflict, parent.ID, parent.State)
	}
	return cp, nil
}

// captureForFork saves parent's memory for children, gives them copies of
// its files and restores it; it returns the image the children restore
// from. The caller holds parent's lock.
func (s *Service) captureForFork(ctx context.Context, parent *store.Sandbox, children []store.Sandbox) (string, error) {
	if err := s.suspendLocked(ctx, parent); err != nil {
		return "", err
	}
	image := s.checkpointDir(parent.ID) + forkImageSuffix
	err := linkImage(s.checkpointDir(parent.ID), image)
	for i := 0; err == nil && i < len(children); i++ {
		_, err = s.layers.ForkWritable(parent.ID, children[i].ID, children[i].DiskGiB<<30)
	}
	// The parent goes on, whatever became of its children.
	if rerr := s.restoreLocked(ctx, parent); rerr != nil {
		s.log.Error("restoring a fork's parent", "sandbox", parent.ID, "err", rerr)
		if err == nil {
			err = fmt.Errorf("%w (the parent %s stays suspended; resume it)", rerr, parent.ID)
		}
	}
	if err != nil {
		_ = os.RemoveAll(image)
		return "", err
	}
	return image, nil
}

// linkImage hard-links the files of image dir from into a new dir to.
func linkImage(from, to string) error {
	if err := os.RemoveAll(to); err != nil {
		return err
	}
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := os.Link(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return fmt.Errorf("linking memory image: %w", err)
			}
		}
	}
	return nil
}

// removeForkImages removes the images of forks a crash cut short; their
// children, never recorded running, are discarded.
func (s *Service) removeForkImages() {
	if s.checkpoints == "" {
		return
	}
	m, _ := filepath.Glob(filepath.Join(s.checkpoints, "*"+forkImageSuffix))
	for _, p := range m {
		_ = os.RemoveAll(p)
	}
}

// recoverSuspend settles sb, found suspending or suspended at start-up. A
// suspend that the crash cut short was never acknowledged: the sandbox goes
// back to running if it can, from the image the checkpoint may have
// finished without the node.
func (s *Service) recoverSuspend(ctx context.Context, sb store.Sandbox, rt runtime.Runtime) {
	if sb.State == api.StateSuspending && rt.Alive(instance(sb)) {
		// The checkpoint had not stopped it; its agent may be waiting to
		// listen again.
		var err error
		if st, ok := rt.(runtime.CheckpointSettler); ok {
			err = st.Settle(ctx, sb.ID, instance(sb))
		}
		if err == nil {
			_ = os.RemoveAll(s.checkpointDir(sb.ID))
			sb.State = api.StateRunning
			_ = s.setState(ctx, &sb, api.StateSuspending)
			return
		}
		s.log.Error("settling a sandbox whose suspend was cut short", "sandbox", sb.ID, "err", err)
		if rt.Alive(instance(sb)) {
			_ = os.RemoveAll(s.checkpointDir(sb.ID))
			_ = s.stopLocked(ctx, &sb, "its suspend was cut short and its agent did not answer again")
			return
		}
		// A checkpoint still under way ended the sandbox once its image
		// was written: restored from it below.
	}
	_ = rt.Cleanup(ctx, sb.ID)
	if sb.State == api.StateSuspended {
		// A restore that the crash cut short may have left it running
		// unrecorded (Cleanup ended that): it restores again from the
		// image, which goes only once the record says running.
		return
	}
	// Suspending and gone: the image may be whole all the same, if the
	// runtime finished saving it after the node died.
	s.waitImageWritten(sb.ID)
	if cp, err := s.checkpointer(sb); err == nil {
		if tmpl, err := s.tmpls.SandboxStack(ctx, sb); err == nil {
			if err := s.restoreFrom(ctx, cp, &sb, tmpl, s.checkpointDir(sb.ID)); err == nil {
				if err := s.setState(ctx, &sb, api.StateSuspending); err == nil {
					s.log.Info("restored a sandbox whose suspend was cut short", "sandbox", sb.ID)
					_ = os.RemoveAll(s.checkpointDir(sb.ID))
					return
				}
				_ = rt.Stop(ctx, sb.ID, instance(sb))
			}
		}
	}
	s.log.Warn("memory image of a sandbox whose suspend was cut short is not whole; stopping it", "sandbox", sb.ID)
	_ = os.RemoveAll(s.checkpointDir(sb.ID))
	_ = s.stopLocked(ctx, &sb, "its memory image was not saved whole")
}

// waitImageWritten waits, a minute at most, until no process holds a file
// of id's image open: a checkpoint that outlived the node finishes writing.
func (s *Service) waitImageWritten(id string) {
	dir := s.checkpointDir(id) + "/"
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !openedUnder(dir) {
			return
		}
	}
}

// openedUnder reports whether a process has a file under dir open.
func openedUnder(dir string) bool {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if p, err := os.Readlink(fd); err == nil && strings.HasPrefix(p, dir) {
			return true
		}
	}
	return false
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
	return atomicfile.SyncDir(dir)
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
