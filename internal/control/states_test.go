package control

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/node"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// TestStateWritesGoThroughTheTable checks that only states.go writes a
// sandbox's record, so that no change of state bypasses lifecycle.Check.
func TestStateWritesGoThroughTheTable(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	writes := []string{"Update", "UpdateAll", "Create", "Delete"}
	fset := token.NewFileSet()
	for _, f := range files {
		if f == "states.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok || !slices.Contains(writes, sel.Sel.Name) {
				return true
			}
			if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "store" {
				t.Errorf("%s: store.%s outside states.go: write the record through setState, setStates, record or removeRecord", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
}

// TestRecoveriesCoverEveryState checks that Recover knows what to do in
// every state the table declares.
func TestRecoveriesCoverEveryState(t *testing.T) {
	for _, st := range lifecycle.States {
		if recoveries[st.Recover] == nil {
			t.Errorf("state %s: no recovery for %q", st.Name, st.Recover)
		}
	}
	for _, p := range policies {
		for _, st := range p.states {
			if _, ok := lifecycle.Lookup(st); !ok || !lifecycle.Visible(st) {
				t.Errorf("policy %s applies in %q, not a state the API shows", p.name, st)
			}
		}
	}
}

// newStoreService returns a Service over a real store of its own, and the
// store.
func newStoreService(t *testing.T) (*Service, store.Store) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Node: node.New(node.Config{Runtimes: []runtime.Runtime{nopRuntime{}}})})
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// TestSetStateRefuses checks, on a real store, that a change of state the
// table lacks is refused with a conflict naming both states, and that
// nothing is written or recorded.
func TestSetStateRefuses(t *testing.T) {
	ctx := context.Background()
	s, st := newStoreService(t)
	conflict := func(err error, from, to string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), from) || !strings.Contains(err.Error(), to) {
			t.Errorf("got %v, want a conflict naming %s and %s", err, from, to)
		}
	}
	sb := store.Sandbox{Sandbox: api.Sandbox{ID: newID(), State: api.StateRunning, Runtime: "ns", CreatedAt: time.Now().UTC()}}
	conflict(s.record(ctx, &sb), "nothing", api.StateRunning)
	if sbs, err := st.List(ctx); err != nil || len(sbs) != 0 {
		t.Fatalf("a refused record was written: %v, %v", sbs, err)
	}
	sb.State = api.StateCreating
	if err := s.record(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateStopped
	conflict(s.setState(ctx, &sb, api.StateCreating), api.StateCreating, api.StateStopped)
	sb.State = api.StateArchived
	conflict(s.setStates(ctx, []*store.Sandbox{&sb}, api.StateCreating), api.StateCreating, api.StateArchived)
	if got, err := st.Get(ctx, sb.ID); err != nil || got.State != api.StateCreating {
		t.Fatalf("after refused moves the record is %q (%v), want creating", got.State, err)
	}
	sb.State = api.StateRunning
	if err := s.setState(ctx, &sb, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	conflict(s.removeRecord(ctx, sb.ID), api.StateRunning, api.StateDeleted)
	tr, err := st.Transitions(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 2 || tr[0].To != api.StateCreating || tr[1].To != api.StateRunning {
		t.Errorf("recorded transitions %+v, want creating then running", tr)
	}
}

// TestRemoveRecord checks that a record in a state the table lets go is
// removed, and one in another is not.
func TestRemoveRecord(t *testing.T) {
	ctx := context.Background()
	s, st := newStoreService(t)
	for _, state := range []string{api.StateCreating, lifecycle.Pooled, lifecycle.Prestarted, lifecycle.Building} {
		sb := store.Sandbox{Sandbox: api.Sandbox{ID: newID(), State: state, Runtime: "ns", CreatedAt: time.Now().UTC()}}
		if err := s.record(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		if err := s.removeRecord(ctx, sb.ID); err != nil {
			t.Errorf("removing a %s record: %v", state, err)
		}
		if _, err := st.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a %s record is still there after its removal: %v", state, err)
		}
	}
}

// TestOpenings checks, on a real store, that acquire refuses an operation
// on a sandbox in a state its opening leaves out, with a conflict that
// leaves the sandbox unlocked, and lets it through in one it names; and
// that every opening the package asks for is in the table (an unknown
// name would act on any state).
func TestOpenings(t *testing.T) {
	ctx := context.Background()
	s, _ := newStoreService(t)
	sb := store.Sandbox{Sandbox: api.Sandbox{ID: newID(), State: api.StateCreating, Runtime: "ns", CreatedAt: time.Now().UTC()}}
	if err := s.record(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op, state string
		refused   bool
	}{
		{"pause", api.StateCreating, true},
		{"ports", api.StateCreating, true},
		{"", api.StateCreating, false},
		{"stop", api.StateRunning, false},
		{"timeout", api.StatePaused, false},
		{"resume", api.StateRunning, true},
		{"shelve", api.StatePaused, false},
		{"ports", api.StateRunning, false},
	} {
		if sb.State != tc.state {
			from := sb.State
			sb.State = tc.state
			if err := s.setState(ctx, &sb, from); err != nil {
				t.Fatal(err)
			}
		}
		got, unlock, err := s.acquire(ctx, sb.ID, tc.op)
		if tc.refused {
			if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), tc.state) {
				t.Errorf("%s of a %s sandbox: %v, want a conflict naming the state", tc.op, tc.state, err)
			}
		} else if err != nil || got.State != tc.state {
			t.Errorf("%s of a %s sandbox: %q, %v", tc.op, tc.state, got.State, err)
		}
		if unlock != nil {
			unlock()
		}
		if !s.mutex(sb.ID).TryLock() {
			t.Fatalf("%s of a %s sandbox left it locked", tc.op, tc.state)
		}
		s.mutex(sb.ID).Unlock()
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			name := ""
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			case *ast.Ident:
				name = fn.Name
			}
			if name != "acquire" && name != "refuses" {
				return true
			}
			lit, ok := call.Args[len(call.Args)-1].(*ast.BasicLit)
			if name == "refuses" {
				lit, ok = call.Args[0].(*ast.BasicLit)
			}
			if !ok {
				return true
			}
			if op := strings.Trim(lit.Value, `"`); op != "" {
				if _, ok := opens[op]; !ok {
					t.Errorf("%s: %s(%q): no such opening in states.go", fset.Position(call.Pos()), name, op)
				}
			}
			return true
		})
	}
}
