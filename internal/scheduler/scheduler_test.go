package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
)

// database is a schema of its own on the test server (pgtest), dropped
// when the test ends: the URL whose connections use it.
func database(t *testing.T) string { return pgtest.NewURL(t, "atoll_sched_") }

func open(t *testing.T, u string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func sandbox(id string, cpu float64) *store.Sandbox {
	return &store.Sandbox{Sandbox: api.Sandbox{
		ID: id, State: api.StateCreating, Template: "host", Runtime: "ns", CPU: cpu, MemoryMiB: 256,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}}
}

// TestSchedulerFillsExactly: four schedulers, each with its own connection
// pool (four API nodes), place at once until the cluster is full: the
// three schedulable nodes end exactly at capacity, never beyond, every
// placement past that is a NoRoomError (503), and the cordoned node and the
// one without the runtime get nothing.
func TestSchedulerFillsExactly(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	admin := open(t, u)
	caps := map[string]float64{"a": 10, "b": 7, "c": 4.5, "cordoned": 8, "gvisor-only": 8}
	for name, cpu := range caps {
		n := store.Node{Name: name, Runtimes: []string{"ns"}, Labels: map[string]string{"zone": name},
			Capacity: store.Resources{CPU: cpu, MemoryMiB: 1 << 20, DiskGiB: 100, Sandboxes: 100}}
		if name == "gvisor-only" {
			n.Runtimes = []string{"gvisor"}
		}
		if _, err := admin.Join(ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.SetSchedule(ctx, "cordoned", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	const room = 10 + 7 + 4 // of 1 CPU: c takes 4 of its 4.5

	var mu sync.Mutex
	placed := map[string]string{} // sandbox → node
	var refusals []error
	var wg sync.WaitGroup
	for s := range 4 {
		sch := New(Config{Store: open(t, u), Refresh: 50 * time.Millisecond})
		defer sch.Close()
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					sb := sandbox(fmt.Sprintf("s%d-g%d-%d", s, g, i), 1)
					d, err := sch.Place(ctx, sb, Request{})
					mu.Lock()
					if err != nil {
						refusals = append(refusals, err)
						mu.Unlock()
						return
					}
					placed[sb.ID] = sb.Node
					mu.Unlock()
					if d.Node != sb.Node || d.Node == "" || d.Candidates[0].Node != d.Node && len(d.Refused) == 0 {
						t.Errorf("%s: on %q, decision %+v", sb.ID, sb.Node, d)
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(placed) != room {
		t.Errorf("placed %d, want %d", len(placed), room)
	}
	for _, err := range refusals {
		var nr *NoRoomError
		if !errors.Is(err, errdefs.ErrUnavailable) || !errors.As(err, &nr) || !strings.Contains(err.Error(), "cluster has no room") {
			t.Errorf("refusal %v (%T), want a NoRoomError", err, err)
		}
	}
	if len(refusals) != 32 {
		t.Errorf("%d refusals, want one per placer (32)", len(refusals))
	}
	t.Logf("a refusal: %v", refusals[0])

	nodes, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"a": 10, "b": 7, "c": 4, "cordoned": 0, "gvisor-only": 0}
	count := map[string]int{}
	for _, n := range placed {
		count[n]++
	}
	for _, n := range nodes {
		if n.Committed.CPU != want[n.Name] || count[n.Name] != int(want[n.Name]) {
			t.Errorf("node %s: committed %+v, placed %d; want %v CPU", n.Name, n.Committed, count[n.Name], want[n.Name])
		}
		if n.Committed.CPU > n.Capacity.CPU {
			t.Errorf("node %s over capacity: %+v of %+v", n.Name, n.Committed, n.Capacity)
		}
	}
	// What the schedulers reported is what the store holds.
	for id, node := range placed {
		sb, err := admin.Get(ctx, id)
		if err != nil || sb.Node != node {
			t.Errorf("%s: stored on %q (%v), reported %q", id, sb.Node, err, node)
		}
	}

	// Room made elsewhere (another API node deleting) is found, though
	// the scheduler's view still shows the cluster full: an exact read
	// before answering no.
	sch := New(Config{Store: open(t, u), Refresh: time.Hour})
	defer sch.Close()
	if _, err := sch.Place(ctx, sandbox("late-1", 1), Request{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("placing into a full cluster: %v", err)
	}
	var freed string
	for id, node := range placed {
		if node == "b" {
			freed = id
			break
		}
	}
	if _, err := admin.Delete(ctx, freed); err != nil {
		t.Fatal(err)
	}
	sb := sandbox("late-2", 1)
	d, err := sch.Place(ctx, sb, Request{})
	if err != nil || sb.Node != "b" || d.Node != "b" {
		t.Fatalf("after a delete on b: on %q, %v; decision %+v", sb.Node, err, d)
	}
}

// TestSchedulerRefusedNodes: a node the view shows with room but the store
// finds full (filled by another API node since the view was read) is
// tried, refused, and the next candidate taken; the decision says so.
func TestSchedulerRefusedNodes(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	admin := open(t, u)
	for _, name := range []string{"a", "b"} {
		if _, err := admin.Join(ctx, store.Node{Name: name, Runtimes: []string{"ns"},
			Capacity: store.Resources{CPU: 2, MemoryMiB: 4096, DiskGiB: 10, Sandboxes: 10}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	sch := New(Config{Store: open(t, u), Refresh: time.Hour})
	defer sch.Close()
	first := sandbox("first", 1)
	if _, err := sch.Place(ctx, first, Request{}); err != nil {
		t.Fatal(err)
	}
	// The scheduler's view: first's node 1/2, the other 0/2, which it
	// prefers next. Another API node fills that one meanwhile.
	other := map[string]string{"a": "b", "b": "a"}[first.Node]
	for i := range 2 {
		sb := sandbox(fmt.Sprintf("behind-%d", i), 1)
		sb.Node = other
		if errs := admin.Place(ctx, []*store.Sandbox{sb}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	sb := sandbox("second", 1)
	d, err := sch.Place(ctx, sb, Request{})
	if err != nil || sb.Node != first.Node || d.Node != first.Node {
		t.Fatalf("placed on %q (%v), want %s; decision %+v", sb.Node, err, first.Node, d)
	}
	if len(d.Refused) != 1 || d.Refused[0] != other {
		t.Errorf("refused %v, want [%s]", d.Refused, other)
	}
	// Now both are full, though the view has not been read again on
	// schedule: no room.
	d, err = sch.Place(ctx, sandbox("third", 1), Request{})
	var nr *NoRoomError
	if !errors.As(err, &nr) || d.Node != "" || d.Excluded["room"] != 2 {
		t.Fatalf("third: %v; decision %+v", err, d)
	}
	t.Logf("third: %v", err)
}

// TestSchedulerContextAndClose: a placement whose context ends before it
// is sent fails with the context's error; after Close, ErrClosed.
func TestSchedulerContextAndClose(t *testing.T) {
	u := database(t)
	admin := open(t, u)
	if _, err := admin.Join(context.Background(), store.Node{Name: "a", Runtimes: []string{"ns"},
		Capacity: store.Resources{CPU: 2, MemoryMiB: 4096, DiskGiB: 10, Sandboxes: 10}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	sch := New(Config{Store: open(t, u)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sch.Place(ctx, sandbox("x", 1), Request{}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	if _, err := admin.Get(context.Background(), "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a canceled placement was recorded: %v", err)
	}
	sch.Close()
	if _, err := sch.Place(context.Background(), sandbox("y", 1), Request{}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// TestSchedulerRequest: what the caller asks beyond the sandbox (selector,
// snapshot node, explanation) reaches the ranking, and what the sandbox
// says (runtime) overrides the request.
func TestSchedulerRequest(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	admin := open(t, u)
	for _, zone := range []string{"a", "b", "c"} {
		if _, err := admin.Join(ctx, store.Node{Name: "node-" + zone, Runtimes: []string{"ns"}, Labels: map[string]string{"zone": zone},
			Capacity: store.Resources{CPU: 8, MemoryMiB: 8192, DiskGiB: 10, Sandboxes: 10}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	sch := New(Config{Store: open(t, u)})
	defer sch.Close()
	for i := range 5 {
		sb := sandbox(fmt.Sprintf("sel-%d", i), 1)
		d, err := sch.Place(ctx, sb, Request{Selector: map[string]string{"zone": "b"}})
		if err != nil || sb.Node != "node-b" || d.Excluded["selector"] != 2 {
			t.Fatalf("selector zone=b: on %q, %v, %+v", sb.Node, err, d)
		}
	}
	sb := sandbox("from-snapshot", 1)
	if _, err := sch.Place(ctx, sb, Request{SnapshotNode: "node-c"}); err != nil || sb.Node != "node-c" {
		t.Fatalf("snapshot on node-c: on %q, %v", sb.Node, err)
	}
	sb = sandbox("explained", 1)
	d, err := sch.Place(ctx, sb, Request{Selector: map[string]string{"zone": "a"}, Explain: true})
	if err != nil || len(d.Filtered) != 2 || d.Filtered[0].Reason != "selector zone=a" || len(d.Candidates) != 1 || len(d.Candidates[0].Parts) != len(terms) {
		t.Fatalf("explained: %v, %s", err, jsonOf(t, d))
	}
	sb = sandbox("gvisor", 1)
	sb.Runtime = "gvisor"
	d, err = sch.Place(ctx, sb, Request{Runtime: "ns"})
	var nr *NoRoomError
	if !errors.As(err, &nr) || d.Excluded["runtime"] != 3 || sb.Node != "" {
		t.Fatalf("gvisor on ns nodes: %v, on %q, %+v", err, sb.Node, d)
	}
	if _, err := admin.Get(ctx, "gvisor"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused placement was recorded: %v", err)
	}
	for _, bad := range []func(*store.Sandbox){
		func(sb *store.Sandbox) { sb.CPU = math.NaN() },
		func(sb *store.Sandbox) { sb.CPU = math.Inf(1) },
		func(sb *store.Sandbox) { sb.CPU = -1 },
		func(sb *store.Sandbox) { sb.MemoryMiB = -1 },
		func(sb *store.Sandbox) { sb.DiskGiB = -5 },
	} {
		sb := sandbox("bad", 1)
		bad(sb)
		if _, err := sch.Place(ctx, sb, Request{}); !errors.Is(err, errdefs.ErrInvalid) || sb.Node != "" {
			t.Errorf("%+v: %v, on %q", sb.Sandbox, err, sb.Node)
		}
	}
}
