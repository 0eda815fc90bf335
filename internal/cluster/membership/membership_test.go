package membership

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/store/storetest"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
)

// openCluster opens the PostgreSQL store of ATOLL_TEST_POSTGRES_URL (the
// server scripts/test.sh starts) in a schema of its own, dropped when the
// test ends.
func openCluster(t *testing.T) *postgres.Store { return pgtest.Open(t, "atoll_m") }

// cutOff is the real store as one node reaches it: while down is set, its
// heartbeats and fencing fail as they do when the store is unreachable.
type cutOff struct {
	store.Cluster
	down atomic.Bool
}

var errUnreachable = errors.Join(errdefs.ErrUnavailable, errors.New("the store is unreachable"))

func (c *cutOff) Renew(ctx context.Context, name string, epoch int64, ttl time.Duration, st store.NodeStatus) error {
	if c.down.Load() {
		return errUnreachable
	}
	return c.Cluster.Renew(ctx, name, epoch, ttl, st)
}

func (c *cutOff) Expire(ctx context.Context, now time.Time, cause string) ([]store.Node, error) {
	if c.down.Load() {
		return nil, errUnreachable
	}
	return c.Cluster.Expire(ctx, now, cause)
}

const lease = 600 * time.Millisecond

// stateOf is node name's state in st.
func stateOf(t *testing.T, st store.Cluster, name string) store.Node {
	t.Helper()
	ns, err := st.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return store.Node{}
}

// run runs m until the test ends, and returns Run's answer's channel.
func run(t *testing.T, m *Member) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done, ended := make(chan error, 1), make(chan struct{})
	go func() { done <- m.Run(ctx); close(ended) }()
	t.Cleanup(func() { cancel(); <-ended })
	return done
}

// After an outage every stored lease has run out: a node fences another
// only once its own heartbeats have reached the store for a whole lease.
func TestFencesOnlyAfterALeaseConnected(t *testing.T) {
	st := openCluster(t)
	ctx := context.Background()
	a := &cutOff{Cluster: st}
	a.down.Store(true)
	m, err := Join(ctx, Config{Store: a, Node: storetest.NewNode("a"), Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	// b joins and is never heard of again: dead.
	if _, err := st.Join(ctx, storetest.NewNode("b"), lease); err != nil {
		t.Fatal(err)
	}
	run(t, m)
	// The outage: two leases; nothing can be fenced, b's lease runs out.
	time.Sleep(2 * lease)
	if n := stateOf(t, st, "b"); n.State != store.NodeLive || !n.LeaseExpires.Before(time.Now()) {
		t.Fatalf("b during the outage: %s, lease until %v", n.State, n.LeaseExpires)
	}
	back := time.Now()
	a.down.Store(false)
	for stateOf(t, st, "b").State == store.NodeLive {
		if time.Since(back) > 3*lease {
			t.Fatalf("b not fenced %s after the store came back", time.Since(back))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(back)
	t.Logf("b fenced %s after the store came back (lease %s)", took, lease)
	if took < lease {
		t.Errorf("b fenced %s after the store came back, before a whole lease (%s) connected", took, lease)
	}
	if n := stateOf(t, st, "a"); n.State != store.NodeLive || !m.Healthy() {
		t.Errorf("a after the outage: %s, healthy %v", n.State, m.Healthy())
	}
}

// A node the others fenced while it could not reach the store learns it at
// its first heartbeat after: it stops its sandboxes (OnFenced, once) and
// Run returns ErrFenced.
func TestFencedNodeStopsAndEnds(t *testing.T) {
	st := openCluster(t)
	ctx := context.Background()
	a := &cutOff{Cluster: st}
	var stopped atomic.Int32
	ma, err := Join(ctx, Config{Store: a, Node: storetest.NewNode("a"), Lease: lease,
		OnFenced: func(context.Context) { stopped.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	mb, err := Join(ctx, Config{Store: st, Node: storetest.NewNode("b"), Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	doneA := run(t, ma)
	run(t, mb)
	a.down.Store(true)
	t0 := time.Now()
	for stateOf(t, st, "a").State != store.NodeFenced {
		if time.Since(t0) > 4*lease {
			t.Fatal("a, cut off, not fenced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ma.Healthy() && time.Since(t0) > lease {
		t.Error("a, cut off for a lease, reports itself healthy")
	}
	select {
	case err := <-doneA:
		t.Fatalf("a's Run ended while cut off: %v", err)
	default:
	}
	if stopped.Load() != 0 {
		t.Fatal("a stopped its sandboxes before it could know it was fenced")
	}
	a.down.Store(false)
	select {
	case err := <-doneA:
		if !errors.Is(err, ErrFenced) {
			t.Errorf("a's Run: %v, want ErrFenced", err)
		}
	case <-time.After(2 * lease):
		t.Fatal("a's Run goes on after the store told it it was fenced")
	}
	if n := stopped.Load(); n != 1 {
		t.Errorf("OnFenced called %d times, want once", n)
	}
	if n := stateOf(t, st, "b"); n.State != store.NodeLive {
		t.Errorf("b: %s", n.State)
	}
}

// TestFencing: a node that stops heartbeating is fenced by one that goes on,
// after its lease, and its sandboxes are lost; when it heartbeats again it
// learns so, stops what it ran (OnFenced) and Run says ErrFenced. A node
// fences nobody before it has been connected for a whole lease.
func TestFencing(t *testing.T) {
	st := openCluster(t)
	ctx := context.Background()
	const lease = 900 * time.Millisecond
	join := func(name string, fenced *atomic.Int32) *Member {
		m, err := Join(ctx, Config{Store: st, Node: storetest.NewNode(name), Lease: lease,
			OnFenced: func(context.Context) { fenced.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var aFenced, bFenced atomic.Int32
	a, b := join("a", &aFenced), join("b", &bFenced)
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sbxofnodeb0000000001", State: api.StateRunning, Template: "host",
		Runtime: "ns", CPU: 1, MemoryMiB: 256, DiskGiB: 1, PIDs: 64, CreatedAt: time.Now()}}
	if err := st.As("b", b.Epoch()).Create(ctx, sb); err != nil {
		t.Fatal(err)
	}

	// Neither fences the other while both heartbeat.
	actx, stopA := context.WithCancel(ctx)
	defer stopA()
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	bctx, stopB := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() { bDone <- b.Run(bctx) }()
	// That nothing happens can only be seen by waiting: three leases.
	time.Sleep(3 * lease)
	if n := stateOf(t, st, "b"); n.State != store.NodeLive {
		t.Fatalf("b heartbeating, fenced: %+v", n)
	}

	// b stops heartbeating (a partition, a kill): a fences it.
	stopB()
	if err := <-bDone; err != nil {
		t.Fatalf("b's Run after its context ended: %v", err)
	}
	deadline := time.Now().Add(10 * lease)
	for stateOf(t, st, "b").State != store.NodeFenced {
		if time.Now().After(deadline) {
			t.Fatalf("b not fenced %s after its last heartbeat", 10*lease)
		}
		time.Sleep(lease / 10)
	}
	got, err := st.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateLost || got.LostFrom != api.StateRunning {
		t.Errorf("b's sandbox after b was fenced: %+v, %v", got, err)
	}
	if !a.Healthy() || aFenced.Load() != 0 {
		t.Errorf("a: healthy %v, fenced %d times", a.Healthy(), aFenced.Load())
	}

	// b comes back under its old epoch: fenced, it stops everything.
	err = b.Run(ctx)
	if !errors.Is(err, ErrFenced) || bFenced.Load() != 1 {
		t.Errorf("b's Run after it was fenced: %v, OnFenced called %d times", err, bFenced.Load())
	}
	if err := st.As("b", b.Epoch()).Update(ctx, &got, api.StateLost); !store.IsFenced(err) {
		t.Errorf("a write under b's old epoch: %v, want ErrFenced", err)
	}
	stopA()
	if err := <-aDone; err != nil {
		t.Errorf("a's Run: %v", err)
	}
}
