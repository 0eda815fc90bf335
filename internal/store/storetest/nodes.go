package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// testNodes: a sandbox's Node and LostFrom round-trip through every write
// and read, ListNode returns one node's sandboxes in List's order, and
// slots are unique per node (each node's start at 0).
func testNodes(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	mk := func(id, node string, created int64) *store.Sandbox {
		sb := NewSandbox(id)
		sb.Node = node
		sb.CreatedAt = time.Unix(created, 0).UTC()
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	// Created out of order, to see ListNode sort.
	a1 := mk("a1", "a", 3)
	b1 := mk("b1", "b", 2)
	a2 := mk("a2", "a", 1)
	l1 := mk("l1", "", 4)
	b2 := mk("b2", "b", 5)
	for _, c := range []struct {
		sb   *store.Sandbox
		slot int
	}{{a1, 0}, {a2, 1}, {b1, 0}, {b2, 1}, {l1, 0}} {
		if c.sb.Slot != c.slot {
			t.Errorf("%s on %q has slot %d, want %d", c.sb.ID, c.sb.Node, c.sb.Slot, c.slot)
		}
	}
	for node, want := range map[string][]string{"a": {"a2", "a1"}, "b": {"b1", "b2"}, "": {"l1"}, "c": nil, "a\x00": nil} {
		got, err := st.ListNode(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range got {
			ids = append(ids, sb.ID)
			if sb.Node != node {
				t.Errorf("ListNode(%q) returned %s of %q", node, sb.ID, sb.Node)
			}
		}
		if !cmp.Equal(ids, want) {
			t.Errorf("ListNode(%q) = %v, want %v", node, ids, want)
		}
	}
	// A freed slot is reused on its node only.
	if _, err := st.Delete(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	if a3 := mk("a3", "a", 6); a3.Slot != 1 {
		t.Errorf("a3 has slot %d, want the freed 1", a3.Slot)
	}
	if b3 := mk("b3", "b", 7); b3.Slot != 2 {
		t.Errorf("b3 has slot %d, want 2", b3.Slot)
	}

	// LostFrom and Node through Update.
	got, err := st.Get(ctx, "a1")
	if err != nil || got.Node != "a" {
		t.Fatalf("a1: %+v, %v", got, err)
	}
	got.LostFrom, got.State = api.StateRunning, api.StateLost
	if err := st.Update(ctx, &got, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	if again, _ := st.Get(ctx, "a1"); again.LostFrom != api.StateRunning || again.State != api.StateLost || again.Slot != 0 {
		t.Errorf("after update: node %q lost from %q, %s, slot %d", again.Node, again.LostFrom, again.State, again.Slot)
	}
	// Restored on another node: it takes that node's lowest free slot.
	got.Node, got.LostFrom, got.State = "b", "", api.StateCreating
	if err := st.Update(ctx, &got, api.StateLost); err != nil {
		t.Fatal(err)
	}
	if again, _ := st.Get(ctx, "a1"); again.Node != "b" || again.LostFrom != "" || again.Slot != 3 || got.Slot != 3 {
		t.Errorf("moved: node %q lost from %q, slot %d (argument %d), want b, '', 3", again.Node, again.LostFrom, again.Slot, got.Slot)
	}
	if a4 := mk("a4", "a", 8); a4.Slot != 0 {
		t.Errorf("a4 has slot %d, want the moved one's 0", a4.Slot)
	}
	// A node with a NUL is not storable everywhere: refused, not changed.
	odd := NewSandbox("odd")
	odd.Node = "n\x00"
	if err := st.Create(ctx, odd); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("node with a NUL: %v, want nil or ErrInvalid", err)
	} else if err == nil {
		if sb, _ := st.Get(ctx, "odd"); sb.Node != "n\x00" {
			t.Errorf("node with a NUL stored as %q", sb.Node)
		}
	}
}
