package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
)

// clusterStore opens the PostgreSQL store of cluster mode in a schema of
// its own on ATOLL_TEST_POSTGRES_URL's server (scripts/test.sh starts one),
// dropped when t ends.
func clusterStore(t *testing.T) *postgres.Store { return pgtest.Open(t, "atoll_control_") }

// pgPlacer places every sandbox on node to through the cluster store's
// Place, as the scheduler does once it has chosen.
type pgPlacer struct {
	c  store.Cluster
	to string
}

func (p *pgPlacer) Place(ctx context.Context, sb *store.Sandbox, _ api.CreateSandboxRequest, _ string) error {
	sb.Node = p.to
	return p.c.Place(ctx, []*store.Sandbox{sb})[0]
}

// TestClusterPostgres runs node a over the real cluster store: creates are
// placed through store.Cluster.Place (and refused as unavailable where the
// node has no room), and once a joins again under a new epoch, the Service
// still writing under the old one is fenced: its write is refused as
// unavailable, and the sandbox stops here while its row stays as the
// cluster has it.
func TestClusterPostgres(t *testing.T) {
	ctx := context.Background()
	pg := clusterStore(t)
	n := store.Node{Name: "a", Address: "127.0.0.1:7001", Version: "test", Runtimes: []string{"ns"},
		Capacity: store.Resources{CPU: 8, MemoryMiB: 16 << 10, DiskGiB: 100, Sandboxes: 2}}
	epoch, err := pg.Join(ctx, n, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pl := &pgPlacer{c: pg, to: "a"}
	a := newClusterNode(t, "a", pg.As("a", epoch), Config{Placer: pl, Peers: &peers{}})
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		sb, err := a.Create(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "a" || sb.State != api.StateRunning || !a.alive(t, sb.ID) {
			t.Fatalf("created %+v, want running on a", sb)
		}
		ids = append(ids, sb.ID)
	}
	// Two sandboxes fill a; a third has no room, and nothing of it stays.
	if _, err := a.Create(ctx, api.CreateSandboxRequest{}); !errors.Is(err, store.ErrNoRoom) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create on a full node: %v, want no room (unavailable)", err)
	}
	if sbs, _ := pg.ListNode(ctx, "a"); len(sbs) != 2 {
		t.Errorf("node a has %d rows after a refused placement, want 2", len(sbs))
	}

	// a restarts elsewhere in the cluster's eyes: this Service's epoch is
	// over.
	if _, err := pg.Join(ctx, n, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = a.Stop(ctx, ids[0])
	if !store.IsFenced(err) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Stop under a fenced epoch: %v, want fenced (unavailable)", err)
	}
	if a.alive(t, ids[0]) {
		t.Error("the fenced sandbox still runs under the old epoch's Service")
	}
	if st, _ := history(t, pg, ids[0]); st != api.StateRunning {
		t.Errorf("the fenced sandbox's row is %s, want running as the cluster has it", st)
	}
	if err := a.Relinquish(ctx); err != nil {
		t.Fatal(err)
	}
	if a.alive(t, ids[1]) {
		t.Error("the other sandbox runs on after Relinquish")
	}
}
