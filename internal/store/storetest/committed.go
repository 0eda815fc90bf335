package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// testCommittedSums runs a random mix of every write that changes what a
// sandbox holds on its node (placements cold and warm, a node's own
// creates, state changes and resizes, deletes, a warm sandbox served,
// moves, a node fenced and joining again), and checks after each step
// that what Nodes says each node's sandboxes hold (Committed, which a
// store may keep as running sums) equals the sums of the sandboxes as
// List has them, and that each placement took its node's lowest free slot.
func testCommittedSums(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := mrand.New(mrand.NewPCG(seed, 16))
	nodes := []string{"a", "b", "c"}
	epochs := map[string]int64{}
	for _, name := range nodes {
		n := NewNode(name)
		n.Capacity = store.Resources{CPU: 6, MemoryMiB: 6000, DiskGiB: 60, Sandboxes: 8}
		epochs[name] = join(t, c, n)
	}
	// States a sandbox goes through; a state change is to any of them.
	states := []string{api.StateCreating, api.StateStarting, api.StateRunning, api.StateStopping, api.StatePaused,
		api.StateSuspending, api.StateSuspended, api.StateShelved, api.StateStopped, api.StateArchiving,
		api.StateArchived, api.StateDeleting, api.StateError, store.StatePooled}
	cpus := []float64{0.1, 0.25, 0.3, 1, 1.5}
	warm := map[string]bool{} // the rows of warm placements
	seq := 0
	newSandbox := func(node string) *store.Sandbox {
		seq++
		sb := NewSandbox(fmt.Sprintf("sb%03d", seq))
		sb.Node = node
		sb.CPU = cpus[rnd.IntN(len(cpus))]
		sb.MemoryMiB = int64(64 * (1 + rnd.IntN(8)))
		sb.DiskGiB = int64(1 + rnd.IntN(5))
		return sb
	}
	list := func() []store.Sandbox {
		t.Helper()
		sbs, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return sbs
	}
	// lowestFree is node's lowest slot no sandbox but except holds.
	lowestFree := func(node, except string) int {
		used := map[int]bool{}
		for _, sb := range list() {
			if sb.Node == node && sb.ID != except {
				used[sb.Slot] = true
			}
		}
		s := 0
		for used[s] {
			s++
		}
		return s
	}
	pick := func(f func(store.Sandbox) bool) *store.Sandbox {
		var some []store.Sandbox
		for _, sb := range list() {
			if f(sb) {
				some = append(some, sb)
			}
		}
		if len(some) == 0 {
			return nil
		}
		sb := some[rnd.IntN(len(some))]
		return &sb
	}

	ops := []struct {
		name string
		do   func() string
	}{
		{"place", func() string {
			var batch []*store.Sandbox
			for range 1 + rnd.IntN(4) {
				batch = append(batch, newSandbox(nodes[rnd.IntN(len(nodes))]))
			}
			errs := c.Place(ctx, batch)
			n := 0
			for i, err := range errs {
				if err == nil {
					n++
				} else if !errors.Is(err, store.ErrNoRoom) {
					t.Fatalf("placing %s: %v", batch[i].ID, err)
				}
			}
			if len(batch) == 1 && errs[0] == nil {
				if want := lowestFree(batch[0].Node, batch[0].ID); batch[0].Slot != want {
					t.Fatalf("%s placed in slot %d of %s, want the lowest free, %d", batch[0].ID, batch[0].Slot, batch[0].Node, want)
				}
			}
			return fmt.Sprintf("%d of %d", n, len(batch))
		}},
		{"pool", func() string {
			name := nodes[rnd.IntN(len(nodes))]
			sb := newSandbox(name)
			sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.State = 1, 512, 10, store.StatePooled
			err := c.As(name, epochs[name]).Create(ctx, sb)
			if err != nil && !errors.Is(err, store.ErrNoRoom) {
				t.Fatalf("pooling %s: %v", sb.ID, err)
			}
			return fmt.Sprint(err)
		}},
		{"warm", func() string {
			sb := newSandbox(nodes[rnd.IntN(len(nodes))])
			if p := pick(func(sb store.Sandbox) bool { return sb.State == store.StatePooled }); p != nil {
				sb.Node = p.Node
			}
			sb.Warm = true
			err := c.Place(ctx, []*store.Sandbox{sb})[0]
			switch {
			case err == nil:
				warm[sb.ID] = true
			case !errors.Is(err, store.ErrNoRoom) && !errors.Is(err, store.ErrNoWarm):
				t.Fatalf("warm placement %s: %v", sb.ID, err)
			}
			return fmt.Sprint(err)
		}},
		{"serve", func() string {
			// A node serves a warm placement from one of its pooled sandboxes.
			ws, ok := c.(interface {
				ServeWarm(ctx context.Context, placed string, sb *store.Sandbox, from ...string) error
			})
			placed := pick(func(sb store.Sandbox) bool { return warm[sb.ID] && sb.State == api.StateCreating })
			if !ok || placed == nil {
				return "none"
			}
			pooled := pick(func(sb store.Sandbox) bool { return sb.State == store.StatePooled && sb.Node == placed.Node })
			if pooled == nil {
				return "none pooled"
			}
			delete(warm, placed.ID)
			pooled.State = api.StateRunning
			if err := ws.ServeWarm(ctx, placed.ID, pooled, store.StatePooled); err != nil {
				t.Fatalf("serving %s from %s: %v", placed.ID, pooled.ID, err)
			}
			return placed.ID
		}},
		{"state", func() string {
			sb := pick(func(sb store.Sandbox) bool { return sb.State != api.StateLost })
			if sb == nil {
				return "none"
			}
			from := sb.State
			sb.State = states[rnd.IntN(len(states))]
			switch {
			case sb.State == store.StatePooled:
				// Every pooled sandbox alike: a warm placement counts
				// any one of them as its own.
				sb.CPU, sb.MemoryMiB, sb.DiskGiB = 1, 512, 10
			case rnd.IntN(3) == 0:
				sb.CPU, sb.MemoryMiB = cpus[rnd.IntN(len(cpus))], int64(64*(1+rnd.IntN(8)))
			}
			// A warm placement's row stays warm: creating again, it
			// reserves again (warm is not cleared).
			if err := c.As(sb.Node, epochs[sb.Node]).Update(ctx, sb, from); err != nil {
				t.Fatalf("%s %s to %s: %v", sb.ID, from, sb.State, err)
			}
			return sb.ID + " " + from + " to " + sb.State
		}},
		{"delete", func() string {
			sb := pick(func(store.Sandbox) bool { return true })
			if sb == nil {
				return "none"
			}
			delete(warm, sb.ID)
			if _, err := c.Delete(ctx, sb.ID); err != nil {
				t.Fatalf("deleting %s: %v", sb.ID, err)
			}
			return sb.ID
		}},
		{"move", func() string {
			sb := pick(func(sb store.Sandbox) bool { return sb.State == api.StateArchived || sb.State == api.StateLost })
			if sb == nil {
				return "none"
			}
			to := nodes[rnd.IntN(len(nodes))]
			got, err := c.Move(ctx, sb.ID, sb.Node, to, "drain")
			switch {
			case err == nil:
				if want := lowestFree(to, sb.ID); got.Slot != want {
					t.Fatalf("%s moved into slot %d of %s, want the lowest free, %d", sb.ID, got.Slot, to, want)
				}
			case !errors.Is(err, store.ErrNoRoom) && to != sb.Node:
				t.Fatalf("moving %s from %s to %s: %v", sb.ID, sb.Node, to, err)
			}
			return fmt.Sprintf("%s to %s: %v", sb.ID, to, err)
		}},
		{"fence", func() string {
			// A node's lease runs out: fenced, its sandboxes lost; it joins
			// again, under a new epoch, with them.
			name := nodes[rnd.IntN(len(nodes))]
			n := NewNode(name)
			n.Capacity = store.Resources{CPU: 6, MemoryMiB: 6000, DiskGiB: 60, Sandboxes: 8}
			if _, err := c.Join(ctx, n, time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Expire(ctx, time.Now().Add(time.Minute), "lease expired"); err != nil {
				t.Fatal(err)
			}
			epochs[name] = join(t, c, n)
			return name
		}},
	}
	// Resources no sum could hold are refused, not added.
	bad := placed(t, c, "bad", "a")
	for _, cpu := range []float64{math.NaN(), math.Inf(1), -1} {
		b := *bad
		b.CPU, b.State = cpu, api.StateRunning
		if err := c.Update(ctx, &b, api.StateCreating); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("update to %v CPU: %v, want ErrInvalid", cpu, err)
		}
	}
	if _, err := c.Delete(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	weights := []int{6, 2, 2, 2, 8, 3, 2, 1}
	var total int
	for _, w := range weights {
		total += w
	}
	for step := range 150 {
		k, r := 0, rnd.IntN(total)
		for r >= weights[k] {
			r -= weights[k]
			k++
		}
		what := ops[k].do()
		checkCommitted(t, c, list(), warm, fmt.Sprintf("step %d, %s %s", step, ops[k].name, what))
		if t.Failed() {
			return
		}
	}
}

// checkCommitted compares each node's Committed with the sums of sbs, the
// sandboxes as listed (warm: the rows of warm placements; each still
// creating counts one pooled sandbox of its node, of its template version
// and runtime, as its own).
func checkCommitted(t *testing.T, c store.Cluster, sbs []store.Sandbox, warm map[string]bool, after string) {
	t.Helper()
	want := map[string]store.Resources{}
	type key struct{ node, version, runtime string }
	pooled, reserved := map[key]int{}, map[key]int{}
	pooledHolds := map[key]store.Resources{}
	for _, sb := range sbs {
		w := want[sb.Node]
		compute, slot := store.Holds(sb.State)
		if compute {
			w.CPU += sb.CPU
			w.MemoryMiB += sb.MemoryMiB
		}
		if slot {
			w.DiskGiB += sb.DiskGiB
			w.Sandboxes++
		}
		want[sb.Node] = w
		k := key{sb.Node, sb.TemplateVersion, sb.Runtime}
		switch {
		case sb.State == store.StatePooled:
			pooled[k]++
			pooledHolds[k] = store.Resources{CPU: sb.CPU, MemoryMiB: sb.MemoryMiB, DiskGiB: sb.DiskGiB, Sandboxes: 1}
		case sb.State == api.StateCreating && warm[sb.ID]:
			reserved[k]++
		}
	}
	for k, n := range pooled {
		n = min(n, reserved[k])
		w, h := want[k.node], pooledHolds[k]
		w.CPU -= float64(n) * h.CPU
		w.MemoryMiB -= int64(n) * h.MemoryMiB
		w.DiskGiB -= int64(n) * h.DiskGiB
		w.Sandboxes -= n
		want[k.node] = w
	}
	ns, err := c.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range ns {
		names = append(names, n.Name)
		got, w := n.Committed, want[n.Name]
		if got.MemoryMiB != w.MemoryMiB || got.DiskGiB != w.DiskGiB || got.Sandboxes != w.Sandboxes || math.Abs(got.CPU-w.CPU) > 1e-9 {
			t.Errorf("after %s: node %s holds %+v, its sandboxes' sums are %+v", after, n.Name, got, w)
		}
	}
	for node := range want {
		if !slices.Contains(names, node) {
			t.Errorf("after %s: sandboxes on %q, which Nodes does not have", after, node)
		}
	}
}

// testCommittedConcurrent: writers on the same nodes at once (placements,
// state changes that free or take compute, resizes, deletes) leave each
// node's Committed equal to the sums of its sandboxes, however their
// transactions interleave.
func testCommittedConcurrent(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	nodes := []string{"a", "b", "c"}
	epochs := map[string]int64{}
	for _, name := range nodes {
		n := NewNode(name)
		n.Capacity = store.Resources{CPU: 1000, MemoryMiB: 1 << 30, DiskGiB: 1 << 30, Sandboxes: 1000}
		epochs[name] = join(t, c, n)
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(uint64(g), 2))
			var mine []*store.Sandbox
			for i := range 15 {
				var batch []*store.Sandbox
				for j := range 3 {
					sb := NewSandbox(fmt.Sprintf("g%d-%d-%d", g, i, j))
					sb.Node = nodes[r.IntN(len(nodes))]
					sb.CPU = []float64{0.1, 0.25, 1}[r.IntN(3)]
					batch = append(batch, sb)
				}
				for j, err := range c.Place(ctx, batch) {
					if err != nil {
						t.Errorf("placing %s: %v", batch[j].ID, err)
						return
					}
					mine = append(mine, batch[j])
				}
				sb := mine[r.IntN(len(mine))]
				switch r.IntN(3) {
				case 0: // a delete
					if _, err := c.Delete(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
						t.Errorf("deleting %s: %v", sb.ID, err)
					}
				default: // a state change, through its node, maybe a resize
					cur, err := c.Get(ctx, sb.ID)
					if errors.Is(err, errdefs.ErrNotFound) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					next := cur
					next.State = []string{api.StateRunning, api.StateStopped, api.StateArchived, api.StatePaused}[r.IntN(4)]
					if r.IntN(2) == 0 {
						next.CPU = []float64{0.1, 0.25, 1}[r.IntN(3)]
					}
					if err := c.As(cur.Node, epochs[cur.Node]).Update(ctx, &next, cur.State); err != nil {
						t.Errorf("%s %s to %s: %v", sb.ID, cur.State, next.State, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	all, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkCommitted(t, c, all, nil, "concurrent writes")
}
