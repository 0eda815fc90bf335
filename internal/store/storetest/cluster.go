package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// OpenCluster opens the cluster store kept in dir, as Open does.
type OpenCluster func(t *testing.T, dir string) store.Cluster

// Cluster runs the suite of store.Cluster's promises against the stores
// open opens: leases and epochs, fencing, placement, the nodes' views,
// secrets.
func Cluster(t *testing.T, open OpenCluster) {
	fresh := func(t *testing.T) store.Cluster {
		st := open(t, t.TempDir())
		t.Cleanup(func() { st.Close() })
		return st
	}
	for _, tc := range []struct {
		name string
		test func(t *testing.T, c store.Cluster)
	}{
		{"JoinRenew", testJoinRenew},
		{"Expire", testExpire},
		{"ExpireConcurrent", testExpireConcurrent},
		{"PlaceRefusals", testPlaceRefusals},
		{"PlaceConcurrent", testPlaceConcurrent},
		{"As", testAs},
		{"CollectRacesPlace", testCollectRacesPlace},
		{"Secret", testSecret},
		{"Move", testMove},
		{"HostileNodes", testHostileNodes},
		{"PlacePlacement", testPlacePlacement},
		{"PlaceQuota", testPlaceQuota},
		{"TakeCreates", testTakeCreates},
		{"BlobPins", testBlobPins},
		{"PlaceWarm", testPlaceWarm},
		{"Demand", testDemand},
		{"CommittedSums", testCommittedSums},
		{"CommittedConcurrent", testCommittedConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, fresh(t)) })
	}
}

// NewNode is a node as it joins: runtime ns, 4 CPUs, 4 GiB, 100 GiB of
// disk, 10 sandboxes.
func NewNode(name string) store.Node {
	return store.Node{
		Name: name, Address: name + ":7000", Version: "v1", Runtimes: []string{"ns", "gvisor"},
		Labels:   map[string]string{"zone": "a"},
		Capacity: store.Resources{CPU: 4, MemoryMiB: 4096, DiskGiB: 100, Sandboxes: 10},
	}
}

// join joins n for an hour and returns its epoch.
func join(t *testing.T, c store.Cluster, n store.Node) int64 {
	t.Helper()
	e, err := c.Join(context.Background(), n, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// placed is a sandbox for node, placed (it must fit).
func placed(t *testing.T, c store.Cluster, id, node string) *store.Sandbox {
	t.Helper()
	sb := NewSandbox(id)
	sb.Node = node
	if err := c.Place(context.Background(), []*store.Sandbox{sb})[0]; err != nil {
		t.Fatalf("placing %s on %s: %v", id, node, err)
	}
	return sb
}

// placedAs is placed with its State set to state, for the caller to
// record (UpdateAll from creating).
func placedAs(t *testing.T, c store.Cluster, id, node, state string) *store.Sandbox {
	t.Helper()
	sb := placed(t, c, id, node)
	sb.State = state
	return sb
}

func node(t *testing.T, c store.Cluster, name string) store.Node {
	t.Helper()
	ns, err := c.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s among %d", name, len(ns))
	return store.Node{}
}

func testJoinRenew(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	n := NewNode("n1")
	if e := join(t, c, n); e != 1 {
		t.Errorf("first epoch %d, want 1", e)
	}
	join(t, c, NewNode("a0")) // Nodes is by name
	got := node(t, c, "n1")
	if got.State != store.NodeLive || got.Schedule != "" || got.Epoch != 1 || got.JoinedAt.Before(before) ||
		got.LeaseExpires.Before(before.Add(59*time.Minute)) || got.JoinedAt.Location() != time.UTC {
		t.Errorf("joined: %+v", got)
	}
	want := n
	want.Epoch, want.State, want.Committed = 1, store.NodeLive, store.Resources{}
	want.JoinedAt, want.Heartbeat, want.LeaseExpires = got.JoinedAt, got.Heartbeat, got.LeaseExpires
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("node as joined (-want +got):\n%s", d)
	}
	if ns, _ := c.Nodes(ctx); len(ns) != 2 || ns[0].Name != "a0" || ns[1].Name != "n1" {
		t.Errorf("nodes not by name: %v", ns)
	}

	placed(t, c, "s1", "n1")
	if err := c.SetSchedule(ctx, "n1", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	n.Address, n.Capacity.CPU = "n1:7001", 8
	if e := join(t, c, n); e != 2 {
		t.Errorf("rejoined under epoch %d, want 2", e)
	}
	got = node(t, c, "n1")
	if got.Schedule != store.NodeCordoned || got.Address != "n1:7001" || got.Capacity.CPU != 8 || got.Epoch != 2 {
		t.Errorf("rejoined: %+v", got)
	}
	if got.Committed != (store.Resources{CPU: 1, MemoryMiB: 512, DiskGiB: 10, Sandboxes: 1}) {
		t.Errorf("committed after rejoin: %+v", got.Committed)
	}
	if sb, err := c.Get(ctx, "s1"); err != nil || sb.Node != "n1" || sb.State != api.StateCreating {
		t.Errorf("sandbox after rejoin: %+v, %v", sb, err)
	}

	st := store.NodeStatus{Templates: []string{"v1", "v2"}, Demand: map[string]float64{"": 2.5, "v1": 1}}
	if err := c.Renew(ctx, "n1", 1, time.Hour, st); !store.IsFenced(err) {
		t.Errorf("renew under the old epoch: %v, want ErrFenced", err)
	}
	if err := c.Renew(ctx, "n2", 1, time.Hour, st); !store.IsFenced(err) {
		t.Errorf("renew of a node never joined: %v, want ErrFenced", err)
	}
	if err := c.Renew(ctx, "n1", 2, 2*time.Hour, st); err != nil {
		t.Fatal(err)
	}
	got = node(t, c, "n1")
	if d := cmp.Diff(st, got.Status); d != "" {
		t.Errorf("status (-want +got):\n%s", d)
	}
	if got.LeaseExpires.Before(time.Now().Add(119 * time.Minute)) {
		t.Errorf("lease not extended: %v", got.LeaseExpires)
	}
	if err := c.Renew(ctx, "n1", 2, 0, st); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("renew for no time: %v, want ErrInvalid", err)
	}

	if err := c.SetSchedule(ctx, "nope", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("schedule of no node: %v, want ErrNotFound", err)
	}
	if err := c.SetSchedule(ctx, "n1", "sideways"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("schedule sideways: %v, want ErrInvalid", err)
	}
	if err := c.SetSchedule(ctx, "n1", ""); err != nil || node(t, c, "n1").Schedule != "" {
		t.Errorf("uncordon: %v", err)
	}
}

func testExpire(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	ea, err := c.Join(ctx, NewNode("a"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	join(t, c, NewNode("b"))
	run := placedAs(t, c, "run", "a", api.StateRunning)
	stop := placedAs(t, c, "stop", "a", api.StateStopped)
	del := placedAs(t, c, "del", "a", api.StateDeleting)
	if err := c.UpdateAll(ctx, []*store.Sandbox{run, stop, del}, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	placed(t, c, "other", "b")

	if gone, err := c.Expire(ctx, time.Now().Add(-time.Minute), "lease expired"); err != nil || len(gone) != 0 {
		t.Fatalf("expired before the lease ran out: %v, %v", gone, err)
	}
	gone, err := c.Expire(ctx, time.Now().Add(10*time.Minute), "lease expired")
	if err != nil || len(gone) != 1 || gone[0].Name != "a" || gone[0].State != store.NodeFenced {
		t.Fatalf("expired: %+v, %v; want a, fenced", gone, err)
	}
	if n := node(t, c, "a"); n.State != store.NodeFenced || n.Epoch != ea {
		t.Errorf("a after expiry: %s epoch %d", n.State, n.Epoch)
	}
	for id, from := range map[string]string{"run": api.StateRunning, "stop": api.StateStopped} {
		sb, err := c.Get(ctx, id)
		if err != nil || sb.State != api.StateLost || sb.LostFrom != from || sb.Node != "a" {
			t.Errorf("%s after expiry: %s from %q on %q, %v", id, sb.State, sb.LostFrom, sb.Node, err)
		}
		if !strings.Contains(sb.Error, "node a was fenced: lease expired") || sb.StoppedAt == nil || time.Since(*sb.StoppedAt) > time.Minute {
			t.Errorf("%s after expiry: error %q, stopped at %v; want the cause and the time", id, sb.Error, sb.StoppedAt)
		}
		ts, _ := c.Transitions(ctx, id)
		if last := ts[len(ts)-1]; last.From != from || last.To != api.StateLost || last.Reason != "lease expired" {
			t.Errorf("%s's last transition %+v", id, last)
		}
	}
	// Their lost events are recorded with the fencing.
	evs, err := c.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lost []string
	for _, e := range evs {
		if e.Type == api.LifecycleLost && e.State == api.StateLost && strings.Contains(e.Reason, "lease expired") && e.ID != "" {
			lost = append(lost, e.Sandbox)
		}
	}
	if want := []string{"run", "stop"}; !slices.Equal(lost, want) {
		t.Errorf("lost events for %v, want %v", lost, want)
	}
	if sb, _ := c.Get(ctx, "del"); sb.State != api.StateDeleting || sb.LostFrom != "" {
		t.Errorf("deleting sandbox after expiry: %s from %q", sb.State, sb.LostFrom)
	}
	if sb, _ := c.Get(ctx, "other"); sb.State != api.StateCreating {
		t.Errorf("b's sandbox after a's expiry: %s", sb.State)
	}
	// Lost sandboxes hold nothing.
	if n := node(t, c, "a"); n.Committed != (store.Resources{}) {
		t.Errorf("a holds %+v after expiry", n.Committed)
	}
	if err := c.Renew(ctx, "a", ea, time.Hour, store.NodeStatus{}); !store.IsFenced(err) {
		t.Errorf("renew after expiry: %v, want ErrFenced", err)
	}
	if gone, _ := c.Expire(ctx, time.Now().Add(10*time.Minute), "again"); len(gone) != 0 {
		t.Errorf("fenced twice: %v", gone)
	}
	// Back under a new epoch; what was lost stays lost for the cluster to
	// restore.
	if e := join(t, c, NewNode("a")); e != ea+1 {
		t.Errorf("rejoined under %d, want %d", e, ea+1)
	}
	if sb, _ := c.Get(ctx, "run"); sb.State != api.StateLost {
		t.Errorf("lost sandbox after rejoin: %s", sb.State)
	}
}

// Several Expires at once fence each node once, and mark its sandboxes
// lost once.
func testExpireConcurrent(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		if _, err := c.Join(ctx, NewNode(name), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		placed(t, c, "sb-"+name, name)
	}
	var mu sync.Mutex
	fenced := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gone, err := c.Expire(ctx, time.Now().Add(time.Minute), "lease expired")
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, n := range gone {
				fenced[n.Name]++
			}
		}()
	}
	wg.Wait()
	if want := map[string]int{"n0": 1, "n1": 1, "n2": 1}; !cmp.Equal(fenced, want) {
		t.Errorf("fenced %v, want each once", fenced)
	}
	for i := range 3 {
		ts, _ := c.Transitions(ctx, fmt.Sprintf("sb-n%d", i))
		if len(ts) != 2 || ts[1].To != api.StateLost {
			t.Errorf("sb-n%d's transitions: %+v", i, ts)
		}
	}
}

func testPlaceRefusals(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	small := NewNode("small")
	small.Runtimes = []string{"ns"}
	small.Capacity = store.Resources{CPU: 2, MemoryMiB: 2048, DiskGiB: 30, Sandboxes: 3}
	join(t, c, small)
	join(t, c, NewNode("cordoned"))
	if err := c.SetSchedule(ctx, "cordoned", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	join(t, c, NewNode("draining"))
	if err := c.SetSchedule(ctx, "draining", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join(ctx, NewNode("fenced"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Expire(ctx, time.Now().Add(time.Minute), "gone"); err != nil {
		t.Fatal(err)
	}
	placed(t, c, "existing", "small")

	type want struct {
		id, node string
		edit     func(sb *store.Sandbox)
		err      error // nil: placed
	}
	none := func(*store.Sandbox) {}
	batch := []want{
		{"ok1", "small", none, nil},
		{"gvisor", "small", func(sb *store.Sandbox) { sb.Runtime = "gvisor" }, store.ErrNoRoom},
		{"c", "cordoned", none, store.ErrNoRoom},
		{"d", "draining", none, store.ErrNoRoom},
		{"f", "fenced", none, store.ErrNoRoom},
		{"nowhere", "nowhere", none, store.ErrNoRoom},
		{"bigcpu", "small", func(sb *store.Sandbox) { sb.CPU = 1.5 }, store.ErrNoRoom},
		{"bigmem", "small", func(sb *store.Sandbox) { sb.MemoryMiB = 2000 }, store.ErrNoRoom},
		{"bigdisk", "small", func(sb *store.Sandbox) { sb.DiskGiB = 11 }, store.ErrNoRoom},
		{"existing", "small", none, errdefs.ErrConflict},
		{"ok1", "small", none, errdefs.ErrConflict}, // twice in one batch
		{"noversion", "small", func(sb *store.Sandbox) { sb.TemplateVersion = "v-missing" }, errdefs.ErrNotFound},
		{"negative", "small", func(sb *store.Sandbox) { sb.CPU = -1 }, errdefs.ErrInvalid},
		{"nonode", "", none, errdefs.ErrInvalid},
		{"nul\x00", "small", none, errdefs.ErrInvalid},
		// Stopped: holds a slot and disk, no CPU or memory.
		{"stopped", "small", func(sb *store.Sandbox) { sb.State = api.StateStopped; sb.CPU = 2 }, nil},
		// The third: the count is full.
		{"fourth", "small", func(sb *store.Sandbox) { sb.CPU, sb.MemoryMiB, sb.DiskGiB = 0, 0, 0 }, store.ErrNoRoom},
	}
	var sbs []*store.Sandbox
	for _, w := range batch {
		sb := NewSandbox(w.id)
		sb.Node = w.node
		w.edit(sb)
		sb.Slot = 99
		sbs = append(sbs, sb)
	}
	errs := c.Place(ctx, sbs)
	if len(errs) != len(batch) {
		t.Fatalf("%d errors for %d placements", len(errs), len(batch))
	}
	for i, w := range batch {
		if w.err == nil && errs[i] != nil || w.err != nil && !errors.Is(errs[i], w.err) {
			t.Errorf("placement %d (%q on %q): %v, want %v", i, w.id, w.node, errs[i], w.err)
		}
		if errs[i] != nil && sbs[i].Slot != 99 {
			t.Errorf("refused placement %d changed its slot to %d", i, sbs[i].Slot)
		}
	}
	if sbs[0].Slot != 1 || sbs[15].Slot != 2 {
		t.Errorf("slots %d, %d; want 1, 2", sbs[0].Slot, sbs[15].Slot)
	}
	for _, id := range []string{"ok1", "stopped"} {
		sb, err := c.Get(ctx, id)
		if err != nil || sb.Node != "small" {
			t.Errorf("%s: %+v, %v", id, sb, err)
		}
		if ts, _ := c.Transitions(ctx, id); len(ts) != 1 || ts[0].From != "" || ts[0].To != sb.State {
			t.Errorf("%s's transitions: %+v", id, ts)
		}
	}
	if _, err := c.Get(ctx, "bigcpu"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("refused placement recorded: %v", err)
	}
	if n := node(t, c, "small"); n.Committed != (store.Resources{CPU: 2, MemoryMiB: 1024, DiskGiB: 30, Sandboxes: 3}) {
		t.Errorf("small holds %+v", n.Committed)
	}
	if errs := c.Place(ctx, nil); len(errs) != 0 {
		t.Errorf("empty batch: %v", errs)
	}
}

// Placements from many goroutines at once onto three small nodes, until
// each is refused: no node ends beyond its capacity, and every refusal
// was true (a node's use only grows here, so one that has room after a
// refusal had room at it).
func testPlaceConcurrent(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	nodes := []string{"p0", "p1", "p2"}
	for _, name := range nodes {
		n := NewNode(name)
		n.Capacity = store.Resources{CPU: 6, MemoryMiB: 8192, DiskGiB: 1000, Sandboxes: 12}
		join(t, c, n)
	}
	var mu sync.Mutex
	placedOn := map[string]int{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(uint64(g), 1))
			refused := map[string]bool{}
			for i := 0; len(refused) < len(nodes); i++ {
				if i == 200 { // 8 × 200 × 4 placements, for 36 sandboxes' room
					t.Errorf("goroutine %d: never refused on every node", g)
					return
				}
				var sbs []*store.Sandbox
				for j := range 4 {
					sb := NewSandbox(fmt.Sprintf("g%d-%d-%d", g, i, j))
					sb.Node = nodes[r.IntN(len(nodes))]
					sb.CPU = []float64{0.25, 0.5, 1}[r.IntN(3)]
					sbs = append(sbs, sb)
				}
				for j, err := range c.Place(ctx, sbs) {
					sb := sbs[j]
					switch {
					case err == nil:
						mu.Lock()
						placedOn[sb.Node]++
						mu.Unlock()
					case errors.Is(err, store.ErrNoRoom):
						refused[sb.Node] = true
						n := node(t, c, sb.Node)
						if n.Committed.CPU+sb.CPU <= n.Capacity.CPU && n.Committed.Sandboxes < n.Capacity.Sandboxes {
							t.Errorf("%s refused on %s (%v CPU), which holds %+v of %+v", sb.ID, sb.Node, sb.CPU, n.Committed, n.Capacity)
						}
					default:
						t.Errorf("placing %s: %v", sb.ID, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, name := range nodes {
		n := node(t, c, name)
		if n.Committed.CPU > n.Capacity.CPU || n.Committed.Sandboxes > n.Capacity.Sandboxes {
			t.Errorf("%s over capacity: %+v of %+v", name, n.Committed, n.Capacity)
		}
		sbs, err := c.ListNode(ctx, name)
		if err != nil || len(sbs) != placedOn[name] || n.Committed.Sandboxes != len(sbs) {
			t.Errorf("%s: %d sandboxes listed, %d placed, %d committed, %v", name, len(sbs), placedOn[name], n.Committed.Sandboxes, err)
		}
		slots := map[int]bool{}
		for _, sb := range sbs {
			if slots[sb.Slot] || sb.Slot >= len(sbs) {
				t.Errorf("%s: slot %d twice or beyond %d", name, sb.Slot, len(sbs))
			}
			slots[sb.Slot] = true
		}
	}
	all, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkCommitted(t, c, all, nil, "concurrent placements")
}

func testAs(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	small := NewNode("n")
	small.Capacity.Sandboxes = 3
	e1 := join(t, c, small)
	join(t, c, NewNode("m"))
	theirs := placed(t, c, "theirs", "m")
	if err := c.SetSchedule(ctx, "n", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	v1 := c.As("n", e1)
	// Its own placements need no schedule, but room.
	mine := NewSandbox("mine")
	if err := v1.Create(ctx, mine); err != nil || mine.Node != "n" || mine.Slot != 0 {
		t.Fatalf("create through the view: node %q slot %d, %v", mine.Node, mine.Slot, err)
	}
	for _, id := range []string{"mine2", "mine3"} {
		if err := v1.Create(ctx, NewSandbox(id)); err != nil {
			t.Fatal(err)
		}
	}
	full := NewSandbox("full")
	if err := v1.Create(ctx, full); !errors.Is(err, store.ErrNoRoom) || full.Node != "" {
		t.Errorf("create on a full node: %v (node %q), want ErrNoRoom", err, full.Node)
	}
	elsewhere := NewSandbox("elsewhere")
	elsewhere.Node = "m"
	if err := v1.Create(ctx, elsewhere); !store.IsFenced(err) {
		t.Errorf("create on another node: %v, want ErrFenced", err)
	}
	mine.State = api.StateRunning
	if err := v1.Update(ctx, mine, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	if err := v1.PutSnapshot(ctx, store.Snapshot{ID: "snap", SandboxID: "mine", Template: "host", State: api.SnapshotReady, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if sb, err := v1.Get(ctx, "theirs"); err != nil || sb.Node != "m" {
		t.Errorf("read through the view: %+v, %v", sb, err)
	}

	// Another node's sandbox: not to be written, nor mine moved there.
	theirs.State = api.StateRunning
	if err := v1.Update(ctx, theirs, api.StateCreating); !store.IsFenced(err) {
		t.Errorf("update of another node's sandbox: %v, want ErrFenced", err)
	}
	if _, err := v1.Delete(ctx, "theirs"); !store.IsFenced(err) {
		t.Errorf("delete of another node's sandbox: %v, want ErrFenced", err)
	}
	if _, err := c.Get(ctx, "theirs"); err != nil {
		t.Errorf("another node's sandbox after a refused delete: %v", err)
	}
	// Nor the snapshots of another node's sandbox.
	if err := c.PutSnapshot(ctx, store.Snapshot{ID: "their-snap", SandboxID: "theirs", Template: "host", State: api.SnapshotReady}); err != nil {
		t.Fatal(err)
	}
	if err := v1.PutSnapshot(ctx, store.Snapshot{ID: "snap-of-theirs", SandboxID: "theirs", Template: "host", State: api.SnapshotReady}); !store.IsFenced(err) {
		t.Errorf("snapshot of another node's sandbox: %v, want ErrFenced", err)
	}
	if err := v1.SetSnapshotState(ctx, "their-snap", api.SnapshotReady, "deleting"); !store.IsFenced(err) {
		t.Errorf("state of another node's snapshot: %v, want ErrFenced", err)
	}
	if err := v1.DeleteSnapshot(ctx, "their-snap"); !store.IsFenced(err) {
		t.Errorf("delete of another node's snapshot: %v, want ErrFenced", err)
	}
	moved := *mine
	moved.Node = "m"
	if err := v1.Update(ctx, &moved, api.StateRunning); !store.IsFenced(err) {
		t.Errorf("moving a sandbox away through the view: %v, want ErrFenced", err)
	}

	// Rejoined: the old epoch writes nothing more.
	e2 := join(t, c, small)
	mine.State = api.StateStopping
	fenced := map[string]error{
		"update":       v1.Update(ctx, mine, api.StateRunning),
		"update all":   v1.UpdateAll(ctx, []*store.Sandbox{mine}, api.StateRunning),
		"delete":       errOf(v1.Delete(ctx, "mine2")),
		"create":       v1.Create(ctx, NewSandbox("late")),
		"put snapshot": v1.PutSnapshot(ctx, store.Snapshot{ID: "snap2", SandboxID: "mine", Template: "host", State: api.SnapshotReady}),
		"set snapshot": v1.SetSnapshotState(ctx, "snap", api.SnapshotReady, "deleting"),
		"del snapshot": v1.DeleteSnapshot(ctx, "snap"),
		"add key":      v1.AddKey(ctx, strings.Repeat("ab", 32), "k", ""),
		"collect": func() error {
			_, err := v1.CollectTemplates(ctx)
			return err
		}(),
		"put template": func() error {
			_, _, err := v1.PutTemplate(ctx, store.Template{Name: "t", Source: "s", Digest: "d"})
			return err
		}(),
	}
	for op, err := range fenced {
		if !store.IsFenced(err) {
			t.Errorf("%s under the old epoch: %v, want ErrFenced", op, err)
		}
	}
	if sb, _ := c.Get(ctx, "mine"); sb.State != api.StateRunning {
		t.Errorf("a fenced update was applied: %s", sb.State)
	}
	if _, err := c.Get(ctx, "mine2"); err != nil {
		t.Errorf("a fenced delete was applied: %v", err)
	}
	v2 := c.As("n", e2)
	if err := v2.Update(ctx, mine, api.StateRunning); err != nil {
		t.Fatal(err)
	}

	// Expired: fenced too.
	if _, err := c.Join(ctx, small, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e3 := node(t, c, "n").Epoch
	if _, err := c.Expire(ctx, time.Now().Add(time.Minute), "lease expired"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.As("n", e3).Delete(ctx, "mine3"); !store.IsFenced(err) {
		t.Errorf("delete after expiry: %v, want ErrFenced", err)
	}
	if _, err := c.As("nobody", 1).Delete(ctx, "theirs"); !store.IsFenced(err) {
		t.Errorf("delete through a node never joined: %v, want ErrFenced", err)
	}
}

// testCollectRacesPlace is testCollectRacesCreate for placements, which a
// store may make outside its usual transactions: each round a placement of
// a version no name holds races its collection. Either the sandbox is
// recorded and its version stays, or the version is gone and the placement
// refused (ErrNotFound); never a sandbox of a collected version.
func testCollectRacesPlace(t *testing.T, c store.Cluster) {
	join(t, c, NewNode("n"))
	raceCollect(t, c, 30, "n", "placed", func(ctx context.Context, sb *store.Sandbox) error {
		return c.Place(ctx, []*store.Sandbox{sb})[0]
	})
}

func testSecret(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	var wg sync.WaitGroup
	got := make([][]byte, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Secret(ctx, "cluster-key", func() ([]byte, error) {
				b := make([]byte, 32)
				rand.Read(b)
				return b, nil
			})
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	for i := range got {
		if len(got[i]) != 32 || !bytes.Equal(got[i], got[0]) {
			t.Fatalf("secret %d is %x, secret 0 %x", i, got[i], got[0])
		}
	}
	again, err := c.Secret(ctx, "cluster-key", func() ([]byte, error) { return nil, errors.New("made again") })
	if err != nil || !bytes.Equal(again, got[0]) {
		t.Errorf("secret again: %x, %v", again, err)
	}
	if _, err := c.Secret(ctx, "other", func() ([]byte, error) { return nil, errors.New("no entropy") }); err == nil {
		t.Error("a failed make stored nothing, yet no error")
	}
	if _, err := c.Secret(ctx, "bad\x00", func() ([]byte, error) { return []byte("x"), nil }); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("secret named with a NUL: %v, want ErrInvalid", err)
	}
}

// Nodes the store cannot hold exactly, or that make no sense, are
// ErrInvalid; odd but storable ones round-trip.
func testHostileNodes(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	for name, edit := range map[string]func(n *store.Node){
		"no name":         func(n *store.Node) { n.Name = "" },
		"NUL in name":     func(n *store.Node) { n.Name = "a\x00b" },
		"not UTF-8":       func(n *store.Node) { n.Name = "a\xffb" },
		"NUL in label":    func(n *store.Node) { n.Labels = map[string]string{"k": "v\x00"} },
		"NUL in runtime":  func(n *store.Node) { n.Runtimes = []string{"ns\x00"} },
		"negative CPU":    func(n *store.Node) { n.Capacity.CPU = -1 },
		"negative memory": func(n *store.Node) { n.Capacity.MemoryMiB = -1 },
		"negative count":  func(n *store.Node) { n.Capacity.Sandboxes = -1 },
		"CPU not a number": func(n *store.Node) {
			n.Capacity.CPU = float64(zero) / float64(zero)
		},
	} {
		n := NewNode("hostile")
		edit(&n)
		if _, err := c.Join(ctx, n, time.Hour); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("join with %s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := c.Join(ctx, NewNode("ok"), -time.Second); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("join with a negative lease: %v, want ErrInvalid", err)
	}
	odd := NewNode("n/../'; DROP TABLE nodes; --\u00e9\U0001F600")
	odd.Labels = map[string]string{"huge": strings.Repeat("x", 1<<20), "quote\"": "\\"}
	if _, err := c.Join(ctx, odd, time.Hour); err != nil {
		t.Fatalf("join with odd but storable values: %v", err)
	}
	if got := node(t, c, odd.Name); !cmp.Equal(got.Labels, odd.Labels) {
		t.Errorf("odd labels did not round-trip")
	}
	if _, err := c.Join(ctx, NewNode(strings.Repeat("n", 10000)), time.Hour); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("join with a huge name: %v, want nil or ErrInvalid", err)
	}
	for _, name := range []string{"a\x00", "\xff", strings.Repeat("z", 10000)} {
		if err := c.Renew(ctx, name, 1, time.Hour, store.NodeStatus{}); !store.IsFenced(err) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("renew of %.10q: %v", name, err)
		}
		if err := c.SetSchedule(ctx, name, ""); !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("schedule of %.10q: %v", name, err)
		}
		if _, err := c.As(name, 1).Delete(ctx, "x"); !store.IsFenced(err) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("delete through %.10q: %v", name, err)
		}
	}
	if err := c.Renew(ctx, odd.Name, 1, time.Hour, store.NodeStatus{Templates: []string{"\xff"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("status not UTF-8: %v, want ErrInvalid", err)
	}
}

// zero is a variable, so that 0/0 is NaN at run time, not a compile error.
var zero = 0

// testBlobPins: DropBlob deletes an object nobody pinned and none that is
// pinned, until the pin ends or its maker unpins; a PinBlob made while a
// deletion is under way returns only after it; bad keys, names and
// durations are ErrInvalid.
func testBlobPins(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	calls := 0
	del := func(context.Context) error { calls++; return nil }
	drop := func(what, key string, want bool) {
		t.Helper()
		n := calls
		dropped, err := c.DropBlob(ctx, key, del)
		if err != nil || dropped != want || (calls > n) != want {
			t.Errorf("%s: dropped %v, %v, %d deletes; want dropped %v", what, dropped, err, calls-n, want)
		}
	}
	pin := func(key, name string, d time.Duration) {
		t.Helper()
		if err := c.PinBlob(ctx, key, name, d); err != nil {
			t.Fatal(err)
		}
	}
	drop("an unpinned object", "layers/a", true)
	pin("layers/b", "maker-1", time.Hour)
	pin("layers/b", "maker-2", time.Hour)
	pin("layers/c", "maker-1", time.Hour)
	drop("a pinned object", "layers/b", false)
	// A maker's Unpin ends its pins only.
	if err := c.Unpin(ctx, "maker-1"); err != nil {
		t.Fatal(err)
	}
	drop("an object another maker still pins", "layers/b", false)
	drop("an object its only maker unpinned", "layers/c", true)
	if err := c.Unpin(ctx, "maker-2"); err != nil {
		t.Fatal(err)
	}
	drop("an object every maker unpinned", "layers/b", true)
	// A shorter pin does not shorten a longer one; an ended pin holds
	// nothing back.
	pin("layers/d", "maker-3", time.Hour)
	pin("layers/d", "maker-3", time.Millisecond)
	pin("layers/e", "maker-3", 50*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	drop("a pin of an hour, pinned again for 1 ms", "layers/d", false)
	drop("after its pin ended", "layers/e", true)
	// A pin during a deletion waits for it.
	deleting, release := make(chan struct{}), make(chan struct{})
	var deleted, pinned time.Time
	go func() {
		<-deleting
		if err := c.PinBlob(ctx, "layers/f", "maker-4", time.Hour); err != nil {
			t.Error(err)
		}
		pinned = time.Now()
		close(release)
	}()
	done := make(chan error, 1)
	go func() {
		_, err := c.DropBlob(ctx, "layers/f", func(context.Context) error {
			close(deleting)
			select {
			case <-release:
				t.Error("a PinBlob returned while its object was being deleted")
			case <-time.After(300 * time.Millisecond):
			}
			deleted = time.Now()
			return nil
		})
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-release
	if pinned.Before(deleted) {
		t.Errorf("pinned at %v, before the deletion ended at %v", pinned, deleted)
	}
	drop("an object pinned after its deletion", "layers/f", false)
	// A failed delete changes nothing: the object can be dropped again.
	boom := errors.New("boom")
	if dropped, err := c.DropBlob(ctx, "layers/g", func(context.Context) error { return boom }); !errors.Is(err, boom) || dropped {
		t.Errorf("a failed delete: dropped %v, %v", dropped, err)
	}
	drop("again after a failed delete", "layers/g", true)
	for _, bad := range []struct {
		key, name string
		d         time.Duration
	}{
		{"", "m", time.Hour}, {strings.Repeat("k", 1025), "m", time.Hour}, {"layers/h", "", time.Hour},
		{"layers/h", strings.Repeat("m", 129), time.Hour}, {"layers/h", "m", 0}, {"layers/h", "m", -time.Hour},
		{"layers/h", "m", 25 * time.Hour},
	} {
		if err := c.PinBlob(ctx, bad.key, bad.name, bad.d); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("PinBlob(%.20q, %.20q, %v): %v, want ErrInvalid", bad.key, bad.name, bad.d, err)
		}
	}
	if _, err := c.DropBlob(ctx, "", del); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("DropBlob of no key: %v, want ErrInvalid", err)
	}
}
