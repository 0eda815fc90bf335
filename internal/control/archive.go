package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	gblob "gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Archiving moves a stopped sandbox's files to object storage and frees its
// local disk; starting it brings them back. The object is written whole
// before the local copy goes (gocloud writers commit on Close), and every step
// is recorded first, so a crash leaves either the local files or a complete
// object, never neither.

func archiveKey(id string) string { return "sandboxes/" + id + ".tar" }

func isNotExist(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }

// Archive moves a stopped sandbox's files to the archive store.
func (s *Service) Archive(ctx context.Context, id string) (api.Sandbox, error) {
	if s.archive == nil {
		return api.Sandbox{}, fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, api.StateStopped)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	sb.State = api.StateArchiving
	if err := s.store.Update(ctx, &sb, api.StateStopped); err != nil {
		return api.Sandbox{}, err
	}
	back := func(err error) (api.Sandbox, error) {
		s.log.Error("archiving sandbox", "sandbox", id, "err", err)
		_ = s.archive.Delete(ctx, archiveKey(id))
		sb.State = api.StateStopped
		_ = s.store.Update(ctx, &sb, api.StateArchiving)
		return api.Sandbox{}, fmt.Errorf("%w: archiving failed", errdefs.ErrUnavailable)
	}
	// In a file bucket, the object is synced before the rename that
	// commits it and its directory after, before the local files go: a
	// power cut leaves one of them whole. (Object stores' writes are
	// durable when Close returns.)
	var f *os.File
	w, err := s.archive.NewWriter(ctx, archiveKey(id), &gblob.WriterOptions{
		BeforeWrite: func(as func(any) bool) error { as(&f); return nil },
	})
	if err != nil {
		return back(err)
	}
	if err := s.layers.PackWritable(id, w); err != nil {
		w.Close()
		return back(err)
	}
	if f != nil {
		if err := f.Sync(); err != nil {
			w.Close()
			return back(err)
		}
	}
	if err := w.Close(); err != nil {
		return back(err)
	}
	if f != nil {
		if err := syncDir(filepath.Dir(f.Name())); err != nil {
			return back(err)
		}
	}
	if err := s.layers.RemoveWritable(id); err != nil {
		return back(err)
	}
	sb.State = api.StateArchived
	if err := s.store.Update(ctx, &sb, api.StateArchiving); err != nil {
		return api.Sandbox{}, err
	}
	return sb.Sandbox, nil
}

// unarchiveLocked brings an archived sandbox's files back and records it
// stopped; the object goes once that is recorded.
func (s *Service) unarchiveLocked(ctx context.Context, sb *store.Sandbox) error {
	if s.archive == nil {
		return fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	r, err := s.archive.NewReader(ctx, archiveKey(sb.ID), nil)
	if err != nil {
		return fmt.Errorf("%w: reading the archive failed", errdefs.ErrUnavailable)
	}
	err = s.layers.UnpackWritable(sb.ID, io.Reader(r), sb.DiskGiB<<30)
	r.Close()
	if err != nil {
		s.log.Error("restoring from archive", "sandbox", sb.ID, "err", err)
		_ = s.layers.RemoveWritable(sb.ID)
		return fmt.Errorf("%w: restoring from the archive failed", errdefs.ErrUnavailable)
	}
	sb.State = api.StateStopped
	if err := s.store.Update(ctx, sb, api.StateArchived); err != nil {
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
		s.removeArchiveTemps(ctx, sb.ID)
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
	_ = s.store.Update(ctx, &sb, api.StateArchiving)
}

// removeArchiveTemps removes the temporary files that a file bucket keeps
// beside sandbox id's object while writing it (see blob.Open).
func (s *Service) removeArchiveTemps(ctx context.Context, id string) {
	it := s.archive.List(&gblob.ListOptions{Prefix: archiveKey(id) + "."})
	for {
		obj, err := it.Next(ctx)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Error("listing archive temporary files", "sandbox", id, "err", err)
			}
			return
		}
		if strings.HasSuffix(obj.Key, ".tmp") {
			if err := s.archive.Delete(ctx, obj.Key); err != nil {
				s.log.Error("removing archive temporary file", "sandbox", id, "err", err)
			}
		}
	}
}
