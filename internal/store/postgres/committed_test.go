package postgres

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/storetest"
)

// TestHoldsSQL: the SQL functions the triggers sum by (migration 0013) say
// what store.Holds says of every state: each of api's State constants (read
// from its source, so that a state added there is checked here), pooled
// and prestarted, and one no code knows.
func TestHoldsSQL(t *testing.T) {
	serverURL(t)
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	st := openStore(t, u)
	defer st.Close()
	f, err := parser.ParseFile(token.NewFileSet(), "../../../api/api.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	states := []string{store.StatePooled, store.StatePrestarted, "no such state"}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Names) == 1 && strings.HasPrefix(vs.Names[0].Name, "State") && len(vs.Values) == 1 {
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				states = append(states, s)
			}
		}
		return true
	})
	if len(states) < 15 {
		t.Fatalf("found only %d states in api/api.go: %v", len(states), states)
	}
	for _, s := range states {
		var compute, slot bool
		if err := st.pool.QueryRow(context.Background(), `SELECT holds_compute($1), holds_slot($1)`, s).Scan(&compute, &slot); err != nil {
			t.Fatal(err)
		}
		if c, sl := store.Holds(s); c != compute || sl != slot {
			t.Errorf("state %q: SQL holds compute %v, slot %v; store.Holds says %v, %v", s, compute, slot, c, sl)
		}
	}
}

// TestNodeCommittedBackfill: a database with sandboxes from before the
// kept sums (schema 12) gets them summed by the migration that adds them.
func TestNodeCommittedBackfill(t *testing.T) {
	serverURL(t)
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	ctx := context.Background()
	all, err := steps()
	if err != nil {
		t.Fatal(err)
	}
	// The schema as atoll had it before, with two nodes' sandboxes in it.
	var before []string
	for _, s := range all {
		if s.version < 13 {
			before = append(before, s.sql)
		}
	}
	admin(t, u, `CREATE TABLE schema_version (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
		`+strings.Join(before, ";\n")+`;
		INSERT INTO schema_version (version, name) SELECT g, 'step' FROM generate_series(1, 12) g;`)
	for i, row := range []struct {
		node, state string
		slot        int
		cpu         float64
	}{{"a", "running", 0, 0.1}, {"a", "stopped", 1, 0.2}, {"a", "archived", 3, 1}, {"b", "running", 0, 0.3}, {"b", "lost", 1, 1}} {
		admin(t, u, `INSERT INTO sandboxes (id, state, template, template_version, runtime, cpu, memory_mib, disk_gib, pids, env, labels,
			error, slot, created_at, node, tenant) VALUES ($1, $2, '', '', 'ns', $3, 100, 2, 0, '{}', '{}', '', $4, now(), $5, 'default')`,
			"sb"+strconv.Itoa(i), row.state, row.cpu, row.slot, row.node)
	}
	st := openStore(t, u)
	defer st.Close()
	for _, name := range []string{"a", "b"} {
		n := storetest.NewNode(name)
		if _, err := st.Join(ctx, n, 3600e9); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := st.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]store.Resources{
		"a": {CPU: 0.1, MemoryMiB: 100, DiskGiB: 4, Sandboxes: 2},
		"b": {CPU: 0.3, MemoryMiB: 100, DiskGiB: 2, Sandboxes: 1},
	}
	for _, n := range ns {
		if n.Committed != want[n.Name] {
			t.Errorf("node %s holds %+v, want %+v", n.Name, n.Committed, want[n.Name])
		}
	}
	// a's slots are 0, 1 and 3: the next placement there takes 2, then 4.
	for _, wantSlot := range []int{2, 4} {
		sb := storetest.NewSandbox("new" + strconv.Itoa(wantSlot))
		sb.Node = "a"
		if err := st.Place(ctx, []*store.Sandbox{sb})[0]; err != nil {
			t.Fatal(err)
		}
		if sb.Slot != wantSlot {
			t.Errorf("placed in slot %d of a, want %d", sb.Slot, wantSlot)
		}
	}
}

// TestCommittedContention: writes that change what nodes' sandboxes hold
// beside bursts of placements on the same nodes. The kept sums
// (node_committed) are one row a node, which every such write updates; the
// count of attempts refused for a concurrent transaction (a serialization
// failure, a deadlock) and run again says whether the writers queue on
// that row's lock, as they should, or refuse each other.
//
// First state changes and deletes, each writer on sandboxes of its own,
// warm sandboxes served, and transactions that write two sandboxes on two
// nodes, in either order: read committed, none is refused. Serializable,
// 520-670 of 560 were (without the warm ones) (storetest's CommittedConcurrent: 43-73 of ~90). Then moves of two
// sandboxes at once, which stay serializable: they may be refused for a
// concurrent update (and run again), never for a deadlock with a
// placement (without UpdateAll's locks of the nodes moved to first, 1-18).
// The sums stay exact throughout.
func TestCommittedContention(t *testing.T) {
	serverURL(t)
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	st := openStore(t, u)
	defer st.Close()
	ctx := context.Background()
	n := storetest.NewNode("n")
	n.Capacity = store.Resources{CPU: 1e6, MemoryMiB: 1e9, DiskGiB: 1e9, Sandboxes: 1e6}
	epoch, err := st.Join(ctx, n, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	as := st.As("n", epoch).(*Store)
	m := storetest.NewNode("m")
	m.Capacity = n.Capacity
	if _, err := st.Join(ctx, m, time.Hour); err != nil {
		t.Fatal(err)
	}
	place := func(sbs ...*store.Sandbox) bool {
		for _, err := range st.Place(ctx, sbs) {
			if err != nil {
				t.Error(err)
				return false
			}
		}
		return true
	}
	const rounds = 40
	var wg sync.WaitGroup
	var placed atomic.Int64
	// run runs placements, 8 at a time on n and m, from 4 callers beside
	// the writers, and returns how many attempts were refused and run
	// again, and how many of those for a deadlock.
	run := func(phase string, writers ...func()) (int64, int64) {
		before, deadlocked := conflicts.Load(), deadlocks.Load()
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					var sbs []*store.Sandbox
					for j := range 8 {
						sb := storetest.NewSandbox(fmt.Sprintf("%s-p%d-%d-%d", phase, g, i, j))
						sb.Node = []string{"n", "m"}[j%2]
						sbs = append(sbs, sb)
					}
					if !place(sbs...) {
						return
					}
					placed.Add(8)
				}
			}()
		}
		for _, w := range writers {
			wg.Add(1)
			go func() { defer wg.Done(); w() }()
		}
		wg.Wait()
		return conflicts.Load() - before, deadlocks.Load() - deadlocked
	}

	// A sandbox's life on n, through n's view: placed, running, stopped,
	// deleted.
	var writes atomic.Int64
	var writers []func()
	for g := range 4 {
		writers = append(writers, func() {
			for i := range rounds {
				sb := storetest.NewSandbox(fmt.Sprintf("w%d-%d", g, i))
				sb.Node = "n"
				if !place(sb) {
					return
				}
				for _, next := range []string{api.StateRunning, api.StateStopped} {
					from := sb.State
					sb.State = next
					if err := as.Update(ctx, sb, from); err != nil {
						t.Error(err)
						return
					}
					writes.Add(1)
				}
				if _, err := st.Delete(ctx, sb.ID); err != nil {
					t.Error(err)
					return
				}
				writes.Add(1)
			}
		})
	}
	// A warm sandbox served on n: the placed row goes, the pooled one
	// (here a sandbox placed) runs, in one transaction.
	for g := range 2 {
		writers = append(writers, func() {
			for i := range rounds {
				pooled, row := storetest.NewSandbox(fmt.Sprintf("pool%d-%d", g, i)), storetest.NewSandbox(fmt.Sprintf("warm%d-%d", g, i))
				pooled.Node, row.Node = "n", "n"
				if !place(pooled, row) {
					return
				}
				from := pooled.State
				pooled.State = api.StateRunning
				if err := as.ServeWarm(ctx, row.ID, pooled, from); err != nil {
					t.Error(err)
					return
				}
				writes.Add(1)
			}
		})
	}
	// x on n and y on m change state in one transaction, written in
	// either order.
	x, y := storetest.NewSandbox("x"), storetest.NewSandbox("y")
	x.Node, y.Node = "n", "m"
	place(x, y)
	for _, ids := range [][]string{{"x", "y"}, {"y", "x"}} {
		writers = append(writers, func() {
			for range rounds {
				var sbs []*store.Sandbox
				for _, id := range ids {
					sb, err := st.Get(ctx, id)
					if err != nil {
						t.Error(err)
						return
					}
					sb.State = map[string]string{api.StateRunning: api.StateStopped}[sb.State]
					if sb.State == "" {
						sb.State = api.StateRunning
					}
					sbs = append(sbs, &sb)
				}
				if err := st.UpdateAll(ctx, sbs, api.StateCreating, api.StateRunning, api.StateStopped); err != nil {
					t.Error(err)
					return
				}
				writes.Add(1)
			}
		})
	}
	refused, _ := run("states", writers...)
	t.Logf("%d state changes, deletes and warm sandboxes served beside %d placements: %d attempts refused for a concurrent transaction and run again",
		writes.Load(), placed.Load(), refused)
	if refused > 0 {
		t.Errorf("%d of %d writes refused for a concurrent transaction", refused, writes.Load())
	}

	// Two sandboxes, one on n and one on m, swap nodes.
	writers = nil
	var moves atomic.Int64
	for g := range 2 {
		u, v := storetest.NewSandbox(fmt.Sprintf("u%d", g)), storetest.NewSandbox(fmt.Sprintf("v%d", g))
		u.Node, v.Node = "n", "m"
		place(u, v)
		writers = append(writers, func() {
			for range rounds {
				u.Node, v.Node = v.Node, u.Node
				if err := st.UpdateAll(ctx, []*store.Sandbox{u, v}, api.StateCreating); err != nil {
					t.Error(err)
					return
				}
				moves.Add(1)
			}
		})
	}
	placed.Store(0)
	refused, deadlocked := run("moves", writers...)
	t.Logf("%d moves of two sandboxes beside %d placements: %d attempts refused for a concurrent transaction and run again, %d for a deadlock",
		moves.Load(), placed.Load(), refused, deadlocked)
	if deadlocked > 0 {
		t.Errorf("%d deadlocks", deadlocked)
	}

	all, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*store.Resources{"n": {}, "m": {}}
	slots := map[string]map[int]bool{"n": {}, "m": {}}
	for _, sb := range all {
		want[sb.Node].Add(sb.State, store.Resources{CPU: sb.CPU, MemoryMiB: sb.MemoryMiB, DiskGiB: sb.DiskGiB, Sandboxes: 1})
		if slots[sb.Node][sb.Slot] {
			t.Errorf("two sandboxes in slot %d of %s", sb.Slot, sb.Node)
		}
		slots[sb.Node][sb.Slot] = true
	}
	ns, err := st.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		w := want[n.Name]
		if got := n.Committed; got.Sandboxes != w.Sandboxes || got.MemoryMiB != w.MemoryMiB || got.DiskGiB != w.DiskGiB || math.Abs(got.CPU-w.CPU) > 1e-9 {
			t.Errorf("node %s holds %+v, its sandboxes %+v", n.Name, got, *w)
		}
	}
}
