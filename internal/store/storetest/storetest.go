// Package storetest is the conformance suite of the store contract (package
// store): every implementation runs Run from its own tests, so that each
// keeps the same promises (durability, error kinds, list order, atomic
// transitions, tenants, hostile input) and the control plane can take any.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Open opens the store kept in dir, a directory of the test's, empty the
// first time: opened again on the same dir after Close, it holds what was
// acknowledged before. A store that keeps no files (a database server)
// names its database after dir. The suite closes every store it opens.
type Open func(t *testing.T, dir string) store.Store

// Run runs the suite against the stores open opens.
func Run(t *testing.T, open Open) {
	s := suite{open: open}
	for _, tc := range []struct {
		name string
		test func(t *testing.T, s suite)
	}{
		{"CreateGetListDelete", testCreateGetListDelete},
		{"UpdateIsCompareAndSet", testUpdateIsCompareAndSet},
		{"UpdateAllIsAllOrNothing", testUpdateAllIsAllOrNothing},
		{"ConcurrentWriters", testConcurrentWriters},
		{"CollectRacesCreate", testCollectRacesCreate},
		{"ListOrder", testListOrder},
		{"Times", testTimes},
		{"Snapshots", testSnapshots},
		{"KeysAndReopen", testKeysAndReopen},
		{"Tenants", testTenants},
		{"TemplateVersions", testTemplateVersions},
		{"Durable", testDurable},
		{"HostileIDs", testHostileIDs},
		{"HostileValues", testHostileValues},
		{"Nodes", testNodes},
		{"Placement", testPlacement},
		{"Quotas", testQuotas},
		{"QuotaStorm", testQuotaStorm},
		{"Vaults", testVaults},
		{"VaultSchedules", testVaultSchedules},
		{"VaultRefs", testVaultRefs},
		{"Usage", testUsage},
		{"Audit", testAudit},
		{"Events", testEvents},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, s) })
	}
}

type suite struct{ open Open }

// fresh opens an empty store.
func (s suite) fresh(t *testing.T) store.Store {
	st, _ := s.at(t, t.TempDir())
	return st
}

// at opens the store in dir and returns it with its Close, which may be
// called early (to reopen dir) and runs at the test's end otherwise.
func (s suite) at(t *testing.T, dir string) (store.Store, func() error) {
	t.Helper()
	st := s.open(t, dir)
	var once sync.Once
	var err error
	closeFn := func() error { once.Do(func() { err = st.Close() }); return err }
	t.Cleanup(func() { closeFn() })
	return st, closeFn
}

// NewSandbox is a sandbox row as the control plane first records it.
func NewSandbox(id string) *store.Sandbox {
	return &store.Sandbox{Sandbox: api.Sandbox{
		ID: id, State: api.StateCreating, Template: "host", Runtime: "ns", CPU: 1, MemoryMiB: 512,
		DiskGiB: 10, PIDs: 1024, Env: map[string]string{"A": "1"}, Labels: map[string]string{"team": "x"},
		CreatedAt: time.Unix(1700000000, 0).UTC(),
	}}
}

func testCreateGetListDelete(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	a, b, c := NewSandbox("a"), NewSandbox("b"), NewSandbox("c")
	c.Vaults = []api.VaultMount{{Name: "notes", Path: "/home/user/memory/notes"}, {Name: "hb", ReadOnly: true, Path: "/srv/hb"}}
	for _, sb := range []*store.Sandbox{a, b, c} {
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if a.Slot != 0 || b.Slot != 1 || c.Slot != 2 {
		t.Fatalf("slots %d %d %d", a.Slot, b.Slot, c.Slot)
	}
	if b.Tenant != tenant.Default {
		t.Errorf("tenant %q written into the row, want %q", b.Tenant, tenant.Default)
	}
	got, err := st.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*b, got); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}
	// A sandbox's vault mounts are kept with it.
	if got, err := st.Get(ctx, "c"); err != nil || !cmp.Equal(got.Vaults, c.Vaults) {
		t.Errorf("vaults: %+v, %v; want %+v", got.Vaults, err, c.Vaults)
	}
	// A delete from states b is not in changes nothing and hands back the
	// stored row; one from b's state hands back the row it removed.
	if row, err := st.Delete(ctx, "b", api.StateRunning, api.StateDeleting); !errors.Is(err, errdefs.ErrConflict) || row.State != b.State {
		t.Fatalf("delete from other states: %v, row in state %q; want a conflict and %q", err, row.State, b.State)
	}
	if got, err := st.Get(ctx, "b"); err != nil || got.State != b.State {
		t.Fatalf("after a refused delete: %+v, %v", got, err)
	}
	if tr, err := st.Transitions(ctx, "b"); err != nil || len(tr) != 1 {
		t.Fatalf("a refused delete recorded a transition: %+v, %v", tr, err)
	}
	removed, err := st.Delete(ctx, "b", api.StateDeleting, b.State)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*b, removed); diff != "" {
		t.Errorf("the deleted row (-want +got):\n%s", diff)
	}
	// The freed slot is reused.
	d := NewSandbox("d")
	if err := st.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	if d.Slot != 1 {
		t.Errorf("slot %d, want the freed 1", d.Slot)
	}
	list, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Errorf("list has %d", len(list))
	}
	if _, err := st.Get(ctx, "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	if _, err := st.Delete(ctx, "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("double delete: %v", err)
	}
	// A refused create leaves its argument as it came.
	dup := NewSandbox("a")
	dup.Slot = 77
	if err := st.Create(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate id: %v, want a conflict", err)
	}
	if dup.Slot != 77 || dup.Tenant != "" {
		t.Errorf("refused create changed its argument: slot %d, tenant %q", dup.Slot, dup.Tenant)
	}
	if tr, err := st.Transitions(ctx, "b"); err != nil || len(tr) != 2 || tr[1].From != api.StateCreating || tr[1].To != "deleted" {
		t.Errorf("transitions of a deleted sandbox: %+v, %v", tr, err)
	}
}

func testUpdateIsCompareAndSet(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	sb := NewSandbox("a")
	if err := st.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateRunning
	sb.PID, sb.StartTime, sb.Socket = 42, 7, "/run/x"
	if err := st.Update(ctx, sb, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateStopped
	if err := st.Update(ctx, sb, api.StateCreating); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("update from the wrong state: %v", err)
	}
	got, _ := st.Get(ctx, "a")
	if got.State != api.StateRunning || got.PID != 42 || got.StartTime != 7 {
		t.Errorf("after refused update: %+v", got)
	}
	missing := NewSandbox("zz")
	if err := st.Update(ctx, missing, api.StateCreating); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("update of unknown: %v", err)
	}
	// A write in the same state is no transition.
	sb.State, sb.Labels = api.StateRunning, map[string]string{"b": "2"}
	if err := st.Update(ctx, sb, api.StateRunning); err != nil {
		t.Fatal(err)
	}
	tr, err := st.Transitions(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, x := range tr {
		steps = append(steps, x.From+">"+x.To)
	}
	if diff := cmp.Diff([]string{">creating", "creating>running"}, steps); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
}

// testUpdateAllIsAllOrNothing: one sandbox in the wrong state and none is
// written, as a fork's children are recorded running together.
func testUpdateAllIsAllOrNothing(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	a, b := NewSandbox("a"), NewSandbox("b")
	for _, sb := range []*store.Sandbox{a, b} {
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	b.State = api.StateDeleting
	if err := st.Update(ctx, b, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	a.State, b.State = api.StateRunning, api.StateRunning
	if err := st.UpdateAll(ctx, []*store.Sandbox{a, b}, api.StateCreating); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("update of a sandbox in the wrong state: %v", err)
	}
	if got, _ := st.Get(ctx, "a"); got.State != api.StateCreating {
		t.Errorf("a is %s after the refused update, want creating", got.State)
	}
	if tr, _ := st.Transitions(ctx, "a"); len(tr) != 1 {
		t.Errorf("a refused update recorded transitions: %+v", tr)
	}
	b.State = api.StateCreating
	if err := st.Update(ctx, b, api.StateDeleting); err != nil {
		t.Fatal(err)
	}
	b.State = api.StateRunning
	if err := st.UpdateAll(ctx, []*store.Sandbox{a, b}, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if got, _ := st.Get(ctx, id); got.State != api.StateRunning {
			t.Errorf("%s is %s, want running", id, got.State)
		}
	}
}

// testConcurrentWriters races writers on one store: of many moves of one
// sandbox out of one state exactly one wins, concurrent creates get
// distinct slots, and concurrent key and snapshot writes all land.
func testConcurrentWriters(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	if err := st.Create(ctx, NewSandbox("contested")); err != nil {
		t.Fatal(err)
	}
	const n = 32
	var wg sync.WaitGroup
	moved := make([]error, n)
	for i := range n {
		wg.Add(4)
		go func() {
			defer wg.Done()
			sb := NewSandbox("contested")
			sb.State, sb.PID = api.StateRunning, 1000+i
			moved[i] = st.Update(ctx, sb, api.StateCreating)
		}()
		go func() {
			defer wg.Done()
			if err := st.Create(ctx, NewSandbox(fmt.Sprintf("sb%02d", i))); err != nil {
				t.Errorf("create %d: %v", i, err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := st.AddKey(ctx, fmt.Sprintf("%064x", i), "k", "team"); err != nil {
				t.Errorf("key %d: %v", i, err)
			}
		}()
		go func() {
			defer wg.Done()
			sn := store.Snapshot{ID: fmt.Sprintf("sn%02d", i), SandboxID: "contested", Template: "host", State: api.SnapshotReady}
			if err := st.PutSnapshot(ctx, sn); err != nil {
				t.Errorf("snapshot %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range moved {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("moves %d and %d both won", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, errdefs.ErrConflict):
			t.Errorf("a losing move: %v, want a conflict", err)
		}
	}
	if got, err := st.Get(ctx, "contested"); err != nil || winner < 0 || got.PID != 1000+winner {
		t.Errorf("contested sandbox %+v, %v; want the winner's (%d)", got, err, winner)
	}
	if tr, _ := st.Transitions(ctx, "contested"); len(tr) != 2 {
		t.Errorf("%d transitions, want the creation and one move", len(tr))
	}
	sbs, err := st.List(ctx)
	if err != nil || len(sbs) != n+1 {
		t.Fatalf("%d sandboxes, %v; want %d", len(sbs), err, n+1)
	}
	slots := map[int]string{}
	for _, sb := range sbs {
		if other, ok := slots[sb.Slot]; ok {
			t.Errorf("%s and %s share slot %d", sb.ID, other, sb.Slot)
		}
		slots[sb.Slot] = sb.ID
		if sb.Slot < 0 || sb.Slot > n {
			t.Errorf("%s has slot %d, not among the lowest %d", sb.ID, sb.Slot, n+1)
		}
	}
	if k, err := st.KeyCount(ctx); err != nil || k != n {
		t.Errorf("%d keys, %v; want %d", k, err, n)
	}
	if sns, err := st.ListSnapshots(ctx, "contested"); err != nil || len(sns) != n {
		t.Errorf("%d snapshots, %v; want %d", len(sns), err, n)
	}
}

// testCollectRacesCreate races the collection of an unnamed version
// against the creation of a sandbox of it: either the sandbox is recorded
// and holds the version, or it is refused (not found) and the version is
// gone; never a sandbox of a collected version.
func testCollectRacesCreate(t *testing.T, s suite) {
	st := s.fresh(t)
	raceCollect(t, st, 20, "", "recorded", func(ctx context.Context, sb *store.Sandbox) error { return st.Create(ctx, sb) })
}

// raceCollect runs rounds of a race between record, which records sandbox
// sb (on node) of a version no name holds, and the version's collection:
// either sb is recorded (made, in the errors' words) and its version
// stays, or the version is gone and record refused with ErrNotFound.
func raceCollect(t *testing.T, st store.Store, rounds int, node, made string, record func(context.Context, *store.Sandbox) error) {
	ctx := context.Background()
	for i := range rounds {
		v, _, err := st.PutTemplate(ctx, store.Template{Name: "race", Layers: []string{"l1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteTemplate(ctx, "race"); err != nil {
			t.Fatal(err)
		}
		sb := NewSandbox(fmt.Sprintf("r%d", i))
		sb.Node, sb.Template, sb.TemplateVersion = node, "race", v.ID
		var recErr, collectErr error
		var wg sync.WaitGroup
		wg.Go(func() { recErr = record(ctx, sb) })
		wg.Go(func() { _, collectErr = st.CollectTemplates(ctx, v.ID) })
		wg.Wait()
		if collectErr != nil {
			t.Fatal(collectErr)
		}
		_, verErr := st.TemplateVersion(ctx, v.ID)
		switch {
		case recErr == nil && verErr != nil:
			t.Fatalf("round %d: a sandbox was %s, but its version was collected (%v)", i, made, verErr)
		case recErr != nil && !errors.Is(recErr, errdefs.ErrNotFound):
			t.Fatalf("round %d: %v, want success or not found", i, recErr)
		case recErr != nil && !errors.Is(verErr, errdefs.ErrNotFound):
			t.Fatalf("round %d: refused, yet the version is there (%v)", i, verErr)
		}
		if recErr == nil {
			if _, err := st.Delete(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.CollectTemplates(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// testListOrder: lists are in the order the contract names, ties broken by
// ID (or hash), so that a caller paging over them meets each row once.
func testListOrder(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	at := time.Unix(1700000000, 0).UTC()
	// Written out of order; c and a share a creation time.
	for _, w := range []struct {
		id  string
		age time.Duration
	}{{"c", 0}, {"b", -time.Hour}, {"a", 0}, {"d", time.Hour}} {
		sb := NewSandbox(w.id)
		sb.CreatedAt = at.Add(w.age)
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		sn := store.Snapshot{ID: "s" + w.id, SandboxID: w.id, Template: "host", State: api.SnapshotReady, CreatedAt: sb.CreatedAt}
		if err := st.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"b", "a", "c", "d"}
	for range 3 {
		sbs, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		if diff := cmp.Diff(want, ids); diff != "" {
			t.Errorf("list order (-want +got):\n%s", diff)
		}
	}
	sns, err := st.ListSnapshots(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sn := range sns {
		ids = append(ids, sn.ID)
	}
	if diff := cmp.Diff([]string{"sb", "sa", "sc", "sd"}, ids); diff != "" {
		t.Errorf("snapshot order (-want +got):\n%s", diff)
	}
	if sns, err := st.ListSnapshots(ctx, "c"); err != nil || len(sns) != 1 || sns[0].ID != "sc" {
		t.Errorf("snapshots of c: %+v, %v", sns, err)
	}
	// Keys: by creation, then hash. Added one after another, they come back
	// in that order.
	for _, h := range []string{"ff", "00", "77"} {
		if err := st.AddKey(ctx, strings.Repeat(h, 32), h, ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	ks, err := st.ListKeys(ctx)
	if err != nil || len(ks) != 3 || ks[0].Name != "ff" || ks[1].Name != "00" || ks[2].Name != "77" {
		t.Errorf("keys %+v, %v; want ff, 00, 77", ks, err)
	}
	if len(ks) > 0 && (ks[0].ID != store.KeyID(ks[0].Hash) || len(ks[0].ID) != 20) {
		t.Errorf("key ID %q of hash %q", ks[0].ID, ks[0].Hash)
	}
}

// testTimes: times come back in UTC, to the microsecond, and absent times
// stay absent.
func testTimes(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	at := time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.FixedZone("x", 3600))
	sb := NewSandbox("a")
	sb.CreatedAt, sb.StartedAt, sb.ExpiresAt = at, &at, &at
	if err := st.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := st.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]*time.Time{"created": &got.CreatedAt, "started": got.StartedAt, "expires": got.ExpiresAt} {
		if v == nil || !v.Equal(at) || v.Location() != time.UTC {
			t.Errorf("%s at %v, want %v in UTC", name, v, at)
		}
	}
	if got.StoppedAt != nil {
		t.Errorf("stopped at %v, never set", got.StoppedAt)
	}
	// A time never set stays the zero time.
	sn := store.Snapshot{ID: "snap", SandboxID: "a", Template: "host", State: api.SnapshotReady}
	if err := st.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSnapshot(ctx, "snap"); err != nil || !got.CreatedAt.IsZero() {
		t.Errorf("snapshot made at %v, %v; want the zero time", got.CreatedAt, err)
	}
}

func testSnapshots(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	sn := store.Snapshot{ID: "snap", Name: "before", SandboxID: "a", Template: "host", State: api.SnapshotReady,
		Tenant: "team-a", CreatedAt: time.Unix(1700000000, 0).UTC()}
	if err := st.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSnapshot(ctx, "snap"); err != nil || cmp.Diff(sn, got) != "" {
		t.Errorf("get (-want +got):\n%s %v", cmp.Diff(sn, got), err)
	}
	if err := st.PutSnapshot(ctx, sn); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("the same ID again: %v, want a conflict", err)
	}
	if err := st.SetSnapshotState(ctx, "snap", api.SnapshotReady, api.SnapshotArchiving); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSnapshotState(ctx, "snap", api.SnapshotReady, api.SnapshotArchived); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("from the wrong state: %v, want a conflict", err)
	}
	if got, _ := st.GetSnapshot(ctx, "snap"); got.State != api.SnapshotArchiving {
		t.Errorf("state %q after a refused move, want archiving", got.State)
	}
	if err := st.SetSnapshotState(ctx, "nosnap", api.SnapshotReady, api.SnapshotArchived); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("moving a missing snapshot: %v", err)
	}
	from := NewSandbox("child")
	from.FromSnapshot = "snap"
	if err := st.Create(ctx, from); err != nil {
		t.Fatal(err)
	}
	if users, err := st.SnapshotUsers(ctx); err != nil || cmp.Diff(map[string]int{"snap": 1}, users) != "" {
		t.Errorf("snapshot users %v, %v", users, err)
	}
	if err := st.DeleteSnapshot(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	_, getErr := st.GetSnapshot(ctx, "snap")
	for what, err := range map[string]error{"double delete": st.DeleteSnapshot(ctx, "snap"), "get deleted": getErr} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: %v, want not found", what, err)
		}
	}
}

func testKeysAndReopen(t *testing.T, s suite) {
	ctx := context.Background()
	dir := t.TempDir()
	st, closeSt := s.at(t, dir)
	if err := st.AddKey(ctx, "h1aaaaaaaaaaaaaaaaaaaaaa", "first", ""); err != nil {
		t.Fatal(err)
	}
	if err := st.AddKey(ctx, "h2bbbbbbbbbbbbbbbbbbbbbb", "team", "team-a"); err != nil {
		t.Fatal(err)
	}
	if err := st.AddKey(ctx, "h2bbbbbbbbbbbbbbbbbbbbbb", "again", "team-b"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("the same hash again: %v, want a conflict", err)
	}
	if err := st.Create(ctx, NewSandbox("a")); err != nil {
		t.Fatal(err)
	}
	if err := closeSt(); err != nil {
		t.Fatal(err)
	}
	st, _ = s.at(t, dir)
	if k, err := st.LookupKey(ctx, "h1aaaaaaaaaaaaaaaaaaaaaa"); err != nil || k.Tenant != tenant.Default || k.Name != "first" || k.ID != "h1aaaaaaaaaaaaaaaaaa" {
		t.Errorf("key after reopen: %+v, %v", k, err)
	}
	if k, err := st.LookupKey(ctx, "h2bbbbbbbbbbbbbbbbbbbbbb"); err != nil || k.Tenant != "team-a" {
		t.Errorf("second key: %+v, %v", k, err)
	}
	if _, err := st.LookupKey(ctx, "h3"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if err := st.DeleteKey(ctx, "h1aaaaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting the last admin key: %v", err)
	}
	if err := st.DeleteKey(ctx, "h2bbbbbbbbbbbbbbbbbb"); err != nil {
		t.Errorf("deleting a key: %v", err)
	}
	if err := st.DeleteKey(ctx, "h2bbbbbbbbbbbbbbbbbb"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
	if ks, _ := st.ListKeys(ctx); len(ks) != 1 {
		t.Errorf("keys %+v", ks)
	}
	if n, err := st.KeyCount(ctx); err != nil || n != 1 {
		t.Errorf("key count %d, %v", n, err)
	}
	if _, err := st.Get(ctx, "a"); err != nil {
		t.Errorf("sandbox lost on reopen: %v", err)
	}
}

// testTenants: each row keeps its tenant, and what counts per tenant counts
// only that tenant's rows.
func testTenants(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	v, _, err := st.PutTemplate(ctx, store.Template{Name: "py", Layers: []string{"l1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ id, tenant, state string }{
		{"a1", "team-a", api.StateRunning}, {"a2", "team-a", api.StateStopped},
		{"b1", "team-b", api.StateRunning}, {"p1", tenant.Default, store.StatePooled},
	} {
		sb := NewSandbox(r.id)
		sb.Tenant, sb.State, sb.Template, sb.TemplateVersion = r.tenant, r.state, "py", v.ID
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if got, _ := st.Get(ctx, r.id); got.Tenant != r.tenant {
			t.Errorf("%s belongs to %q, want %q", r.id, got.Tenant, r.tenant)
		}
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "sb", SandboxID: "b1", Template: "py", TemplateVersion: v.ID, Tenant: "team-b", State: api.SnapshotReady}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddKey(ctx, strings.Repeat("c", 64), "c", "team-c"); err != nil {
		t.Fatal(err)
	}
	for tn, want := range map[string]int{"": 3, "team-a": 2, "team-b": 1, tenant.Default: 0, "team-c": 0} {
		if users, err := st.TemplateUsers(ctx, tn); err != nil || users["py"] != want {
			t.Errorf("users of py for %q: %v, %v; want %d", tn, users, err, want)
		}
	}
	for tn, want := range map[string]store.VersionUse{"": {Sandboxes: 3, Snapshots: 1}, "team-a": {Sandboxes: 2},
		"team-b": {Sandboxes: 1, Snapshots: 1}, "team-c": {}} {
		if users, err := st.VersionUsers(ctx, tn); err != nil || users[v.ID] != want {
			t.Errorf("users of %s for %q: %v, %v; want %+v", v.ID, tn, users, err, want)
		}
	}
	for tn, want := range map[string]bool{"team-a": true, "team-b": true, "team-c": true, tenant.Default: true, "team-d": false, "": false} {
		if used, err := st.TenantInUse(ctx, tn); err != nil || used != want {
			t.Errorf("tenant %q in use: %v, %v; want %v", tn, used, err, want)
		}
	}
	// A tenant's last key may go; only the admin's last key is kept.
	if err := st.DeleteKey(ctx, store.KeyID(strings.Repeat("c", 64))); err != nil {
		t.Errorf("deleting a tenant's last key: %v", err)
	}
}

// testTemplateVersions: a name moves to each new version; sandboxes and
// snapshots hold the version they were made from, and a version is
// collected only once nothing holds it.
func testTemplateVersions(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	v1 := store.Template{Name: "py", Source: "reg/py:3", Digest: "sha256:ab", Layers: []string{"l1", "l2"}, Size: 42,
		Config: store.TemplateConfig{Env: []string{"A=1"}, Workdir: "/app", User: "1000"}, CreatedAt: time.Unix(1700000000, 0).UTC()}
	got1, prev, err := st.PutTemplate(ctx, v1)
	if err != nil || prev != "" || got1.Number != 1 || !store.ValidVersionID(got1.ID) {
		t.Fatalf("first version: %+v, previous %q, %v", got1, prev, err)
	}
	if cur, err := st.GetTemplate(ctx, "py"); err != nil || cmp.Diff(got1, cur) != "" {
		t.Errorf("get (-want +got):\n%s %v", cmp.Diff(got1, cur), err)
	}
	// The same content again is the same version.
	if again, prev, err := st.PutTemplate(ctx, v1); err != nil || again.ID != got1.ID || again.Number != 1 || prev != got1.ID {
		t.Errorf("same content again: %+v, %q, %v", again, prev, err)
	}
	sb := NewSandbox("a")
	sb.Template, sb.TemplateVersion = "py", got1.ID
	if err := st.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap", SandboxID: "a", Template: "py", TemplateVersion: got1.ID, State: api.SnapshotReady}); err != nil {
		t.Fatal(err)
	}
	v2 := v1
	v2.Layers = []string{"l1", "l3"}
	got2, prev, err := st.PutTemplate(ctx, v2)
	if err != nil || prev != got1.ID || got2.Number != 2 || got2.ID == got1.ID {
		t.Fatalf("second version: %+v, previous %q, %v", got2, prev, err)
	}
	for ref, want := range map[string]string{"1": got1.ID, "2": got2.ID, got1.ID: got1.ID} {
		if v, err := st.GetTemplateVersion(ctx, "py", ref); err != nil || v.ID != want {
			t.Errorf("py@%s: %+v, %v", ref, v, err)
		}
	}
	for ref, kind := range map[string]error{"3": errdefs.ErrNotFound, "0": errdefs.ErrInvalid, "01": errdefs.ErrInvalid,
		"-1": errdefs.ErrInvalid, "v0000000000000000000": errdefs.ErrNotFound, "x; DROP TABLE": errdefs.ErrInvalid} {
		if _, err := st.GetTemplateVersion(ctx, "py", ref); !errors.Is(err, kind) {
			t.Errorf("py@%s: %v, want %v", ref, err, kind)
		}
	}
	if _, err := st.GetTemplateVersion(ctx, "other", got1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another name's version by ID: %v", err)
	}
	if v, err := st.TemplateVersion(ctx, got1.ID); err != nil || v.ID != got1.ID {
		t.Errorf("version by ID: %+v, %v", v, err)
	}
	if vs, err := st.ListTemplateVersions(ctx); err != nil || len(vs) != 2 || vs[0].ID != got1.ID || vs[1].ID != got2.ID {
		t.Errorf("versions: %+v, %v", vs, err)
	}
	if gone, err := st.CollectTemplates(ctx); err != nil || len(gone) != 0 {
		t.Errorf("collected versions in use: %+v, %v", gone, err)
	}
	users, _ := st.VersionUsers(ctx, "")
	if users[got1.ID] != (store.VersionUse{Sandboxes: 1, Snapshots: 1}) {
		t.Errorf("users %v", users)
	}
	st.Delete(ctx, "a")
	if gone, _ := st.CollectTemplates(ctx, got1.ID); len(gone) != 0 {
		t.Errorf("collected a version a snapshot holds: %+v", gone)
	}
	st.DeleteSnapshot(ctx, "snap")
	if gone, err := st.CollectTemplates(ctx, got2.ID); err != nil || len(gone) != 0 {
		t.Errorf("collected the current version: %+v, %v", gone, err)
	}
	if gone, err := st.CollectTemplates(ctx, got1.ID); err != nil || len(gone) != 1 || gone[0].ID != got1.ID {
		t.Errorf("collecting the unheld version: %+v, %v", gone, err)
	}
	if _, err := st.TemplateVersion(ctx, got1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a collected version: %v", err)
	}
	// A sandbox of a collected version cannot be recorded.
	sb = NewSandbox("b")
	sb.Template, sb.TemplateVersion = "py", got1.ID
	if err := st.Create(ctx, sb); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("create of a collected version: %v", err)
	}
	if _, err := st.PointTemplate(ctx, "py-tag", got1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("pointing at a collected version: %v", err)
	}
	// A second name; removing a name leaves the version while another holds it.
	if _, err := st.PointTemplate(ctx, "py-tag", got2.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteTemplate(ctx, "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("double delete: %v", err)
	}
	if _, err := st.GetTemplate(ctx, "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get a deleted name: %v", err)
	}
	if gone, _ := st.CollectTemplates(ctx); len(gone) != 0 {
		t.Errorf("collected a version a tag holds: %+v", gone)
	}
	if names, err := st.ListTemplates(ctx); err != nil || len(names) != 1 || names[0].Name != "py-tag" || names[0].Current.ID != got2.ID {
		t.Errorf("names: %+v, %v", names, err)
	}
	st.DeleteTemplate(ctx, "py-tag")
	if gone, _ := st.CollectTemplates(ctx); len(gone) != 1 {
		t.Errorf("collected %+v, want the last version", gone)
	}
	// Numbers go on from the highest version left.
	if v, _, err := st.PutTemplate(ctx, v1); err != nil || v.Number != 1 {
		t.Errorf("a name made again: %+v, %v", v, err)
	}
}

// testDurable: everything acknowledged before Close is there after a
// reopen, with its recorded transitions.
func testDurable(t *testing.T, s suite) {
	ctx := context.Background()
	dir := t.TempDir()
	st, closeSt := s.at(t, dir)
	v, _, err := st.PutTemplate(ctx, store.Template{Name: "py", Layers: []string{"l1"}, Config: store.TemplateConfig{PoolSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	sb := NewSandbox("a")
	sb.TemplateVersion, sb.Tenant = v.ID, "team-a"
	sb.Policy = api.NetworkPolicy{Egress: "deny", Allow: []string{"example.com"}}
	if err := st.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.State, sb.PID, sb.StartTime = api.StateRunning, 9, 99
	if err := st.Update(ctx, sb, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	sn := store.Snapshot{ID: "snap", SandboxID: "a", Template: "py", TemplateVersion: v.ID, Tenant: "team-a",
		State: api.SnapshotReady, CreatedAt: time.Unix(1700000000, 0).UTC()}
	if err := st.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if err := st.AddKey(ctx, strings.Repeat("a", 64), "admin", ""); err != nil {
		t.Fatal(err)
	}
	if err := closeSt(); err != nil {
		t.Fatal(err)
	}
	st, _ = s.at(t, dir)
	if got, err := st.Get(ctx, "a"); err != nil || cmp.Diff(*sb, got) != "" {
		t.Errorf("sandbox after reopen (-want +got):\n%s %v", cmp.Diff(*sb, got), err)
	}
	if tr, err := st.Transitions(ctx, "a"); err != nil || len(tr) != 2 || tr[1].To != api.StateRunning {
		t.Errorf("transitions after reopen: %+v, %v", tr, err)
	}
	if got, err := st.GetSnapshot(ctx, "snap"); err != nil || cmp.Diff(sn, got) != "" {
		t.Errorf("snapshot after reopen (-want +got):\n%s %v", cmp.Diff(sn, got), err)
	}
	if got, err := st.GetTemplate(ctx, "py"); err != nil || cmp.Diff(v, got) != "" {
		t.Errorf("template after reopen (-want +got):\n%s %v", cmp.Diff(v, got), err)
	}
	if n, err := st.KeyCount(ctx); err != nil || n != 1 {
		t.Errorf("%d keys after reopen, %v", n, err)
	}
}

// hostileIDs are IDs, names and hashes no caller should send and some
// attacker will: the store must treat each as an opaque string.
var hostileIDs = []string{
	"", "../a", "/etc/passwd", "a' OR '1'='1", "'; DROP TABLE sandboxes; --", "a%", "_", "*",
	"a\x00b", "\xff\xfe", strings.Repeat("x", 64<<10), "A", " a",
}

// testHostileIDs: an ID of any shape finds nothing (it is compared, never
// matched as a pattern or spliced into a query), and harms nothing.
func testHostileIDs(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	if err := st.Create(ctx, NewSandbox("a")); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "a", SandboxID: "a", Template: "host", State: api.SnapshotReady}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddKey(ctx, strings.Repeat("a", 64), "admin", ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutTemplate(ctx, store.Template{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	notFound := func(what, id string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s %.40q: %v, want not found", what, id, err)
		}
	}
	for _, id := range hostileIDs {
		_, err := st.Get(ctx, id)
		notFound("get", id, err)
		notFound("delete", id, errOf(st.Delete(ctx, id)))
		sb := NewSandbox(id)
		notFound("update", id, st.Update(ctx, sb, api.StateCreating))
		_, err = st.GetSnapshot(ctx, id)
		notFound("get snapshot", id, err)
		notFound("set snapshot state", id, st.SetSnapshotState(ctx, id, api.SnapshotReady, api.SnapshotArchived))
		notFound("delete snapshot", id, st.DeleteSnapshot(ctx, id))
		_, err = st.LookupKey(ctx, id)
		notFound("look up key", id, err)
		notFound("delete key", id, st.DeleteKey(ctx, id))
		_, err = st.GetTemplate(ctx, id)
		notFound("get template", id, err)
		_, err = st.TemplateVersion(ctx, id)
		notFound("template version", id, err)
		notFound("delete template", id, st.DeleteTemplate(ctx, id))
		if tr, err := st.Transitions(ctx, id); err != nil || len(tr) != 0 {
			t.Errorf("transitions of %.40q: %+v, %v", id, tr, err)
		}
		if sns, err := st.ListSnapshots(ctx, id); id != "" && (err != nil || len(sns) != 0) { // "" lists all
			t.Errorf("snapshots of %.40q: %+v, %v", id, sns, err)
		}
		if _, err := st.GetTemplateVersion(ctx, "a", id); !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("template version %.40q: %v, want invalid or not found", id, err)
		}
	}
	// All still there.
	_, sbErr := st.Get(ctx, "a")
	_, snErr := st.GetSnapshot(ctx, "a")
	_, keyErr := st.LookupKey(ctx, strings.Repeat("a", 64))
	_, tmplErr := st.GetTemplate(ctx, "a")
	if err := errors.Join(sbErr, snErr, keyErr, tmplErr); err != nil {
		t.Errorf("after hostile IDs: %v", err)
	}
}

// testHostileValues: values are kept exactly (large, odd characters, quotes)
// or refused as invalid; never changed, never fatal to other rows.
func testHostileValues(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	big := strings.Repeat("label ", 1<<20/6) // 1 MiB
	for i, labels := range []map[string]string{
		{"big": big},
		{strings.Repeat("k", 64<<10): "v"},
		{"quote": `'"; DROP TABLE sandboxes; --`, "json": `{"a":[1,2]}`, "unicode": "日本語 🙂 \u202e"},
		{"nul": "a\x00b"},
		{"bad utf-8": "\xff\xfe"},
	} {
		sb := NewSandbox(fmt.Sprintf("v%d", i))
		sb.Labels, sb.Env = labels, labels
		err := st.Create(ctx, sb)
		if errors.Is(err, errdefs.ErrInvalid) {
			if _, gerr := st.Get(ctx, sb.ID); !errors.Is(gerr, errdefs.ErrNotFound) {
				t.Errorf("labels %d refused, yet the sandbox is there: %v", i, gerr)
			}
			continue
		}
		if err != nil {
			t.Errorf("labels %d: %v, want them kept or refused as invalid", i, err)
			continue
		}
		got, err := st.Get(ctx, sb.ID)
		if err != nil || cmp.Diff(labels, got.Labels) != "" || cmp.Diff(labels, got.Env) != "" {
			t.Errorf("labels %d came back changed (%v)", i, err)
		}
	}
	if err := st.Create(ctx, NewSandbox("after")); err != nil {
		t.Errorf("a plain create after the hostile ones: %v", err)
	}
}

// errOf is the error of a call that also returns a value, where only the
// error is checked.
func errOf[T any](_ T, err error) error { return err }
