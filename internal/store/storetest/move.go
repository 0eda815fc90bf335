package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// testMove checks Move: only archived and lost sandboxes of the node named
// move, only to a live, schedulable node with the runtime and the room to
// run them, the transition recorded, and concurrent moves never
// over-commit the target.
func testMove(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	if _, err := c.Join(ctx, NewNode("a"), time.Second); err != nil {
		t.Fatal(err)
	}
	small := NewNode("b")
	small.Capacity = store.Resources{CPU: 2, MemoryMiB: 4096, DiskGiB: 100, Sandboxes: 10}
	join(t, c, small)
	join(t, c, NewNode("cordoned"))
	if err := c.SetSchedule(ctx, "cordoned", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	noGvisor := NewNode("ns-only")
	noGvisor.Runtimes = []string{"ns"}
	join(t, c, noGvisor)
	// b holds a running sandbox: 1 of its 2 CPUs.
	busy := placedAs(t, c, "busy", "b", api.StateRunning)
	arch := placedAs(t, c, "arch", "a", api.StateArchived)
	run := placedAs(t, c, "run", "a", api.StateRunning)
	gv := placed(t, c, "gv", "a")
	gv.State, gv.Runtime = api.StateArchived, "gvisor"
	if err := c.UpdateAll(ctx, []*store.Sandbox{busy, arch, run, gv}, api.StateCreating); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		id, from, to string
		want         error
	}{
		{"run", "a", "b", errdefs.ErrConflict},      // its files are on a
		{"arch", "b", "a", errdefs.ErrConflict},     // not b's
		{"nope", "a", "b", errdefs.ErrNotFound},     // no such sandbox
		{"arch", "a", "cordoned", store.ErrNoRoom},  // not schedulable
		{"arch", "a", "nowhere", store.ErrNoRoom},   // not a node
		{"gv", "a", "ns-only", store.ErrNoRoom},     // no runtime
		{"arch", "a", "a", errdefs.ErrInvalid},      // nowhere to go
		{"arch\x00", "a", "b", errdefs.ErrNotFound}, // hostile ID
		{"arch", "a", "b\xff", errdefs.ErrInvalid},  // hostile node
	} {
		if _, err := c.Move(ctx, tc.id, tc.from, tc.to, "drain"); !errors.Is(err, tc.want) {
			t.Errorf("move %q from %q to %q: %v, want %v", tc.id, tc.from, tc.to, err, tc.want)
		}
	}
	if sb, _ := c.Get(ctx, "arch"); sb.Node != "a" || sb.State != api.StateArchived {
		t.Fatalf("after refused moves: %s on %s", sb.State, sb.Node)
	}

	got, err := c.Move(ctx, "arch", "a", "b", "node a is draining")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Get(ctx, "arch")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "b" || sb.State != api.StateArchived || sb.Error != "node a is draining" || got.Node != "b" || got.Slot != sb.Slot || sb.Slot == busy.Slot {
		t.Errorf("moved: %s on %s slot %d (error %q), returned %s slot %d; busy slot %d", sb.State, sb.Node, sb.Slot, sb.Error, got.Node, got.Slot, busy.Slot)
	}
	if sb.Labels["team"] != "x" || sb.Env["A"] != "1" {
		t.Errorf("moved sandbox lost its labels or env: %v %v", sb.Labels, sb.Env)
	}
	trs, err := c.Transitions(ctx, "arch")
	if err != nil {
		t.Fatal(err)
	}
	if last := trs[len(trs)-1]; last.From != api.StateArchived || last.To != api.StateArchived || last.Reason != "node a is draining" {
		t.Errorf("last transition %+v", last)
	}

	// b has one CPU left: a lost sandbox of one CPU fits (counted as
	// running), one of two does not.
	l1, l2 := placed(t, c, "l1", "a"), NewSandbox("l2")
	l2.Node, l2.CPU = "a", 2
	if err := c.Place(ctx, []*store.Sandbox{l2})[0]; err != nil {
		t.Fatal(err)
	}
	l1.State, l2.State = api.StateRunning, api.StateRunning
	if err := c.UpdateAll(ctx, []*store.Sandbox{l1, l2}, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	if gone, err := c.Expire(ctx, time.Now().Add(10*time.Minute), "lease expired"); err != nil || len(gone) != 1 {
		t.Fatalf("expiring a: %v, %v", gone, err)
	}
	if _, err := c.Move(ctx, "l2", "a", "b", "restored"); !errors.Is(err, store.ErrNoRoom) {
		t.Errorf("moving 2 CPUs onto 1 free: %v, want ErrNoRoom", err)
	}
	if sb, _ := c.Get(ctx, "l2"); sb.Node != "a" || sb.State != api.StateLost || sb.LostFrom != api.StateRunning {
		t.Errorf("l2 after a refused move: %s on %s (lost from %q)", sb.State, sb.Node, sb.LostFrom)
	}
	if _, err := c.Move(ctx, "l1", "a", "b", "restored"); err != nil {
		t.Fatal(err)
	}
	if sb, _ := c.Get(ctx, "l1"); sb.Node != "b" || sb.State != api.StateArchived || sb.LostFrom != "" {
		t.Errorf("l1 after its move: %s on %s (lost from %q)", sb.State, sb.Node, sb.LostFrom)
	}
}
