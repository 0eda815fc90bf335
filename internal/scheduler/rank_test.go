package scheduler

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/store"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// node is a live, schedulable node with room for 8 sandboxes of 1 CPU and
// 1 GiB, offering ns and gvisor; opts change it.
func node(name string, opts ...func(*store.Node)) store.Node {
	n := store.Node{
		Name: name, Runtimes: []string{"ns", "gvisor"}, Labels: map[string]string{},
		Capacity: store.Resources{CPU: 8, MemoryMiB: 8192, DiskGiB: 80, Sandboxes: 8},
		State:    store.NodeLive, LeaseExpires: now.Add(10 * time.Second),
	}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func committed(cpu float64, mem int64, count int) func(*store.Node) {
	return func(n *store.Node) {
		n.Committed = store.Resources{CPU: cpu, MemoryMiB: mem, DiskGiB: int64(count), Sandboxes: count}
	}
}

func label(k, v string) func(*store.Node) {
	return func(n *store.Node) { n.Labels[k] = v }
}

func req(id string) Request {
	return Request{Sandbox: id, CPU: 1, MemoryMiB: 1024, DiskGiB: 1, Runtime: "ns"}
}

func names(cs []Candidate) []string {
	var s []string
	for _, c := range cs {
		s = append(s, c.Node)
	}
	return s
}

func TestRankFilters(t *testing.T) {
	nodes := []store.Node{
		node("ok"),
		node("cordoned", func(n *store.Node) { n.Schedule = store.NodeCordoned }),
		node("draining", func(n *store.Node) { n.Schedule = store.NodeDraining }),
		node("fenced", func(n *store.Node) { n.State = store.NodeFenced }),
		node("expired", func(n *store.Node) { n.LeaseExpires = now.Add(-12 * time.Second) }),
		node("expiring-now", func(n *store.Node) { n.LeaseExpires = now }),
		node("ns-only", func(n *store.Node) { n.Runtimes = []string{"ns"} }),
		node("zone-a", label("zone", "a")),
		node("cpu-full", committed(7.5, 1024, 2)),
		node("mem-full", committed(1, 7900, 1)),
		node("count-full", committed(1, 1024, 8)),
		node("all-full", committed(8, 8192, 8)),
		node("refused", label("zone", "b")),
	}
	r := req("sb1")
	r.Runtime = "gvisor"
	r.Selector = map[string]string{"zone": "b"}
	r.Avoid = []string{"refused"}
	// Only "ok"... lacks zone=b: give it the label so that it passes.
	nodes[0].Labels["zone"] = "b"
	for i := range nodes[8:12] {
		nodes[8+i].Labels["zone"] = "b"
	}
	d := Rank(nodes, r, now)
	want := []Filtered{
		{"cordoned", "schedule", "cordoned"},
		{"draining", "schedule", "draining"},
		{"fenced", "state", "fenced"},
		{"expired", "lease", "lease expired 12s ago"},
		{"expiring-now", "lease", "lease expired 0s ago"},
		{"ns-only", "runtime", "no runtime gvisor"},
		{"zone-a", "selector", "selector zone=b"},
		{"cpu-full", "room", "no room: cpu 7.5/8 + 1"},
		{"mem-full", "room", "no room: memory_mib 7900/8192 + 1024"},
		{"count-full", "room", "no room: sandboxes 8/8 + 1"},
		{"all-full", "room", "no room: cpu 8/8 + 1, memory_mib 8192/8192 + 1024, disk_gib 8/80 + 1, sandboxes 8/8 + 1"},
		{"refused", "avoid", "refused the placement"},
	}
	// disk_gib 8/80 + 1 fits: it must not be listed.
	want[10].Reason = "no room: cpu 8/8 + 1, memory_mib 8192/8192 + 1024, sandboxes 8/8 + 1"
	if diff := cmp.Diff(want, d.Filtered); diff != "" {
		t.Errorf("filtered (-want +got):\n%s", diff)
	}
	if got := names(d.Candidates); !slices.Equal(got, []string{"ok"}) || d.Passed != 1 {
		t.Errorf("candidates %v (passed %d), want [ok]", got, d.Passed)
	}
	wantCounts := map[string]int{"schedule": 2, "state": 1, "lease": 2, "runtime": 1, "selector": 4, "room": 4, "avoid": 1}
	// The ns-only and expired nodes fail earlier filters than the
	// selector; only zone-a, and those without the label, fail it.
	wantCounts["selector"] = 1
	if diff := cmp.Diff(wantCounts, d.Excluded); diff != "" {
		t.Errorf("excluded (-want +got):\n%s", diff)
	}

	// A snapshot's node is the only one a create from it can go to.
	r = req("sb2")
	r.SnapshotNode = "b"
	d = Rank([]store.Node{node("a"), node("b"), node("c")}, r, now)
	if got := names(d.Candidates); !slices.Equal(got, []string{"b"}) {
		t.Errorf("with a snapshot on b: candidates %v", got)
	}
	if d.Filtered[0].Reason != "snapshot is on node b" {
		t.Errorf("snapshot reason %q", d.Filtered[0].Reason)
	}

	// Nothing fits: no candidates, an empty (not null) list.
	d = Rank([]store.Node{node("full", committed(8, 0, 0))}, req("sb3"), now)
	if d.Candidates == nil || len(d.Candidates) != 0 || d.Passed != 0 {
		t.Errorf("no room: %+v", d)
	}
	d = Rank(nil, req("sb4"), now)
	if len(d.Candidates) != 0 || len(d.Filtered) != 0 {
		t.Errorf("no nodes: %+v", d)
	}
}

// TestRankFractionalCPU: sums of tenths of a CPU that reach the capacity
// exactly fit, whatever the floating point rounding.
func TestRankFractionalCPU(t *testing.T) {
	n := node("a", func(n *store.Node) { n.Capacity.CPU = 0.3; n.Committed.CPU = 0.1 + 0.1 })
	r := req("sb")
	r.CPU = 0.1
	if d := Rank([]store.Node{n}, r, now); d.Passed != 1 {
		t.Errorf("0.1+0.1+0.1 in 0.3: %+v", d.Filtered)
	}
	r.CPU = 0.11
	if d := Rank([]store.Node{n}, r, now); d.Passed != 0 {
		t.Errorf("0.1+0.1+0.11 in 0.3 passed")
	}
}

func TestRankPreferences(t *testing.T) {
	withTemplate := func(v string) func(*store.Node) {
		return func(n *store.Node) { n.Status.Templates = append(n.Status.Templates, v) }
	}
	pooled := func(v string, c int) func(*store.Node) {
		return func(n *store.Node) { n.Status.Pooled = map[string]int{v: c} }
	}
	tv := func(r Request, v string) Request { r.TemplateVersion = v; return r }
	spread := func(r Request, k string) Request { r.Spread = k; return r }
	big := func(n *store.Node) {
		n.Capacity = store.Resources{CPU: 16, MemoryMiB: 16384, DiskGiB: 160, Sandboxes: 16}
	}
	tests := []struct {
		name  string
		nodes []store.Node
		req   Request
		first string
	}{
		{"emptier node", []store.Node{node("busy", committed(4, 4096, 4)), node("idle")}, req("x"), "idle"},
		{"layers held beat a moderately emptier node",
			[]store.Node{node("idle"), node("local", committed(3, 3072, 3), withTemplate("v1"))}, tv(req("x"), "v1"), "local"},
		{"a much emptier node beats layers held",
			[]store.Node{node("idle"), node("local", committed(6, 6144, 6), withTemplate("v1"))}, tv(req("x"), "v1"), "idle"},
		{"a warm sandbox beats layers and room",
			[]store.Node{node("idle", withTemplate("v1")), node("warm", committed(6, 6144, 6), pooled("v1", 1))}, tv(req("x"), "v1"), "warm"},
		{"a pool of another template counts for nothing",
			[]store.Node{node("idle"), node("warm", committed(6, 6144, 6), pooled("v2", 3))}, tv(req("x"), "v1"), "idle"},
		{"an empty pool counts for nothing",
			[]store.Node{node("idle"), node("warm", committed(6, 6144, 6), pooled("v1", 0))}, tv(req("x"), "v1"), "idle"},
		{"the built-in template's pool",
			[]store.Node{node("idle"), node("warm", committed(6, 6144, 6), pooled("", 2))}, req("x"), "warm"},
		// a1 is emptier than b1 (13/16 free after, against 6/8), but zone
		// a holds 2 sandboxes per node and zone b 1.
		{"without spread: the emptier node",
			[]store.Node{node("a1", label("zone", "a"), big, committed(2, 2048, 2)), node("b1", label("zone", "b"), committed(1, 1024, 1))},
			req("x"), "a1"},
		{"spread: the zone with fewer sandboxes per node",
			[]store.Node{node("a1", label("zone", "a"), big, committed(2, 2048, 2)), node("b1", label("zone", "b"), committed(1, 1024, 1))},
			spread(req("x"), "zone"), "b1"},
		{"spread: a node without the label loses",
			[]store.Node{node("nolabel"), node("b1", label("zone", "b"), committed(1, 1024, 1))},
			spread(req("x"), "zone"), "b1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Rank(tt.nodes, tt.req, now)
			if len(d.Candidates) == 0 || d.Candidates[0].Node != tt.first {
				t.Fatalf("first %v, want %s; decision %s", names(d.Candidates), tt.first, jsonOf(t, d))
			}
			checkOrder(t, d)
		})
	}
}

// checkOrder checks a decision's order: the two drawn, the better first;
// then the rest of the window; then the others by score.
func checkOrder(t *testing.T, d Decision) {
	t.Helper()
	for i := 1; i < len(d.Candidates); i++ {
		a, b := d.Candidates[i-1], d.Candidates[i]
		switch {
		case !a.Window && b.Window, !a.Drawn && b.Drawn,
			a.Drawn && b.Drawn && a.Score < b.Score,
			!a.Window && !b.Window && a.Score < b.Score:
			t.Errorf("out of order: %+v before %+v", a, b)
		}
	}
	drawn := 0
	for _, c := range d.Candidates {
		if c.Drawn {
			drawn++
		}
	}
	if want := min(2, len(d.Candidates)); drawn != want && len(d.Candidates) > 0 && d.Candidates[1%len(d.Candidates)].Window {
		t.Errorf("%d drawn, want %d: %+v", drawn, want, d.Candidates)
	}
}

// TestRankSpreadValues checks the spread term's values: 1 for the least
// loaded group, falling with load relative to the most loaded.
func TestRankSpreadValues(t *testing.T) {
	nodes := []store.Node{
		node("a1", label("zone", "a"), committed(4, 4096, 4)),
		node("b1", label("zone", "b"), committed(2, 2048, 2)),
		node("c1", label("zone", "c")),
	}
	r := req("x")
	r.Spread = "zone"
	d := Rank(nodes, r, now)
	got := map[string]float64{}
	for _, c := range d.Candidates {
		for _, p := range c.Parts {
			if p.Term == "spread" {
				got[c.Node] = p.Value
			}
		}
	}
	if diff := cmp.Diff(map[string]float64{"a1": 0, "b1": 0.5, "c1": 1}, got); diff != "" {
		t.Errorf("spread values (-want +got):\n%s", diff)
	}
	if names(d.Candidates)[0] != "c1" {
		t.Errorf("first %v", names(d.Candidates))
	}
}

// TestRankTies: equal nodes are chosen evenly over many sandboxes, the same
// way each time for one sandbox, and a node outside the band never comes
// first.
func TestRankTies(t *testing.T) {
	var nodes []store.Node
	for i := range 10 {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i)))
	}
	nodes = append(nodes, node("busy", committed(4, 4096, 4))) // a half of a node more loaded: out of the window
	firsts := map[string]int{}
	for i := range 5000 {
		id := fmt.Sprintf("sb-%d", i)
		d := Rank(nodes, req(id), now)
		firsts[d.Candidates[0].Node]++
		if i < 20 {
			again := Rank(nodes, req(id), now)
			if !slices.Equal(names(d.Candidates), names(again.Candidates)) {
				t.Fatalf("%s: %v then %v", id, names(d.Candidates), names(again.Candidates))
			}
			if last := d.Candidates[len(d.Candidates)-1]; last.Node != "busy" || last.Window {
				t.Errorf("%s: last %+v, want busy, out of the window", id, last)
			}
			checkOrder(t, d)
		}
	}
	if firsts["busy"] != 0 {
		t.Errorf("busy first %d times", firsts["busy"])
	}
	for i := range 10 {
		// 500 expected each; a hash that favours some nodes shows here.
		if c := firsts[fmt.Sprintf("n%d", i)]; c < 400 || c > 600 {
			t.Errorf("n%d first %d times of 5000: %v", i, c, firsts)
		}
	}
	// Two sandboxes' orders differ: the choice in the window is per
	// sandbox.
	a, b := Rank(nodes, req("sb-a"), now), Rank(nodes, req("sb-b"), now)
	if slices.Equal(names(a.Candidates), names(b.Candidates)) {
		t.Errorf("sb-a and sb-b ranked alike: %v", names(a.Candidates))
	}
}

// TestRankTwoChoices: among nodes of the window, loaded unevenly, the less
// loaded are chosen more often, but not always: the better of two drawn
// nodes goes first, so the most loaded never does, and node i of n (by
// load) in 2(n-1-i)/(n(n-1)) of placements.
func TestRankTwoChoices(t *testing.T) {
	var nodes []store.Node
	for i := range 10 {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i), func(n *store.Node) {
			n.Capacity = store.Resources{CPU: 128, MemoryMiB: 131072, DiskGiB: 1280, Sandboxes: 128} // all within the window
			n.Committed = store.Resources{CPU: float64(i), MemoryMiB: int64(i) * 1024, DiskGiB: int64(i), Sandboxes: i}
		}))
	}
	firsts := make([]int, 10)
	for i := range 10000 {
		d := Rank(nodes, req(fmt.Sprintf("sb-%d", i)), now)
		if !d.Candidates[0].Drawn || !d.Candidates[1].Drawn || !d.Candidates[9].Window {
			t.Fatalf("not drawn in the window: %+v", d.Candidates)
		}
		var k int
		fmt.Sscanf(d.Candidates[0].Node, "n%d", &k)
		firsts[k]++
	}
	for i, c := range firsts {
		want := 2 * (9 - i) * 10000 / 90 // 2000, 1777, ..., 222, 0
		if c < want-250 || c > want+250 || i == 9 && c != 0 {
			t.Errorf("n%d first %d times of 10000, want about %d: %v", i, c, want, firsts)
		}
	}
}

// TestRankKeep: the scheduler's partial ranking lists the same first
// candidates as the full one, in the same order.
func TestRankKeep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var nodes []store.Node
		for i := range 1 + rng.IntN(60) {
			c := rng.IntN(9)
			n := node(fmt.Sprintf("n%d", i), committed(float64(c), int64(c)*1024, c))
			if rng.IntN(3) == 0 {
				n.Status.Templates = []string{"v1"}
			}
			nodes = append(nodes, n)
		}
		r := req(fmt.Sprintf("sb%d", round))
		r.TemplateVersion = "v1"
		full := rank(nodes, &r, now, options{explain: true})
		for _, keep := range []int{1, 3, 8} {
			part := rank(nodes, &r, now, options{keep: keep})
			want := full.Candidates[:min(keep, len(full.Candidates))]
			if diff := cmp.Diff(want, part.Candidates); diff != "" {
				t.Fatalf("round %d keep %d (-full +partial):\n%s", round, keep, diff)
			}
			if part.Passed != full.Passed || len(part.Filtered) != 0 || !cmp.Equal(part.Excluded, full.Excluded) {
				t.Fatalf("round %d keep %d: passed %d excluded %v; full %d %v", round, keep, part.Passed, part.Excluded, full.Passed, full.Excluded)
			}
		}
	}
}

// TestRankCached: a scheduler's cached class (options.gens) ranks as a
// fresh ranking does while nodes change under it, each change with its
// generation.
func TestRankCached(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var nodes []store.Node
	for i := range 40 {
		c := rng.IntN(9)
		nodes = append(nodes, node(fmt.Sprintf("n%d", i), committed(float64(c), int64(c)*1024, c)))
	}
	gens := make([]uint32, len(nodes))
	for i := range gens {
		gens[i] = 1
	}
	r := req("x")
	cl, sc := newClass(nodes, &r, now, nil), &scratch{}
	for round := range 500 {
		r.Sandbox = fmt.Sprintf("sb%d", round)
		i := rng.IntN(len(nodes))
		c := rng.IntN(9)
		nodes[i].Committed = store.Resources{CPU: float64(c), MemoryMiB: int64(c) * 1024, DiskGiB: int64(c), Sandboxes: c}
		if rng.IntN(4) == 0 {
			nodes[i].Status.Pooled = map[string]int{"": rng.IntN(2)}
		}
		gens[i]++
		want := rank(nodes, &r, now, options{keep: 8})
		got := rank(nodes, &r, now, options{keep: 8, class: cl, scratch: sc, gens: gens})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d (-fresh +cached):\n%s", round, diff)
		}
	}
}

// TestDecisionJSON: a decision is the API's placement record: it survives
// JSON as it is.
func TestDecisionJSON(t *testing.T) {
	nodes := []store.Node{node("a"), node("b", committed(8, 0, 0)), node("c", func(n *store.Node) { n.Status.Templates = []string{"v1"} })}
	r := req("sb")
	r.TemplateVersion = "v1"
	d := Rank(nodes, r, now)
	var back Decision
	if err := json.Unmarshal([]byte(jsonOf(t, d)), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d, back); diff != "" {
		t.Errorf("JSON round trip (-before +after):\n%s", diff)
	}
	if back.Candidates[0].Node != "c" || back.Candidates[0].Parts[1] != (Part{"locality", 1, 0.5}) {
		t.Errorf("decision %s", jsonOf(t, d))
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkRank1000 is the scheduler's ranking of one placement on a
// thousand nodes, as the scale benchmark does it fifty thousand times.
func BenchmarkRank1000(b *testing.B) {
	var nodes []store.Node
	for i := range 1000 {
		nodes = append(nodes, node(fmt.Sprintf("node-%04d", i), label("zone", fmt.Sprint(i%3)), committed(float64(i%5), int64(i%5)*1024, i%5)))
	}
	r := req("")
	r.Spread = "zone"
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r.Sandbox = fmt.Sprintf("sb-%d", i)
			rank(nodes, &r, now, options{keep: 8})
		}
	})
	b.Run("class cached", func(b *testing.B) {
		cl, sc := newClass(nodes, &r, now, nil), &scratch{}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r.Sandbox = fmt.Sprintf("sb-%d", i)
			rank(nodes, &r, now, options{keep: 8, class: cl, scratch: sc})
		}
	})
	b.Run("scores cached, no spread", func(b *testing.B) {
		r := r
		r.Spread = ""
		gens := make([]uint32, len(nodes))
		cl, sc := newClass(nodes, &r, now, nil), &scratch{}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r.Sandbox = fmt.Sprintf("sb-%d", i)
			gens[i%len(gens)]++ // a placement changes one node
			rank(nodes, &r, now, options{keep: 8, class: cl, scratch: sc, gens: gens})
		}
	})
}
