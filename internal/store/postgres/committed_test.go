package postgres

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

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
