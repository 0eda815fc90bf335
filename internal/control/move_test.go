package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// noRoom is a cluster whose other nodes are all full.
type noRoom struct{}

func (noRoom) Move(_ context.Context, sb store.Sandbox, _ string) (store.Sandbox, error) {
	return store.Sandbox{}, fmt.Errorf("no other node has room for sandbox %s: %w", sb.ID, store.ErrNoRoom)
}

func (noRoom) Room(context.Context, store.Sandbox) error { return nil } // it looks like there is

func (noRoom) DeleteLost(context.Context, store.Sandbox, func() error) error {
	return errdefs.ErrUnavailable
}

// TestDrainNoRoom checks what a drain leaves when no node has room: a
// running sandbox is running again here over its own files, a stopped one
// is archived here (a start brings it back), and the report lists both
// with why.
func TestDrainNoRoom(t *testing.T) {
	ctx := context.Background()
	a, bucket, run, stopped := drainNode(t, noRoom{})
	rep, err := a.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Moved != 0 || len(rep.Left) != 2 || !strings.Contains(rep.Left[run.ID], "no other node has room") {
		t.Fatalf("drain report %+v", rep)
	}
	sb, err := a.Get(ctx, run.ID)
	if err != nil || sb.State != api.StateRunning || sb.Node != "a" || !a.alive(t, run.ID) {
		t.Errorf("the running sandbox after a drain with no room: %s on %s, %v", sb.State, sb.Node, err)
	}
	if keys, _ := bucket.List(ctx, archiveKey(run.ID)); len(keys) != 0 {
		t.Errorf("its archive is left in object storage: %v", keys)
	}
	sb, err = a.Get(ctx, stopped.ID)
	if err != nil || sb.State != api.StateArchived || sb.Node != "a" {
		t.Errorf("the stopped sandbox after a drain with no room: %s on %s, %v", sb.State, sb.Node, err)
	}
	if sb, err := a.Start(ctx, stopped.ID); err != nil || sb.State != api.StateRunning {
		t.Errorf("start of the archived one, here: %s, %v", sb.State, err)
	}
}

// TestDrainArchiveOnly: a drain stops a checkpointing sandbox without the
// checkpoint a stop takes (the archive that follows holds the same
// files), so its files go to object storage once.
func TestDrainArchiveOnly(t *testing.T) {
	ctx := context.Background()
	bucket, err := blob.Open(ctx, "file://"+filepath.Join(testenv.Dir(t), "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	a := newClusterNode(t, "a", nil, Config{Archive: bucket, Mover: noRoom{}})
	sb, err := a.Create(ctx, api.CreateSandboxRequest{CheckpointEverySec: 3600})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := a.Drain(ctx)
	if err != nil || rep.Moved != 0 || !strings.Contains(rep.Left[sb.ID], "no other node has room") {
		t.Fatalf("drain report %+v, %v", rep, err)
	}
	if keys, _ := bucket.List(ctx, checkpointPrefix(sb.ID)); len(keys) != 0 {
		t.Errorf("the drain's stop wrote a checkpoint as well as the archive: %v", keys)
	}
	got, err := a.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.CheckpointedAt != nil || !a.alive(t, sb.ID) {
		t.Errorf("after the drain: %s, checkpointed at %v, %v", got.State, got.CheckpointedAt, err)
	}
	// A plain stop still takes its checkpoint.
	if _, err := a.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if keys, _ := bucket.List(ctx, checkpointPrefix(sb.ID)); len(keys) != 1 {
		t.Errorf("a stop's checkpoint: %v", keys)
	}
}

// drainNode returns node a of a cluster whose Mover is m, archiving to
// bucket, with a running sandbox and a stopped one.
func drainNode(t *testing.T, m Mover) (a *clusterNode, bucket blob.Store, run, stopped api.Sandbox) {
	t.Helper()
	ctx := context.Background()
	bucket, err := blob.Open(ctx, "file://"+filepath.Join(testenv.Dir(t), "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	a = newClusterNode(t, "a", nil, Config{Archive: bucket, Mover: m})
	if run, err = a.Create(ctx, api.CreateSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	if stopped, err = a.Create(ctx, api.CreateSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	if stopped, err = a.Stop(ctx, stopped.ID); err != nil {
		t.Fatal(err)
	}
	return a, bucket, run, stopped
}

// full is a cluster whose other nodes are full, and says so before a move.
type full struct{ noRoom }

func (full) Room(_ context.Context, sb store.Sandbox) error {
	return fmt.Errorf("no other node has room for sandbox %s: %w", sb.ID, store.ErrNoRoom)
}

// TestDrainNoRoomUntouched checks that a drain leaves a sandbox no other
// node has room for as it is: a running one is not even stopped.
func TestDrainNoRoomUntouched(t *testing.T) {
	ctx := context.Background()
	a, _, run, stopped := drainNode(t, full{})
	for range 2 {
		rep, err := a.Drain(ctx)
		if err != nil || rep.Moved != 0 || len(rep.Left) != 2 || !strings.Contains(rep.Left[run.ID], "no other node has room") {
			t.Fatalf("drain report %+v, %v", rep, err)
		}
	}
	if sb, _ := a.Get(ctx, run.ID); sb.State != api.StateRunning || !sb.StartedAt.Equal(*run.StartedAt) || !a.alive(t, run.ID) {
		t.Errorf("the running sandbox: %s, started %v (was %v)", sb.State, sb.StartedAt, run.StartedAt)
	}
	if sb, _ := a.Get(ctx, stopped.ID); sb.State != api.StateStopped {
		t.Errorf("the stopped sandbox: %s", sb.State)
	}
}

// TestCheckpoint checks that a checkpoint of a running sandbox reaches
// object storage under a key whose time is the latest, that a newer one
// replaces it, and that delete removes them.
func TestCheckpoint(t *testing.T) {
	ctx := context.Background()
	bucket, err := blob.Open(ctx, "file://"+filepath.Join(testenv.Dir(t), "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	a := newClusterNode(t, "a", nil, Config{Archive: bucket, Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
	defer func() {
		// The freezes, as the log reports them.
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "sandbox frozen") {
				t.Log(l[strings.Index(l, "op="):])
			}
		}
	}()
	if _, err := a.Create(ctx, api.CreateSandboxRequest{CheckpointEverySec: -1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("checkpoint_every_sec -1: %v, want invalid", err)
	}
	sb, err := a.Create(ctx, api.CreateSandboxRequest{CheckpointEverySec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sb.CheckpointEverySec != 1 {
		t.Errorf("created with checkpoint_every_sec %d", sb.CheckpointEverySec)
	}
	row, _ := a.st.Get(ctx, sb.ID)
	var last string
	for i := range 2 {
		t0 := time.Now()
		unlock := a.lock(sb.ID)
		err := a.checkpoint(ctx, &row)
		unlock()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("checkpoint %d (freeze, snapshot, thaw, upload of the snapshot) in %s", i, time.Since(t0).Round(time.Microsecond))
		key, at, err := a.latestCheckpoint(ctx, sb.ID)
		if err != nil || key == "" || at.Before(t0.Add(-time.Millisecond)) || key == last {
			t.Fatalf("checkpoint %d: latest %q at %s (%v), previous %q", i, key, at, err, last)
		}
		if keys, _ := bucket.List(ctx, checkpointPrefix(sb.ID)); len(keys) != 1 {
			t.Errorf("checkpoint %d: objects %v, want only the latest", i, keys)
		}
		last = key
		if got, _ := a.Get(ctx, sb.ID); got.CheckpointedAt == nil || !got.CheckpointedAt.Equal(at) {
			t.Errorf("checkpoint %d at %s: the record says %v", i, at, got.CheckpointedAt)
		}
	}
	// The periodic path: the snapshot under the lock, the upload and its
	// record after it, in the background.
	row, _ = a.st.Get(ctx, sb.ID)
	unlock := a.lock(sb.ID)
	err = a.checkpointLater(ctx, row)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	a.uploads.Wait()
	key, at, err := a.latestCheckpoint(ctx, sb.ID)
	if err != nil || key == last {
		t.Fatalf("after a background checkpoint: latest %q (%v), previous %q", key, err, last)
	}
	if got, _ := a.Get(ctx, sb.ID); got.CheckpointedAt == nil || !got.CheckpointedAt.Equal(at) {
		t.Errorf("background checkpoint at %s: the record says %v", at, got.CheckpointedAt)
	}
	if ids, _ := a.layers.SnapshotIDs(); len(ids) != 0 {
		t.Errorf("local snapshots left: %v", ids)
	}
	if err := a.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if keys, _ := bucket.List(ctx, checkpointPrefix(sb.ID)); len(keys) != 0 {
		t.Errorf("checkpoints after the delete: %v", keys)
	}
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
