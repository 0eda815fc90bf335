package atoll_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func (s *sandboxes) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateRunning, api.StatePaused)
}

func (s *sandboxes) Suspend(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateRunning, api.StateSuspended)
}

func (s *sandboxes) Shelve(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateRunning, api.StateShelved)
}

func (s *sandboxes) Archive(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StateStopped, api.StateArchived)
}

func (s *sandboxes) Resume(ctx context.Context, id string) (api.Sandbox, error) {
	return s.set(id, api.StatePaused, api.StateRunning)
}

func (s *sandboxes) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	parent, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []api.Sandbox
	for range req.Count {
		sb, _ := s.Create(ctx, api.CreateSandboxRequest{Template: parent.Template, Labels: req.Labels})
		out = append(out, sb)
	}
	return out, nil
}

func (s *sandboxes) Restore(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	if _, err := s.GetSnapshot(ctx, req.Snapshot); err != nil {
		return api.Sandbox{}, err
	}
	return s.Get(ctx, id)
}

func (s *sandboxes) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	sb, err := s.Get(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	return s.snaps.Insert(func(n int) (string, api.Snapshot) {
		snap := fmt.Sprintf("snap%016d", n)
		return snap, api.Snapshot{ID: snap, Name: req.Name, SandboxID: id, Template: sb.Template, State: api.SnapshotReady}
	}), nil
}

func (s *sandboxes) ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	return s.snaps.List(func(snap api.Snapshot) bool { return sandboxID == "" || snap.SandboxID == sandboxID }), nil
}

func (s *sandboxes) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return s.snaps.Get(id)
}

func (s *sandboxes) ArchiveSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return s.snaps.Update(id, func(snap *api.Snapshot) error {
		snap.State = api.SnapshotArchived
		return nil
	})
}

func (s *sandboxes) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.snaps.Delete(id, nil)
	return err
}

func TestPauseResume(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	if sb, err := c.PauseSandbox(ctx, id); err != nil || sb.State != api.StatePaused {
		t.Fatalf("PauseSandbox = %+v, %v", sb, err)
	}
	if _, err := c.PauseSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("second PauseSandbox: %v, want ErrConflict", err)
	}
	if sb, err := c.ResumeSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
		t.Fatalf("ResumeSandbox = %+v, %v", sb, err)
	}
	// ShelveSandbox asks for a pause without memory.
	if sb, err := c.ShelveSandbox(ctx, id); err != nil || sb.State != api.StateShelved {
		t.Fatalf("ShelveSandbox = %+v, %v", sb, err)
	}
}

func TestForkSandbox(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	sbs, err := c.ForkSandbox(ctx, id, api.ForkRequest{})
	if err != nil || len(sbs) != 1 || sbs[0].ID == id {
		t.Fatalf("ForkSandbox with count 0 = %+v, %v; want one child", sbs, err)
	}
	sbs, err = c.ForkSandbox(ctx, id, api.ForkRequest{Count: 3, Labels: map[string]string{"team": "x"}})
	if err != nil || len(sbs) != 3 || sbs[2].Labels["team"] != "x" {
		t.Fatalf("ForkSandbox 3 = %+v, %v", sbs, err)
	}
	for _, n := range []int{-1, 101, 10000} {
		if _, err := c.ForkSandbox(ctx, id, api.ForkRequest{Count: n}); !errors.Is(err, atoll.ErrInvalid) {
			t.Errorf("ForkSandbox count %d: %v, want ErrInvalid", n, err)
		}
	}
}

func TestSnapshots(t *testing.T) {
	c, id := newClient(t, key)
	ctx := context.Background()
	snap, err := c.CreateSnapshot(ctx, id, api.CreateSnapshotRequest{Name: "clean"})
	if err != nil || snap.Name != "clean" || snap.SandboxID != id {
		t.Fatalf("CreateSnapshot = %+v, %v", snap, err)
	}
	if _, err := c.CreateSnapshot(ctx, id, api.CreateSnapshotRequest{Name: "a/b"}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("CreateSnapshot named a/b: %v, want ErrInvalid", err)
	}
	for _, sandbox := range []string{"", id} {
		l, err := c.ListSnapshots(ctx, sandbox)
		if err != nil || len(l) != 1 || l[0].ID != snap.ID {
			t.Errorf("ListSnapshots(%q) = %+v, %v", sandbox, l, err)
		}
	}
	if got, err := c.GetSnapshot(ctx, snap.ID); err != nil || got.ID != snap.ID {
		t.Errorf("GetSnapshot = %+v, %v", got, err)
	}
	if sb, err := c.RestoreSandbox(ctx, id, api.RestoreRequest{Snapshot: snap.ID}); err != nil || sb.ID != id {
		t.Errorf("RestoreSandbox = %+v, %v", sb, err)
	}
	if got, err := c.ArchiveSnapshot(ctx, snap.ID); err != nil || got.State != api.SnapshotArchived {
		t.Errorf("ArchiveSnapshot = %+v, %v", got, err)
	}
	if _, err := c.ArchiveSnapshot(ctx, "nope"); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("ArchiveSnapshot of a malformed ID: %v, want ErrInvalid", err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, snap.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("GetSnapshot of deleted: %v, want ErrNotFound", err)
	}
	if _, err := c.RestoreSandbox(ctx, id, api.RestoreRequest{Snapshot: snap.ID}); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("RestoreSandbox from deleted: %v, want ErrNotFound", err)
	}
	if err := c.DeleteSnapshot(ctx, "../sandboxes/x"); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("DeleteSnapshot of malformed ID: %v, want ErrInvalid", err)
	}
}
