package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
)

// warmCluster joins nodes a, b and c (10 CPUs each) and starts pooled
// sandboxes of the built-in template on them as warm says, through each
// node's own view as a node's pools do.
func warmCluster(t *testing.T, u string, warm map[string]int) *postgres.Store {
	t.Helper()
	ctx := context.Background()
	admin := open(t, u)
	for _, name := range []string{"a", "b", "c"} {
		n := store.Node{Name: name, Runtimes: []string{"ns"},
			Capacity: store.Resources{CPU: 10, MemoryMiB: 1 << 20, DiskGiB: 100, Sandboxes: 100}}
		e, err := admin.Join(ctx, n, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for i := range warm[name] {
			sb := sandbox(fmt.Sprintf("pool-%s%d", name, i), 1)
			sb.State, sb.Node = store.StatePooled, name
			if err := admin.As(name, e).Create(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
	}
	return admin
}

// record is sandbox id's placement record, as stored.
func record(t *testing.T, st *postgres.Store, id string) Decision {
	t.Helper()
	raw, err := st.Placement(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSchedulerWarmFirst: a burst placed one by one takes the warm
// sandboxes first, each reserved once (the records say warm, on the nodes
// holding them), then starts cold, spread over every node.
func TestSchedulerWarmFirst(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	admin := warmCluster(t, u, map[string]int{"b": 3, "c": 2})
	sch := New(Config{Store: open(t, u), Refresh: time.Hour})
	defer sch.Close()
	warmOn := map[string]int{}
	coldOn := map[string]int{}
	for i := range 11 {
		sb := sandbox(fmt.Sprintf("s%02d", i), 1)
		d, err := sch.Place(ctx, sb, Request{})
		if err != nil {
			t.Fatal(err)
		}
		rec := record(t, admin, sb.ID)
		if rec.Warm != d.Warm || rec.Node != sb.Node {
			t.Errorf("%s: record says warm %v on %s, placement warm %v on %s", sb.ID, rec.Warm, rec.Node, d.Warm, sb.Node)
		}
		if i < 5 != d.Warm {
			t.Errorf("placement %d warm %v on %s, want the first 5 warm: %s", i, d.Warm, sb.Node, jsonOf(t, d))
		}
		if d.Warm {
			warmOn[sb.Node]++
		} else {
			coldOn[sb.Node]++
		}
	}
	if warmOn["b"] != 3 || warmOn["c"] != 2 || warmOn["a"] != 0 {
		t.Errorf("warm placements by node %v, want b 3, c 2", warmOn)
	}
	for _, n := range []string{"a", "b", "c"} {
		if coldOn[n] == 0 {
			t.Errorf("no cold start on node %s: %v", n, coldOn)
		}
	}
	nodes, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if len(n.Status.Pooled) != 0 {
			t.Errorf("node %s shows unreserved warm sandboxes %v after the burst", n.Name, n.Status.Pooled)
		}
	}
}

// TestSchedulerWarmConcurrent: four schedulers (four API nodes), each
// with a view read once before any of them placed, all see the same five
// warm sandboxes; placing at once, the store reserves each once, the rest
// are placed cold (told ErrNoWarm, ranked again), and none fails.
func TestSchedulerWarmConcurrent(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	admin := warmCluster(t, u, map[string]int{"b": 3, "c": 2})
	var scheds []*Scheduler
	for range 4 {
		sch := New(Config{Store: open(t, u), Refresh: time.Hour})
		defer sch.Close()
		// Its view is read before the first placement.
		if _, err := sch.Place(ctx, &store.Sandbox{}, Request{}); err == nil {
			t.Fatal("an invalid placement went through")
		}
		scheds = append(scheds, sch)
	}
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for s, sch := range scheds {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb := sandbox(fmt.Sprintf("s%d-%d", s, g), 1)
				if _, err := sch.Place(ctx, sb, Request{}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, sb.ID)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	warmOn := map[string]int{}
	for _, id := range ids {
		if rec := record(t, admin, id); rec.Warm {
			warmOn[rec.Node]++
		}
	}
	// Each pooled sandbox is reserved once, and every one is used: the
	// store refuses a warm placement only once a node has none left.
	if warmOn["b"] != 3 || warmOn["c"] != 2 || warmOn["a"] != 0 {
		t.Errorf("warm placements by node %v, want b 3, c 2", warmOn)
	}
	var noWarm int64
	for _, sch := range scheds {
		noWarm += sch.Stats().NoWarm
	}
	t.Logf("warm placements %v of %d; %d refused a warm sandbox and placed again", warmOn, len(ids), noWarm)
	if noWarm == 0 {
		t.Errorf("no warm placement was refused: the schedulers did not compete for the warm sandboxes")
	}
	if len(ids) != 16 {
		t.Errorf("placed %d of 16", len(ids))
	}
}

// TestRankWarmRoom: a full node whose last room a warm sandbox of the
// template holds can take a placement of that template (it replaces the
// warm sandbox, as the store counts it), not one of another template.
func TestRankWarmRoom(t *testing.T) {
	full := node("full", committed(8, 8192, 8), func(n *store.Node) {
		n.Status.Pooled = map[string]int{"v1": 1}
		n.PooledHolds = store.Resources{CPU: 1, MemoryMiB: 1024, DiskGiB: 1, Sandboxes: 1}
	})
	r := req("x")
	r.TemplateVersion = "v1"
	d := Rank([]store.Node{full}, r, now)
	if len(d.Candidates) != 1 || !pooled(d.Candidates[0]) {
		t.Errorf("a warm placement on a node full but for its warm sandbox: %s", jsonOf(t, d))
	}
	// Warm sandboxes are of one runtime: a create of another starts cold.
	r.Runtime = "gvisor"
	full.PooledRuntime = "ns"
	if d = Rank([]store.Node{full}, r, now); len(d.Candidates) != 0 {
		t.Errorf("a gvisor placement on a node whose warm sandbox is ns: %s", jsonOf(t, d))
	}
	r.Runtime = "ns"
	r.TemplateVersion = "v2"
	d = Rank([]store.Node{full}, r, now)
	if len(d.Candidates) != 0 || len(d.Filtered) != 1 || d.Filtered[0].Filter != "room" {
		t.Errorf("a cold placement on a full node: %s", jsonOf(t, d))
	}
}
