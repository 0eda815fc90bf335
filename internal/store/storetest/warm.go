package storetest

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// testPlaceWarm: Nodes counts a node's pooled sandboxes, less those warm
// placements reserved; concurrent warm placements reserve each pooled
// sandbox once (the rest ErrNoWarm); a warm placement needs room only
// beyond the pooled sandbox it replaces; a sandbox served from a pooled one
// takes the placement's record by Update.
func testPlaceWarm(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	n := NewNode("n1")
	n.Capacity.Sandboxes = 3
	e := join(t, c, n)
	join(t, c, NewNode("n2"))
	as := c.As("n1", e)
	for _, id := range []string{"pool1", "pool2"} {
		sb := NewSandbox(id)
		sb.State = store.StatePooled
		if err := as.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if got := node(t, c, "n1"); got.Status.Pooled[""] != 2 || got.PooledHolds != (store.Resources{CPU: 1, MemoryMiB: 512, DiskGiB: 10, Sandboxes: 1}) || got.PooledRuntime != "ns" {
		t.Fatalf("n1 pooled %v, each holding %+v; want 2 of 1 CPU, 512 MiB, 10 GiB", got.Status.Pooled, got.PooledHolds)
	}
	if got := node(t, c, "n2").Status.Pooled; got != nil {
		t.Errorf("n2 pooled %v, want none", got)
	}

	// Five warm placements at once, each in its own Place: two get the
	// two pooled sandboxes, three are refused, whatever the interleaving.
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := NewSandbox("warm" + string(rune('a'+i)))
			sb.Node, sb.Warm = "n1", true
			errs[i] = c.Place(ctx, []*store.Sandbox{sb})[0]
		}()
	}
	wg.Wait()
	var ok, noWarm int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrNoWarm):
			noWarm++
		default:
			t.Errorf("warm placement: %v", err)
		}
	}
	if ok != 2 || noWarm != 3 {
		t.Fatalf("%d warm placements recorded, %d refused ErrNoWarm; want 2 and 3", ok, noWarm)
	}
	if got := node(t, c, "n1").Status.Pooled; got != nil {
		t.Errorf("n1 pooled %v with both reserved, want none", got)
	}
	// Two pooled and two reserving rows on a node of three: counted as
	// two, so a cold placement fits once...
	if got := node(t, c, "n1").Committed; got.Sandboxes != 2 || got.CPU != 2 || got.MemoryMiB != 1024 || got.DiskGiB != 20 {
		t.Errorf("n1 committed %+v, want 2 sandboxes' worth: each reserved pooled one counted once", got)
	}
	placed(t, c, "cold1", "n1")
	cold := NewSandbox("cold2")
	cold.Node = "n1"
	if err := c.Place(ctx, []*store.Sandbox{cold})[0]; !errors.Is(err, store.ErrNoRoom) {
		t.Errorf("cold placement on a full node: %v, want ErrNoRoom", err)
	}
	// ...and a warm placement of a version with no pooled sandbox there
	// is ErrNoWarm, not placed cold.
	other := NewSandbox("warmv")
	other.Node, other.Warm, other.Runtime = "n2", true, "gvisor"
	if err := c.Place(ctx, []*store.Sandbox{other})[0]; !errors.Is(err, store.ErrNoWarm) {
		t.Errorf("warm placement with none pooled: %v, want ErrNoWarm", err)
	}

	// The node serves a reservation: the pooled row runs as the sandbox,
	// with the placement's record; the placed row goes.
	var served string
	for _, id := range []string{"warma", "warmb", "warmc", "warmd", "warme"} {
		if _, err := c.Get(ctx, id); err == nil {
			served = id
			break
		}
	}
	p, err := as.Get(ctx, "pool1")
	if err != nil {
		t.Fatal(err)
	}
	p.State, p.Placement = api.StateRunning, []byte(`{"sandbox":"pool1","warm":true}`)
	type warmServer interface {
		ServeWarm(ctx context.Context, placed string, sb *store.Sandbox, from ...string) error
	}
	if ws, ok := as.(warmServer); ok {
		// In one transaction, where the store can.
		if err := ws.ServeWarm(ctx, served, &p, store.StatePooled); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(ctx, served); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the placed row served warm: %v, want it gone", err)
		}
	} else {
		if err := as.Update(ctx, &p, store.StatePooled); err != nil {
			t.Fatal(err)
		}
		if _, err := as.Delete(ctx, served); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := c.Placement(ctx, "pool1")
	if err != nil {
		t.Fatal(err)
	}
	samePlacement(t, rec, `{"sandbox":"pool1","warm":true}`)
	if got := node(t, c, "n1").Committed.Sandboxes; got != 3 {
		t.Errorf("n1 committed %d sandboxes after serving one, want 3 (pool1, pool2 reserved, cold1)", got)
	}
}

// testDemand: Demand sums what the live nodes reported, and counts the
// schedulable ones; hostile rates are refused.
func testDemand(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	d, err := c.Demand(ctx)
	if err != nil || len(d.Rates) != 0 || d.Nodes != 1 {
		t.Fatalf("demand of no nodes: %+v, %v; want none, 1 node", d, err)
	}
	e1, e2, e3 := join(t, c, NewNode("n1")), join(t, c, NewNode("n2")), join(t, c, NewNode("n3"))
	for name, st := range map[string]struct {
		e int64
		d map[string]float64
	}{"n1": {e1, map[string]float64{"": 6, "v1": 1.5}}, "n2": {e2, map[string]float64{"v1": 0.5}}, "n3": {e3, nil}} {
		if err := c.Renew(ctx, name, st.e, time.Hour, store.NodeStatus{Demand: st.d}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SetSchedule(ctx, "n3", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	d, err = c.Demand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Rates[""] != 6 || d.Rates["v1"] != 2 || len(d.Rates) != 2 || d.Nodes != 2 {
		t.Errorf("demand %+v, want 6 of the built-in, 2 of v1, over 2 schedulable nodes", d)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), -1} {
		err := c.Renew(ctx, "n1", e1, time.Hour, store.NodeStatus{Demand: map[string]float64{"v1": bad}})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("demand of %v: %v, want ErrInvalid", bad, err)
		}
	}
}
