package membership

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/store/storetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// openCluster opens the real PostgreSQL store in a schema of the test's own.
func openCluster(t *testing.T) *postgres.Store {
	t.Helper()
	base := os.Getenv("ATOLL_TEST_POSTGRES_URL")
	if base == "" {
		testenv.Skip(t, "ATOLL_TEST_POSTGRES_URL is not set (scripts/test.sh starts a PostgreSQL server and sets it)")
	}
	schema := "atoll_member_" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_"))
	admin := func(sql string) {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	admin("DROP SCHEMA IF EXISTS " + schema + " CASCADE")
	admin("CREATE SCHEMA " + schema)
	t.Cleanup(func() { admin("DROP SCHEMA " + schema + " CASCADE") })
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	st, err := postgres.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
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
	if n := nodeState(t, st, "b"); n.State != store.NodeLive {
		t.Fatalf("b heartbeating, fenced: %+v", n)
	}

	// b stops heartbeating (a partition, a kill): a fences it.
	stopB()
	if err := <-bDone; err != nil {
		t.Fatalf("b's Run after its context ended: %v", err)
	}
	deadline := time.Now().Add(10 * lease)
	for nodeState(t, st, "b").State != store.NodeFenced {
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

func nodeState(t *testing.T, st store.Cluster, name string) store.Node {
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

// TestNoFencingUntilConnected: after an outage of the store every stored
// lease has run out; a node fences others only once its own heartbeats have
// reached the store for a whole lease, by when every live node renewed.
func TestNoFencingUntilConnected(t *testing.T) {
	st := openCluster(t)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	var fenced atomic.Int32
	a, err := Join(ctx, Config{Store: st, Node: storetest.NewNode("a"), Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Join(ctx, storetest.NewNode("b"), lease); err != nil {
		t.Fatal(err)
	}
	a.cfg.Lease = lease
	a.cfg.OnFenced = func(context.Context) { fenced.Add(1) }
	// b's lease runs out while a has just (re)connected.
	for !nodeState(t, st, "b").LeaseExpires.Before(time.Now()) {
		time.Sleep(lease / 10)
	}
	a.mu.Lock()
	a.connectedSince = time.Now()
	a.mu.Unlock()
	a.expireOthers(ctx)
	if n := nodeState(t, st, "b"); n.State != store.NodeLive {
		t.Fatalf("a fenced b right after connecting: %+v", n)
	}
	a.mu.Lock()
	a.connectedSince = time.Now().Add(-lease - time.Millisecond)
	a.mu.Unlock()
	a.expireOthers(ctx)
	if n := nodeState(t, st, "b"); n.State != store.NodeFenced {
		t.Fatalf("a connected for a lease did not fence b, whose lease ran out: %+v", n)
	}
	if fenced.Load() != 0 {
		t.Error("a's OnFenced ran")
	}
}
