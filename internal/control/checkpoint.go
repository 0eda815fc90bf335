package control

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Checkpoints are periodic copies of a running sandbox's files in object
// storage (api.CreateSandboxRequest.CheckpointEverySec), for a lost one to
// be restored from on another node (restoreLost). The sandbox is frozen
// only while its writable layer is snapshotted (as a snapshot is taken);
// the upload is from the snapshot, while it runs.
//
// A checkpoint's time is in its object's key, checkpoints/ID/TIME.tar, in
// a fixed-width form that sorts as time does: the latest object is the
// latest checkpoint, which a restore reads without trusting any other
// record. An upload is whole or absent (blob.Store's Put); the older
// checkpoints go once a newer one is written, and the sandbox's record
// then shows its time (CheckpointedAt).

// checkpointTime is a checkpoint key's time: fixed width, sorting as time.
const checkpointTime = "20060102T150405.000000000Z"

func checkpointPrefix(id string) string { return "checkpoints/" + id + "/" }

func checkpointKey(id string, at time.Time) string {
	return checkpointPrefix(id) + at.UTC().Format(checkpointTime) + ".tar"
}

// checkpointSnapshot names the local snapshot a checkpoint taken at at
// uploads from: one of its own, as an upload may still run when the next
// checkpoint (at a stop) is taken. Recover removes those a crash left.
func checkpointSnapshot(id string, at time.Time) string {
	return "checkpoint-" + id + "-" + at.UTC().Format("20060102T150405.000000000")
}

// checkpointDue reports whether running sb's next checkpoint is due.
func (s *Service) checkpointDue(sb store.Sandbox, now time.Time) bool {
	if s.archive == nil || sb.CheckpointEverySec <= 0 {
		return false
	}
	s.activityMu.Lock()
	last, busy := s.checkpointed[sb.ID], s.uploading[sb.ID] // last: the last attempt here
	s.activityMu.Unlock()
	if busy {
		return false
	}
	for _, t := range []*time.Time{sb.StartedAt, sb.CheckpointedAt} {
		if t != nil && t.After(last) {
			last = *t
		}
	}
	return now.Sub(last) >= time.Duration(sb.CheckpointEverySec)*time.Second
}

// checkpoint writes sb's files to object storage and records when, all
// before it returns (a stop's last checkpoint); its lock is held.
func (s *Service) checkpoint(ctx context.Context, sb *store.Sandbox) error {
	snap, at, err := s.snapshotForCheckpoint(ctx, *sb)
	if err != nil {
		return err
	}
	if err := s.uploadCheckpoint(ctx, sb.ID, snap, at); err != nil {
		return err
	}
	return s.recordCheckpoint(ctx, sb, at)
}

// checkpointLater takes sb's checkpoint snapshot now (its lock is held)
// and uploads it in the background, without the lock: the periodic
// checkpoints neither hold up the sandbox's other operations nor Run's
// sweep. Run waits for the uploads.
func (s *Service) checkpointLater(ctx context.Context, sb store.Sandbox) error {
	snap, at, err := s.snapshotForCheckpoint(ctx, sb)
	if err != nil {
		return err
	}
	s.activityMu.Lock()
	s.uploading[sb.ID] = true
	s.activityMu.Unlock()
	s.uploads.Add(1)
	go func() {
		defer s.uploads.Done()
		defer func() {
			s.activityMu.Lock()
			delete(s.uploading, sb.ID)
			s.activityMu.Unlock()
		}()
		if err := s.uploadCheckpoint(ctx, sb.ID, snap, at); err != nil {
			s.log.Error("checkpoint", "sandbox", sb.ID, "err", err)
			return
		}
		ctx := context.WithoutCancel(ctx)
		unlock := s.lock(sb.ID)
		defer unlock()
		cur, err := s.store.Get(ctx, sb.ID)
		switch {
		case isNotExist(err):
			// Deleted while it uploaded: its checkpoints went with it,
			// all but this one.
			_ = s.archive.Delete(ctx, checkpointKey(sb.ID, at))
		case err != nil || cur.Node != s.name || cur.CheckpointedAt != nil && !cur.CheckpointedAt.Before(at):
			// Moved away, or a newer checkpoint is recorded.
		default:
			if err := s.recordCheckpoint(ctx, &cur, at); err != nil {
				s.log.Error("recording checkpoint", "sandbox", sb.ID, "err", err)
			}
		}
	}()
	return nil
}

// snapshotForCheckpoint snapshots sb's writable layer, frozen meanwhile if
// it runs; its lock is held.
func (s *Service) snapshotForCheckpoint(ctx context.Context, sb store.Sandbox) (string, time.Time, error) {
	at := time.Now().UTC()
	s.activityMu.Lock()
	s.checkpointed[sb.ID] = at
	s.activityMu.Unlock()
	snap := checkpointSnapshot(sb.ID, at)
	if err := s.frozen(ctx, sb, "checkpoint", func() error { return s.layers.SnapshotWritable(sb.ID, snap) }); err != nil {
		_ = s.layers.RemoveSnapshot(snap)
		return "", at, err
	}
	return snap, at, nil
}

// uploadCheckpoint writes snapshot snap to object storage as sandbox id's
// checkpoint at at, removes the older ones, and removes the snapshot.
func (s *Service) uploadCheckpoint(ctx context.Context, id, snap string, at time.Time) error {
	t0 := time.Now()
	defer func() {
		if err := s.layers.RemoveSnapshot(snap); err != nil {
			s.log.Error("removing checkpoint snapshot", "sandbox", id, "err", err)
		}
	}()
	key := checkpointKey(id, at)
	if err := s.archive.Put(ctx, key, func(w io.Writer) error { return s.layers.PackSnapshot(snap, w) }); err != nil {
		return fmt.Errorf("%w: writing the checkpoint failed: %v", errdefs.ErrUnavailable, err)
	}
	if keys, err := s.archive.List(ctx, checkpointPrefix(id)); err == nil {
		for _, k := range keys {
			if k < key || strings.HasSuffix(k, ".tmp") {
				_ = s.archive.Delete(ctx, k)
			}
		}
	}
	s.log.Info("checkpoint written", "sandbox", id, "at", at, "ms", ms(t0))
	return nil
}

// recordCheckpoint records sb's checkpoint at at; its lock is held.
func (s *Service) recordCheckpoint(ctx context.Context, sb *store.Sandbox, at time.Time) error {
	sb.CheckpointedAt = &at
	return s.setState(ctx, sb, sb.State)
}

// latestCheckpoint is the key and time of sandbox id's latest checkpoint;
// "" if it has none.
func (s *Service) latestCheckpoint(ctx context.Context, id string) (string, time.Time, error) {
	keys, err := s.archive.List(ctx, checkpointPrefix(id))
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: reading object storage failed", errdefs.ErrUnavailable)
	}
	for i := len(keys) - 1; i >= 0; i-- {
		name, ok := strings.CutSuffix(strings.TrimPrefix(keys[i], checkpointPrefix(id)), ".tar")
		if !ok {
			continue
		}
		if at, err := time.Parse(checkpointTime, name); err == nil {
			return keys[i], at, nil
		}
	}
	return "", time.Time{}, nil
}

// removeCheckpoints removes sandbox id's checkpoints, for its delete.
func (s *Service) removeCheckpoints(ctx context.Context, id string) error {
	keys, err := s.archive.List(ctx, checkpointPrefix(id))
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.archive.Delete(ctx, k); err != nil && !isNotExist(err) {
			return err
		}
	}
	s.activityMu.Lock()
	delete(s.checkpointed, id)
	s.activityMu.Unlock()
	return nil
}

// checkpointPolicy is the lifecycle policy that writes checkpoints.
var checkpointPolicy = lifecyclePolicy{
	name:   "checkpoint",
	states: []string{api.StateRunning},
	due:    (*Service).checkpointDue,
	apply: func(s *Service, ctx context.Context, sb store.Sandbox) {
		// A failure is tried again at the next interval.
		if err := s.checkpointLater(ctx, sb); err != nil {
			s.log.Error("checkpoint", "sandbox", sb.ID, "err", err)
		}
	},
}
