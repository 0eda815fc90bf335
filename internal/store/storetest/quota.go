package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// wantQuota fails t unless err is a *errdefs.QuotaError of quota name,
// limit and use.
func wantQuota(t *testing.T, what string, err error, name string, limit, used float64) {
	t.Helper()
	var qe *errdefs.QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("%s: %v, want a quota error of %s", what, err, name)
	}
	if qe.Quota != name || qe.Limit != limit || qe.Used != used {
		t.Fatalf("%s: %+v, want %s of %g with %g used", what, *qe, name, limit, used)
	}
}

// use fails t unless tenant tn's use is want.
func use(t *testing.T, st store.Store, tn string, want store.Resources) {
	t.Helper()
	got, err := st.Tenant(context.Background(), tn)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.Used); diff != "" {
		t.Fatalf("use of %s (-want +got):\n%s", tn, diff)
	}
}

// testQuotas: a tenant's quota is kept and checked by Create and Update,
// counting what its sandboxes hold (store.Charge): a create, a start of a
// stopped sandbox, a pooled one handed out, each refused over a limit with
// the limit and use named; a stop or delete never; another tenant's
// sandboxes do not count; bad quotas are refused.
func testQuotas(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	for _, bad := range []struct {
		name string
		q    store.Quota
	}{
		{"team-q", store.Quota{Sandboxes: -1}}, {"team-q", store.Quota{CPU: math.NaN()}},
		{"team-q", store.Quota{CPU: math.Inf(1)}}, {"team-q", store.Quota{DiskGiB: -5}},
		{"team-q", store.Quota{CreatesPerSecond: -1}}, {"Team", store.Quota{}}, {"", store.Quota{}}, {"a\x00b", store.Quota{}},
	} {
		if err := st.SetQuota(ctx, bad.name, bad.q); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("SetQuota(%q, %+v): %v, want ErrInvalid", bad.name, bad.q, err)
		}
	}
	if got, err := st.Tenant(ctx, "nobody"); err != nil || got != (store.Tenant{Name: "nobody"}) {
		t.Fatalf("unknown tenant: %+v, %v", got, err)
	}
	q := store.Quota{Sandboxes: 2, CPU: 3, MemoryMiB: 2048, DiskGiB: 35, CreatesPerSecond: 5}
	if err := st.SetQuota(ctx, "team-q", q); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Tenant(ctx, "team-q"); err != nil || got.Quota != q {
		t.Fatalf("quota read back: %+v, %v; want %+v", got.Quota, err, q)
	}
	mk := func(id string, edit func(sb *store.Sandbox)) (*store.Sandbox, error) {
		sb := NewSandbox(id) // 1 CPU, 512 MiB, 10 GiB
		sb.Tenant = "team-q"
		if edit != nil {
			edit(sb)
		}
		return sb, st.Create(ctx, sb)
	}
	a, err := mk("a", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := mk("b", nil)
	if err != nil {
		t.Fatal(err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 2, CPU: 2, MemoryMiB: 1024, DiskGiB: 20})
	_, err = mk("c", nil)
	wantQuota(t, "third sandbox", err, store.QuotaSandboxes, 2, 2)
	if _, err := st.Get(ctx, "c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused create was recorded: %v", err)
	}
	// Another tenant is not held back by team-q's quota.
	if err := st.Create(ctx, NewSandbox("other")); err != nil {
		t.Fatal(err)
	}

	// Stopped, b holds its disk only.
	b.State = api.StateStopped
	if err := st.Update(ctx, b, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 1, CPU: 1, MemoryMiB: 512, DiskGiB: 20})
	_, err = mk("c", func(sb *store.Sandbox) { sb.CPU = 2.5 })
	wantQuota(t, "2.5 CPUs more", err, store.QuotaCPU, 3, 1)
	_, err = mk("c", func(sb *store.Sandbox) { sb.MemoryMiB = 2000 })
	wantQuota(t, "2000 MiB more", err, store.QuotaMemory, 2048, 512)
	_, err = mk("c", func(sb *store.Sandbox) { sb.DiskGiB = 16 })
	wantQuota(t, "16 GiB more", err, store.QuotaDisk, 35, 20)
	c, err := mk("c", func(sb *store.Sandbox) { sb.CPU = 2 })
	if err != nil {
		t.Fatalf("a create within every limit: %v", err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 2, CPU: 3, MemoryMiB: 1024, DiskGiB: 30})

	// Starting stopped b again would make three.
	b.State = api.StateStarting
	err = st.Update(ctx, b, api.StateStopped)
	wantQuota(t, "restart over quota", err, store.QuotaSandboxes, 2, 2)
	if got, _ := st.Get(ctx, "b"); got.State != api.StateStopped {
		t.Fatalf("a refused start left b %s", got.State)
	}
	// Nor may a running sandbox grow past a limit in place.
	a.CPU = 2
	err = st.Update(ctx, a, api.StateCreating)
	wantQuota(t, "growing a", err, store.QuotaCPU, 3, 3)
	a.CPU = 1

	// A quota lowered below the use holds back growth only: a pause, a
	// stop and a delete go through.
	if err := st.SetQuota(ctx, "team-q", store.Quota{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	a.State = api.StatePaused
	if err := st.Update(ctx, a, api.StateCreating); err != nil {
		t.Fatalf("pausing over a lowered quota: %v", err)
	}
	c.State = api.StateStopped
	if err := st.Update(ctx, c, api.StateCreating); err != nil {
		t.Fatalf("stopping over a lowered quota: %v", err)
	}
	if _, err := st.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 1, CPU: 1, MemoryMiB: 512, DiskGiB: 20})

	// A warm pool's sandbox is nobody's: it counts for nothing until it
	// is handed out, which is checked.
	p, err := mk("p", func(sb *store.Sandbox) { sb.State = store.StatePooled })
	if err != nil {
		t.Fatalf("a pooled sandbox at the quota: %v", err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 1, CPU: 1, MemoryMiB: 512, DiskGiB: 20})
	p.State = api.StateRunning
	err = st.Update(ctx, p, store.StatePooled)
	wantQuota(t, "handing out a pooled sandbox", err, store.QuotaSandboxes, 1, 1)
	// Nor does a prestarted process count, until a create takes it.
	pre, err := mk("pre", func(sb *store.Sandbox) { sb.State = store.StatePrestarted })
	if err != nil {
		t.Fatalf("a prestarted sandbox at the quota: %v", err)
	}
	use(t, st, "team-q", store.Resources{Sandboxes: 1, CPU: 1, MemoryMiB: 512, DiskGiB: 20})
	pre.State = api.StateCreating
	err = st.Update(ctx, pre, store.StatePrestarted)
	wantQuota(t, "taking a prestarted sandbox", err, store.QuotaSandboxes, 1, 1)

	// No limits: anything goes.
	if err := st.SetQuota(ctx, "team-q", store.Quota{}); err != nil {
		t.Fatal(err)
	}
	b.State = api.StateStarting
	if err := st.Update(ctx, b, api.StateStopped); err != nil {
		t.Fatalf("starting with no quota: %v", err)
	}
	ts, err := st.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tn := range ts {
		names = append(names, tn.Name)
		if tn.Name == "team-q" && (tn.Used != store.Resources{Sandboxes: 2, CPU: 2, MemoryMiB: 1024, DiskGiB: 20}) {
			t.Errorf("team-q in Tenants: %+v", tn)
		}
	}
	if diff := cmp.Diff([]string{"default", "team-q"}, names); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
}

// testQuotaStorm: creates and starts at once never take a tenant past its
// quota: of 40 creates against 10 sandboxes, 10 are recorded.
func testQuotaStorm(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	if err := st.SetQuota(ctx, "storm", store.Quota{Sandboxes: 10}); err != nil {
		t.Fatal(err)
	}
	// Two stopped ones, started during the storm.
	var stopped []*store.Sandbox
	for i := range 2 {
		sb := NewSandbox(fmt.Sprintf("stopped%d", i))
		sb.Tenant, sb.State = "storm", api.StateStopped
		if err := st.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		stopped = append(stopped, sb)
	}
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	try := func(err error) {
		switch {
		case err == nil:
			ok.Add(1)
		case errors.Is(err, errdefs.ErrQuota):
			refused.Add(1)
		default:
			t.Error(err)
		}
	}
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := NewSandbox(fmt.Sprintf("s%d", i))
			sb.Tenant = "storm"
			try(st.Create(ctx, sb))
		}()
	}
	for _, sb := range stopped {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb.State = api.StateStarting
			try(st.Update(ctx, sb, api.StateStopped))
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || refused.Load() != 32 {
		t.Errorf("%d recorded, %d refused; want 10 and 32", ok.Load(), refused.Load())
	}
	got, err := st.Tenant(ctx, "storm")
	if err != nil || got.Used.Sandboxes != 10 || got.Used.CPU != 10 {
		t.Errorf("storm's use after the storm: %+v, %v", got.Used, err)
	}
}

// testPlaceQuota: placements count against their tenant's quota across
// nodes and batches, each refused with a quota error (not ErrNoRoom: no
// other node would do); concurrent Places on two nodes, creates through
// the nodes' views and starts of stopped sandboxes never take the tenant
// past its quota together.
func testPlaceQuota(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	e0 := join(t, c, bigNode("q0"))
	e1 := join(t, c, bigNode("q1"))
	if err := c.SetQuota(ctx, "team-q", store.Quota{Sandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	// One batch: three of team-q fit, the fourth is over; another
	// tenant's are not held back.
	var sbs []*store.Sandbox
	for i := range 5 {
		sb := NewSandbox(fmt.Sprintf("b%d", i))
		sb.Node, sb.Tenant = []string{"q0", "q1"}[i%2], "team-q"
		if i == 4 {
			sb.Tenant = "team-r"
		}
		sbs = append(sbs, sb)
	}
	errs := c.Place(ctx, sbs)
	for i, err := range errs {
		switch {
		case i < 3 || i == 4:
			if err != nil {
				t.Fatalf("placement %d: %v", i, err)
			}
		default:
			if errors.Is(err, store.ErrNoRoom) {
				t.Fatalf("placement over quota is ErrNoRoom (the scheduler would try another node): %v", err)
			}
			wantQuota(t, "fourth of team-q", err, store.QuotaSandboxes, 3, 3)
		}
	}

	// The storm: a quota of 12, 3 used, 2 stopped to start; placements
	// on both nodes, creates through both views, the starts, all at once.
	if err := c.SetQuota(ctx, "team-q", store.Quota{Sandboxes: 12}); err != nil {
		t.Fatal(err)
	}
	var stopped []*store.Sandbox
	for i := range 2 {
		sb := NewSandbox(fmt.Sprintf("stopped%d", i))
		sb.Node, sb.Tenant, sb.State = "q0", "team-q", api.StateStopped
		if err := c.Place(ctx, []*store.Sandbox{sb})[0]; err != nil {
			t.Fatal(err)
		}
		stopped = append(stopped, sb)
	}
	views := map[string]store.Store{"q0": c.As("q0", e0), "q1": c.As("q1", e1)}
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	try := func(err error) {
		switch {
		case err == nil:
			ok.Add(1)
		case errors.Is(err, errdefs.ErrQuota):
			refused.Add(1)
		default:
			t.Error(err)
		}
	}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := []string{"q0", "q1"}[g%2]
			for i := range 3 {
				if g < 4 {
					var batch []*store.Sandbox
					for j := range 2 {
						sb := NewSandbox(fmt.Sprintf("g%d-%d-%d", g, i, j))
						sb.Node, sb.Tenant = node, "team-q"
						batch = append(batch, sb)
					}
					for _, err := range c.Place(ctx, batch) {
						try(err)
					}
					continue
				}
				sb := NewSandbox(fmt.Sprintf("v%d-%d", g, i))
				sb.Tenant = "team-q"
				try(views[node].Create(ctx, sb))
			}
		}()
	}
	for _, sb := range stopped {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb.State = api.StateStarting
			try(views["q0"].Update(ctx, sb, api.StateStopped))
		}()
	}
	wg.Wait()
	// 4×3×2 placements, 4×3 creates, 2 starts; room for 9.
	if ok.Load() != 9 || refused.Load() != 24+12+2-9 {
		t.Errorf("%d recorded, %d refused; want 9 and %d", ok.Load(), refused.Load(), 24+12+2-9)
	}
	if got, err := c.Tenant(ctx, "team-q"); err != nil || got.Used.Sandboxes != 12 {
		t.Errorf("team-q's use after the storm: %+v, %v", got.Used, err)
	}
}

// bigNode is a node with room for far more than a quota allows.
func bigNode(name string) store.Node {
	n := NewNode(name)
	n.Capacity = store.Resources{CPU: 100, MemoryMiB: 1 << 20, DiskGiB: 10000, Sandboxes: 100}
	return n
}

// testTakeCreates: the tenants' shared create buckets. Concurrent takes
// through any nodes take exactly what the bucket holds; a take waits as
// long as the refill needs; a bucket with a create left takes a batch
// whole; tenants are apart; bad arguments are ErrInvalid.
func testTakeCreates(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	// A bucket of 5 that refills once in 1,000 s: 40 takes at once get 5.
	var mu sync.Mutex
	var taken int
	var waits []time.Duration
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait, err := c.TakeCreates(ctx, "team-t", 1, 0.001, 5)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case wait == 0:
				taken++
			default:
				waits = append(waits, wait)
			}
		}()
	}
	wg.Wait()
	if taken != 5 || len(waits) != 35 {
		t.Fatalf("40 takes at once from a bucket of 5: %d taken, %d told to wait", taken, len(waits))
	}
	for _, w := range waits {
		if w < 900*time.Second || w > 1000*time.Second {
			t.Errorf("wait %v from an empty bucket refilling once in 1,000 s", w)
		}
	}
	// Another tenant's bucket is its own.
	if wait, err := c.TakeCreates(ctx, "team-u", 1, 0.001, 1); err != nil || wait != 0 {
		t.Errorf("another tenant's first take: wait %v, %v", wait, err)
	}
	// A fast refill: empty, then told to wait at most 1/rate, then taken
	// after that wait.
	if wait, err := c.TakeCreates(ctx, "team-v", 1, 20, 1); err != nil || wait != 0 {
		t.Fatalf("first take: wait %v, %v", wait, err)
	}
	wait, err := c.TakeCreates(ctx, "team-v", 1, 20, 1)
	if err != nil || wait <= 0 || wait > 50*time.Millisecond {
		t.Fatalf("take from an empty bucket of rate 20: wait %v, %v; want 0-50 ms", wait, err)
	}
	time.Sleep(wait + 5*time.Millisecond)
	if wait, err := c.TakeCreates(ctx, "team-v", 1, 20, 1); err != nil || wait != 0 {
		t.Errorf("take after the wait: wait %v, %v", wait, err)
	}
	// A batch from a bucket with one create left is taken whole; the
	// debt is then waited for.
	if wait, err := c.TakeCreates(ctx, "team-w", 10, 1, 1); err != nil || wait != 0 {
		t.Fatalf("a batch of 10 from a full bucket of 1: wait %v, %v", wait, err)
	}
	if wait, err := c.TakeCreates(ctx, "team-w", 1, 1, 1); err != nil || wait < 9*time.Second {
		t.Errorf("take after a batch of 10 at 1 a second: wait %v, %v; want about 10 s", wait, err)
	}
	for _, bad := range []struct {
		t           string
		n           int
		rate, burst float64
	}{
		{"", 1, 1, 1}, {"../x", 1, 1, 1}, {"team-x", -1, 1, 1}, {"team-x", 1, 0, 1}, {"team-x", 1, -1, 1},
		{"team-x", 1, math.NaN(), 1}, {"team-x", 1, math.Inf(1), 1}, {"team-x", 1, 1, 0.5}, {"team-x", 1, 1, math.Inf(1)},
	} {
		if _, err := c.TakeCreates(ctx, bad.t, bad.n, bad.rate, bad.burst); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("TakeCreates(%q, %d, %v, %v): %v, want ErrInvalid", bad.t, bad.n, bad.rate, bad.burst, err)
		}
	}
}
