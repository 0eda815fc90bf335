package pools

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

func TestRate(t *testing.T) {
	var r Rate
	t0 := time.Unix(1_700_000_000, 0)
	if got := r.PerMinute(t0); got != nil {
		t.Errorf("empty rate %v", got)
	}
	for range 10 {
		r.Add("v1", t0)
	}
	r.Add("", t0.Add(2*time.Minute))
	if got := r.PerMinute(t0.Add(3 * time.Minute)); got["v1"] != 2 || got[""] != 0.2 {
		t.Errorf("after 3 minutes: %v, want v1 10 in 5 minutes, the built-in 1", got)
	}
	// Past the window, v1's creates are forgotten; the later one not yet.
	got := r.PerMinute(t0.Add(Window + Window/rateBuckets))
	if _, ok := got["v1"]; ok || got[""] != 0.2 {
		t.Errorf("after the window: %v, want only the built-in's", got)
	}
	if got := r.PerMinute(t0.Add(3 * Window)); got != nil {
		t.Errorf("long after: %v, want nothing", got)
	}
	// A bucket reused for a later time starts from zero.
	r.Add("v1", t0.Add(2*Window))
	if got := r.PerMinute(t0.Add(2 * Window)); got["v1"] != 0.2 || len(got) != 1 {
		t.Errorf("a reused bucket: %v", got)
	}
}

func TestShare(t *testing.T) {
	tests := []struct {
		name   string
		rates  []float64
		nodes  int
		budget int
		want   []int
	}{
		{"each its share of the next minute", []float64{6, 1, 0.01}, 3, 10, []int{2, 1, 1}},
		{"over budget: in proportion, the busiest first", []float64{30, 10, 1}, 1, 8, []int{6, 2, 0}},
		{"no budget", []float64{30}, 1, 0, []int{0}},
		{"a negative budget", []float64{30}, 1, -3, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ws []want
			for i, r := range tt.rates {
				ws = append(ws, want{key: string(rune('a' + i)), rate: r})
			}
			share(ws, tt.nodes, tt.budget)
			sum := 0
			for _, w := range ws {
				sum += w.n
				if want := tt.want[w.key[0]-'a']; w.n != want {
					t.Errorf("%s (rate %v): %d, want %d", w.key, w.rate, w.n, want)
				}
			}
			if sum > max(tt.budget, 0) && tt.budget < 10 {
				t.Errorf("%d over a budget of %d", sum, tt.budget)
			}
		})
	}
}

// sizer is the cluster as a node's pools see it: a demand and a room the
// test sets (the cluster store's side of them is storetest's).
type sizer struct {
	mu   sync.Mutex
	d    store.Demand
	room int
}

func (s *sizer) Sizing(context.Context) (store.Demand, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d, s.room, nil
}

func (s *sizer) set(rates map[string]float64, room int) {
	s.mu.Lock()
	s.d, s.room = store.Demand{Rates: rates, Nodes: 3}, room
	s.mu.Unlock()
}

// TestDemandSizing: a cluster node's pool follows the demand: it fills to
// its share, stays within --warm-pool and half its room, and drains to
// nothing once nobody creates the template.
func TestDemandSizing(t *testing.T) {
	ctx := context.Background()
	p, st, sz := sizedService(t, 4, 0)
	pooled := func() int {
		sbs, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, sb := range sbs {
			if sb.State == lifecycle.Pooled {
				n++
			}
		}
		return n
	}
	waitFor := func(want int, why string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			p.Wake() // rather than wait for its next round
			if n := pooled(); n == want && p.Pooled()[""] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d pooled (%v), want %d", why, pooled(), p.Pooled(), want)
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(100 * time.Millisecond)
	if n := pooled(); n != 0 {
		t.Errorf("%d pooled with no demand, want none", n)
	}
	sz.set(map[string]float64{"": 6}, 20) // 2 a minute on each of 3 nodes
	waitFor(2, "6 creates a minute on 3 nodes")
	sz.set(map[string]float64{"": 60}, 20)
	waitFor(4, "demand beyond --warm-pool")
	// Room bounds the filling, not what the pool holds: a burst that
	// fills the node is about to take them.
	sz.set(map[string]float64{"": 60}, 2)
	time.Sleep(sizeEvery + 500*time.Millisecond)
	p.Wake()
	time.Sleep(500 * time.Millisecond)
	if n := pooled(); n != 4 {
		t.Errorf("room for 2 more: %d pooled, want the 4 kept", n)
	}
	for range 4 {
		id, ok := p.Take(Key("host", store.Template{}))
		if !ok {
			t.Fatal("the pool handed out nothing")
		}
		sb, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		sb.State = "running"
		if err := st.Update(ctx, &sb, lifecycle.Pooled); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(1, "refilled on a node with room for 2 more")
	sz.set(nil, 20)
	waitFor(0, "nobody creates")

	// Counted creates are the demand the node reports.
	p.Count("")
	p.Count("v1")
	p.Count("v1")
	if d := p.Demand(); d[""] != 1/Window.Minutes() || d["v1"] != 2/Window.Minutes() {
		t.Errorf("demand %v", d)
	}
}

// TestBusyHoldsRefill: while the node is busy starting sandboxes for
// creates, the pools start nothing; once it is not, they fill.
func TestBusyHoldsRefill(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var busy atomic.Bool
	busy.Store(true)
	p := New(Config{Store: st, Templates: host{}, Sandboxes: &rows{st: st}, DefaultTemplate: "host", WarmPool: 1, Prestart: 1,
		Busy: busy.Load})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(5 * refillDelay)
	if sbs, _ := st.List(ctx); len(sbs) != 0 {
		t.Errorf("%d sandboxes started while busy, want none", len(sbs))
	}
	busy.Store(false)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if sbs, _ := st.List(ctx); len(sbs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pools did not fill once the node was no longer busy")
		}
	}
}

// slowRows starts pooled sandboxes once gate lets each through.
type slowRows struct {
	*rows
	gate chan struct{}
}

func (r slowRows) StartPooled(ctx context.Context, name string, v store.Template) (string, error) {
	<-r.gate
	return r.rows.StartPooled(ctx, name, v)
}

// TestTakeWaiting: a take from an empty pool whose sandbox is being
// started waits for it; from a pool nothing is being started for, it
// answers at once.
func TestTakeWaiting(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gate := make(chan struct{})
	p := New(Config{Store: st, Templates: host{}, Sandboxes: slowRows{&rows{st: st}, gate}, DefaultTemplate: "host", WarmPool: 1})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); close(gate); <-done }()
	key := Key("host", store.Template{})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		filling := p.filling == key
		p.mu.Unlock()
		if filling {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the filler never started a sandbox")
		}
	}
	t0 := time.Now()
	if _, ok := p.TakeWaiting(ctx, "other", time.Minute); ok || time.Since(t0) > time.Second {
		t.Errorf("a take from a pool nothing is started for: %v after %v", ok, time.Since(t0))
	}
	if _, ok := p.TakeWaiting(ctx, key, 50*time.Millisecond); ok {
		t.Error("took a sandbox still starting")
	}
	got := make(chan bool)
	go func() {
		_, ok := p.TakeWaiting(ctx, key, 10*time.Second)
		got <- ok
	}()
	time.Sleep(100 * time.Millisecond)
	gate <- struct{}{}
	if !<-got {
		t.Error("the take did not get the sandbox that was starting")
	}
}

// TestDemandSizesPrestart: on a cluster node the prestarted processes
// follow demand too: the cold creates the node expects (its share of the
// rate less what its warm pool serves), within --prestart, filled within
// half its room, and none while nobody creates; those beyond are
// discarded.
func TestDemandSizesPrestart(t *testing.T) {
	ctx := context.Background()
	p, st, sz := sizedService(t, 1, 5)
	count := func() (pooled, prestarted int) {
		sbs, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			switch sb.State {
			case lifecycle.Pooled:
				pooled++
			case lifecycle.Prestarted:
				prestarted++
			}
		}
		return pooled, prestarted
	}
	waitFor := func(pooled, prestarted int, why string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			p.Wake()
			p.mu.Lock()
			held := len(p.prestarted)
			p.mu.Unlock()
			if a, b := count(); a == pooled && b == prestarted && held == prestarted {
				return
			}
			if time.Now().After(deadline) {
				a, b := count()
				t.Fatalf("%s: %d pooled, %d prestarted (%d held); want %d and %d", why, a, b, held, pooled, prestarted)
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(100 * time.Millisecond)
	if a, b := count(); a != 0 || b != 0 {
		t.Errorf("no demand: %d pooled, %d prestarted; want none", a, b)
	}
	sz.set(map[string]float64{"": 12}, 20) // 4 a minute here, 1 of them warm
	waitFor(1, 3, "12 creates a minute on 3 nodes")
	sz.set(map[string]float64{"": 60}, 20)
	waitFor(1, 5, "demand beyond --prestart")
	// Room bounds the filling, not what is kept: a burst filling the
	// node is about to take them.
	sz.set(map[string]float64{"": 60}, 4)
	time.Sleep(sizeEvery + 500*time.Millisecond)
	waitFor(1, 5, "room for 4 more")
	sz.set(map[string]float64{"": 12}, 20)
	waitFor(1, 3, "demand falls back")
	sz.set(nil, 20)
	waitFor(0, 0, "nobody creates")
}

// sizedService is a cluster node's pools over a store of their own, with
// --warm-pool warm and --prestart prestart, sized by a sizer that reports
// no demand and room for 20 until the test sets it.
func sizedService(t *testing.T, warm, prestart int) (*Service, store.Store, *sizer) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sz := &sizer{}
	sz.set(nil, 20)
	return New(Config{Store: st, Templates: host{}, Sandboxes: &rows{st: st}, DefaultTemplate: "host", WarmPool: warm,
		Prestart: prestart, Sizer: sz, BuiltIn: "host"}), st, sz
}
