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

// checkpointSnapshot names the local snapshot a checkpoint uploads from.
func checkpointSnapshot(id string) string { return "checkpoint-" + id }

// checkpointDue reports whether running sb's next checkpoint is due.
func (s *Service) checkpointDue(sb store.Sandbox, now time.Time) bool {
	if s.archive == nil || sb.CheckpointEverySec <= 0 {
		return false
	}
	s.activityMu.Lock()
	last := s.checkpointed[sb.ID] // the last attempt here, failed or not
	s.activityMu.Unlock()
	for _, t := range []*time.Time{sb.StartedAt, sb.CheckpointedAt} {
		if t != nil && t.After(last) {
			last = *t
		}
	}
	return now.Sub(last) >= time.Duration(sb.CheckpointEverySec)*time.Second
}

// checkpoint writes sb's files to object storage, frozen while they are
// snapshotted if it runs, and records when; its lock is held.
func (s *Service) checkpoint(ctx context.Context, sb *store.Sandbox) error {
	t0 := time.Now()
	snap := checkpointSnapshot(sb.ID)
	_ = s.layers.RemoveSnapshot(snap) // one a crash left
	at := time.Now().UTC()
	if err := s.frozen(ctx, *sb, "checkpoint", func() error { return s.layers.SnapshotWritable(sb.ID, snap) }); err != nil {
		return err
	}
	defer func() {
		if err := s.layers.RemoveSnapshot(snap); err != nil {
			s.log.Error("removing checkpoint snapshot", "sandbox", sb.ID, "err", err)
		}
	}()
	key := checkpointKey(sb.ID, at)
	if err := s.archive.Put(ctx, key, func(w io.Writer) error { return s.layers.PackSnapshot(snap, w) }); err != nil {
		return fmt.Errorf("%w: writing the checkpoint failed: %v", errdefs.ErrUnavailable, err)
	}
	s.activityMu.Lock()
	s.checkpointed[sb.ID] = at
	s.activityMu.Unlock()
	keys, err := s.archive.List(ctx, checkpointPrefix(sb.ID))
	if err == nil {
		for _, k := range keys {
			if k < key || strings.HasSuffix(k, ".tmp") {
				_ = s.archive.Delete(ctx, k)
			}
		}
	}
	s.log.Info("checkpoint written", "sandbox", sb.ID, "at", at, "ms", ms(t0))
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
		if err := s.checkpoint(ctx, &sb); err != nil {
			s.log.Error("checkpoint", "sandbox", sb.ID, "err", err)
			// Not again at once: at the next interval.
			s.activityMu.Lock()
			s.checkpointed[sb.ID] = time.Now()
			s.activityMu.Unlock()
		}
	},
}
