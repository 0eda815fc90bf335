package pools

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// rows stands in for the sandbox state machine: it records pooled and
// prestarted sandboxes in a real store and discards them from it, which is
// all the pools see of a sandbox.
type rows struct {
	st store.Store
	mu sync.Mutex
	n  int
}

func (r *rows) add(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	r.mu.Lock()
	r.n++
	sb.ID = fmt.Sprintf("sb%018d", r.n)
	r.mu.Unlock()
	sb.Runtime, sb.CreatedAt = "ns", time.Now().UTC()
	return sb, r.st.Create(ctx, &sb)
}

func (r *rows) StartPooled(ctx context.Context, name string, v store.Template) (string, error) {
	sb, err := r.add(ctx, store.Sandbox{Sandbox: api.Sandbox{State: lifecycle.Pooled, Template: name, TemplateVersion: v.ID}})
	return sb.ID, err
}

func (r *rows) Prestart(ctx context.Context) (store.Sandbox, error) {
	return r.add(ctx, store.Sandbox{Sandbox: api.Sandbox{State: lifecycle.Prestarted}})
}

func (r *rows) DiscardIf(ctx context.Context, id, state string) {
	_, _ = r.st.Delete(ctx, id, state)
}

// openStore opens a SQLite store in a test directory, closed with the test.
func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

type host struct{}

func (host) Resolve(_ context.Context, ref string) (string, store.Template, error) {
	return ref, store.Template{}, nil
}

// TestFillTakeDiscard checks that Run fills the warm pool and the
// prestarted sandboxes to their sizes, refills what is taken, hands out
// prestarted sandboxes only while their runtimes match, and discards what
// it holds when it ends.
func TestFillTakeDiscard(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	p := New(Config{Store: st, Templates: host{}, Sandboxes: &rows{st: st}, DefaultTemplate: "host", WarmPool: 2, Prestart: 3})
	count := func() map[string]int {
		sbs, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, sb := range sbs {
			n[sb.State]++
		}
		return n
	}
	waitFor := func(pooled, prestarted int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n := count()
			if n[lifecycle.Pooled] == pooled && n[lifecycle.Prestarted] == prestarted {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("have %v, want %d pooled and %d prestarted", n, pooled, prestarted)
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	waitFor(2, 3)

	id, ok := p.Take(Key("host", store.Template{}))
	if !ok {
		t.Fatal("the warm pool handed out nothing")
	}
	if _, ok := p.Take(Key("other", store.Template{ID: "v0000000000000000001"})); ok {
		t.Error("a pool nobody keeps handed out a sandbox")
	}
	sb, err := st.Get(ctx, id)
	if err != nil || sb.State != lifecycle.Pooled {
		t.Fatalf("taken %s is %q (%v), want pooled", id, sb.State, err)
	}
	sb.State = api.StateRunning // handed out: no longer the pool's
	if err := st.Update(ctx, &sb, lifecycle.Pooled); err != nil {
		t.Fatal(err)
	}
	waitFor(2, 3) // refilled

	if got := p.TakePrestarted("vm", "ns"); len(got) != 0 {
		t.Errorf("took %d prestarted sandboxes for a vm sandbox; they are ns", len(got))
	}
	got := p.TakePrestarted("ns", "ns", "vm")
	if len(got) != 2 || got[0].ID == got[1].ID {
		t.Fatalf("took %v, want two ns sandboxes", got)
	}
	for _, sb := range got {
		sb.State = api.StateCreating
		if err := st.Update(ctx, &sb, lifecycle.Prestarted); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(2, 3)

	cancel()
	<-done
	if n := count(); n[lifecycle.Pooled] != 0 || n[lifecycle.Prestarted] != 0 || n[api.StateRunning] != 1 || n[api.StateCreating] != 2 {
		t.Errorf("after Run ended: %v, want only the 1 running and 2 creating sandboxes handed out", n)
	}
}

// moving is a default template whose name the test moves between versions.
type moving struct{ v atomic.Value }

func (m *moving) Resolve(_ context.Context, ref string) (string, store.Template, error) {
	return ref, store.Template{ID: m.v.Load().(string)}, nil
}

// gated starts pooled sandboxes only as the test lets it: started tells
// the test that a start began, and go lets it write its row.
type gated struct {
	rows
	started, go_ chan struct{}
}

func (g *gated) StartPooled(ctx context.Context, name string, v store.Template) (string, error) {
	g.started <- struct{}{}
	<-g.go_
	return g.rows.StartPooled(ctx, name, v)
}

// TestDrainWaitsForStart checks that a Drain after the default template
// moved to a new version waits for a pooled sandbox of the old version the
// filler is starting, and discards it before it returns: the caller (a
// rebuild, a tag moved, a name removed) then collects the old version at
// once, rather than finding it held by a sandbox the filler finishes
// later.
func TestDrainWaitsForStart(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	const old, next = "v0000000000000000001", "v0000000000000000002"
	tmpl := &moving{}
	tmpl.v.Store(old)
	sbs := &gated{rows: rows{st: st}, started: make(chan struct{}, 1), go_: make(chan struct{})}
	p := New(Config{Store: st, Templates: tmpl, Sandboxes: sbs, DefaultTemplate: "app", WarmPool: 1})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); close(sbs.go_); <-done }()

	<-sbs.started // the filler is starting a sandbox of the old version
	tmpl.v.Store(next)
	drained := make(chan struct{})
	go func() { defer close(drained); p.Drain(ctx) }()
	select {
	case <-drained:
		t.Fatal("Drain returned while a sandbox of the old version was still starting")
	case <-time.After(100 * time.Millisecond):
	}
	sbs.go_ <- struct{}{}
	<-drained
	all, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.TemplateVersion == old {
			t.Errorf("after Drain returned, sandbox %s of the old version is %s", sb.ID, sb.State)
		}
	}
}
