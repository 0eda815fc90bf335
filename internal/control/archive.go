package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Archiving moves a stopped sandbox's files to object storage and frees its
// local disk; starting it brings them back. The object is written whole
// before the local copy goes (a blob.Store's Put is whole and durable, or
// nothing), and every step is recorded first, so a crash leaves either the
// local files or a complete object, never neither.

func archiveKey(id string) string { return "sandboxes/" + id + ".tar" }

func isNotExist(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

// Archive moves a stopped sandbox's files to the archive store.
func (s *Service) Archive(ctx context.Context, id string) (api.Sandbox, error) {
	if s.archive == nil {
		return api.Sandbox{}, fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	return s.locked(ctx, id, "archive", func(ctx context.Context, sb *store.Sandbox) error {
		return s.archiveLocked(ctx, sb, "")
	})
}

// archiveLocked archives stopped sandbox sb, recording reason with the change
// (as stopLocked does).
func (s *Service) archiveLocked(ctx context.Context, sb *store.Sandbox, reason string) error {
	id := sb.ID
	sb.State = api.StateArchiving
	if err := s.setState(ctx, sb, api.StateStopped); err != nil {
		return err
	}
	back := func(err error) error {
		s.log.Error("archiving sandbox", "sandbox", id, "err", err)
		_ = s.archive.Delete(ctx, archiveKey(id))
		sb.State = api.StateStopped
		_ = s.setState(ctx, sb, api.StateArchiving)
		return fmt.Errorf("%w: archiving failed", errdefs.ErrUnavailable)
	}
	c, stop := s.track(id, "archiving", 0)
	defer stop()
	err := s.archive.Put(ctx, archiveKey(id), func(w io.Writer) error {
		return s.layers.PackWritable(id, io.MultiWriter(w, c))
	})
	if err != nil {
		return back(err)
	}
	if err := s.layers.RemoveWritable(id); err != nil {
		return back(err)
	}
	sb.State, sb.Error = api.StateArchived, reason
	return s.setState(ctx, sb, api.StateArchiving)
}

// unarchiveLocked brings an archived sandbox's files back and records it
// stopped; the object goes once that is recorded.
func (s *Service) unarchiveLocked(ctx context.Context, sb *store.Sandbox) error {
	if s.archive == nil {
		return fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	r, err := s.archive.Get(ctx, archiveKey(sb.ID))
	if err != nil {
		return fmt.Errorf("%w: reading the archive failed", errdefs.ErrUnavailable)
	}
	c, stop := s.track(sb.ID, "restoring", r.Size())
	defer stop()
	err = s.layers.UnpackWritable(sb.ID, io.TeeReader(r, c), sb.DiskGiB<<30)
	r.Close()
	if err != nil {
		s.log.Error("restoring from archive", "sandbox", sb.ID, "err", err)
		_ = s.layers.RemoveWritable(sb.ID)
		return fmt.Errorf("%w: restoring from the archive failed", errdefs.ErrUnavailable)
	}
	sb.State = api.StateStopped
	if err := s.setState(ctx, sb, api.StateArchived); err != nil {
		return err
	}
	if err := s.archive.Delete(ctx, archiveKey(sb.ID)); err != nil {
		s.log.Warn("removing restored archive", "sandbox", sb.ID, "err", err)
	}
	return nil
}

// recoverArchiving settles an archive a crash cut short: with the local files
// still there it is undone; without them the object is whole (they go only
// after it is written), so the sandbox is archived. Either way, the
// temporary file of a write the crash cut short goes.
func (s *Service) recoverArchiving(ctx context.Context, sb store.Sandbox) {
	if s.archive != nil {
		s.removeObjectTemps(ctx, archiveKey(sb.ID))
	}
	if s.layers.WritableExists(sb.ID) {
		if s.archive != nil {
			_ = s.archive.Delete(ctx, archiveKey(sb.ID))
		}
		sb.State = api.StateStopped
	} else {
		sb.State = api.StateArchived
	}
	s.log.Info("settling interrupted archive", "sandbox", sb.ID, "state", sb.State)
	_ = s.setState(ctx, &sb, api.StateArchiving)
}

// Snapshots are archived the same way: the object is written whole before the
// local subvolume goes, and bringing one back leaves the object until the
// snapshot is recorded ready again.

func snapshotKey(id string) string { return "snapshots/" + id + ".tar" }

// snapshotLock names the lock that serialises archiving, bringing back and
// deleting snapshot id (in the same map as sandbox locks).
func snapshotLock(id string) string { return "snapshot/" + id }

// ArchiveSnapshot moves a snapshot's files to the archive store.
func (s *Service) ArchiveSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	if err := checkID(id); err != nil {
		return api.Snapshot{}, err
	}
	if s.archive == nil {
		return api.Snapshot{}, fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	ctx = context.WithoutCancel(ctx)
	unlock := s.lock(snapshotLock(id))
	defer unlock()
	sn, err := s.snapshot(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	if sn.State != api.SnapshotReady {
		return api.Snapshot{}, fmt.Errorf("%w: snapshot %s is %s", errdefs.ErrConflict, id, sn.State)
	}
	if err := s.store.SetSnapshotState(ctx, id, api.SnapshotReady, api.SnapshotArchiving); err != nil {
		return api.Snapshot{}, err
	}
	back := func(err error) (api.Snapshot, error) {
		s.log.Error("archiving snapshot", "snapshot", id, "err", err)
		_ = s.archive.Delete(ctx, snapshotKey(id))
		_ = s.store.SetSnapshotState(ctx, id, api.SnapshotArchiving, api.SnapshotReady)
		return api.Snapshot{}, fmt.Errorf("%w: archiving failed", errdefs.ErrUnavailable)
	}
	err = s.archive.Put(ctx, snapshotKey(id), func(w io.Writer) error { return s.layers.PackSnapshot(id, w) })
	if err != nil {
		return back(err)
	}
	if err := s.layers.RemoveSnapshot(id); err != nil {
		return back(err)
	}
	if err := s.store.SetSnapshotState(ctx, id, api.SnapshotArchiving, api.SnapshotArchived); err != nil {
		return api.Snapshot{}, err
	}
	return s.GetSnapshot(ctx, id)
}

// withSnapshot runs f while snapshot id is on local disk and cannot be
// archived or deleted, bringing it back from the archive store first if it
// is archived.
func (s *Service) withSnapshot(ctx context.Context, id string, f func() error) error {
	unlock := s.lock(snapshotLock(id))
	defer unlock()
	sn, err := s.store.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	if sn.State == api.SnapshotArchived {
		if err := s.unarchiveSnapshot(ctx, id); err != nil {
			return err
		}
	}
	return f()
}

// unarchiveSnapshot brings archived snapshot id back; its lock is held.
func (s *Service) unarchiveSnapshot(ctx context.Context, id string) error {
	if s.archive == nil {
		return fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	r, err := s.archive.Get(ctx, snapshotKey(id))
	if err != nil {
		return fmt.Errorf("%w: reading the archived snapshot failed", errdefs.ErrUnavailable)
	}
	err = s.layers.UnpackSnapshot(id, r)
	r.Close()
	if err != nil {
		s.log.Error("restoring snapshot from archive", "snapshot", id, "err", err)
		_ = s.layers.RemoveSnapshot(id)
		return fmt.Errorf("%w: restoring the snapshot from the archive failed", errdefs.ErrUnavailable)
	}
	if err := s.store.SetSnapshotState(ctx, id, api.SnapshotArchived, api.SnapshotReady); err != nil {
		return err
	}
	if err := s.archive.Delete(ctx, snapshotKey(id)); err != nil {
		s.log.Warn("removing restored snapshot archive", "snapshot", id, "err", err)
	}
	return nil
}

// recoverSnapshots settles snapshot archives and restores a crash cut short,
// as recoverArchiving does for sandboxes. In a cluster, snapshots are
// shared: a node settles only those whose files it holds or whose sandbox
// (of mine, this node's sandboxes) it runs, never another node's archive
// in flight.
func (s *Service) recoverSnapshots(ctx context.Context, mine map[string]bool) error {
	sns, err := s.store.ListSnapshots(ctx, "")
	if err != nil {
		return err
	}
	for _, sn := range sns {
		local := s.layers.SnapshotExists(sn.ID)
		if s.name != "" && !local && !mine[sn.SandboxID] {
			continue
		}
		switch {
		case sn.State == api.SnapshotArchiving && local:
			if s.archive != nil {
				_ = s.archive.Delete(ctx, snapshotKey(sn.ID))
				s.removeObjectTemps(ctx, snapshotKey(sn.ID))
			}
			err = s.store.SetSnapshotState(ctx, sn.ID, api.SnapshotArchiving, api.SnapshotReady)
		case sn.State == api.SnapshotArchiving:
			err = s.store.SetSnapshotState(ctx, sn.ID, api.SnapshotArchiving, api.SnapshotArchived)
		case sn.State == api.SnapshotArchived && local:
			// A restore from the archive that a crash cut short.
			err = s.layers.RemoveSnapshot(sn.ID)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// counter counts the bytes of an archive or restore in flight.
type counter struct {
	op    string
	total int64
	done  atomic.Int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.done.Add(int64(len(p)))
	return len(p), nil
}

// track records that sandbox id's files are moving (op), total bytes if
// known; the API shows the counter's progress until stop.
func (s *Service) track(id, op string, total int64) (c *counter, stop func()) {
	c = &counter{op: op, total: total}
	s.activityMu.Lock()
	s.moving[id] = c
	s.activityMu.Unlock()
	return c, func() {
		s.activityMu.Lock()
		delete(s.moving, id)
		s.activityMu.Unlock()
	}
}

// progress is how far the files of sandbox id have moved, or nil.
func (s *Service) progress(id string) *api.Progress {
	s.activityMu.Lock()
	c := s.moving[id]
	s.activityMu.Unlock()
	if c == nil {
		return nil
	}
	return &api.Progress{Op: c.op, DoneBytes: c.done.Load(), TotalBytes: c.total}
}

// removeObjectTemps removes the temporary files that a file bucket keeps
// beside object key while writing it (see blob.Open).
func (s *Service) removeObjectTemps(ctx context.Context, key string) {
	keys, err := s.archive.List(ctx, key+".")
	if err != nil {
		s.log.Error("listing archive temporary files", "object", key, "err", err)
		return
	}
	for _, k := range keys {
		if strings.HasSuffix(k, ".tmp") {
			if err := s.archive.Delete(ctx, k); err != nil {
				s.log.Error("removing archive temporary file", "object", key, "err", err)
			}
		}
	}
}
