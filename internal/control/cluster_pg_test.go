package control

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/tenant"
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

// TestClusterPrestartServesPlacement checks that a cold create placed on
// a node with a prestarted process takes it, as a create on one machine
// does: the sandbox is the prestarted one, under its ID, the placed row
// goes, its placement record moves to the sandbox, and the sandbox runs
// commands. It runs over the cluster store: it moves placement records.
func TestClusterPrestartServesPlacement(t *testing.T) {
	ctx := context.Background()
	pg := clusterStore(t)
	n := store.Node{Name: "a", Address: "127.0.0.1:7001", Version: "test", Runtimes: []string{"ns"},
		Capacity: store.Resources{CPU: 8, MemoryMiB: 16 << 10, DiskGiB: 100, Sandboxes: 4}}
	epoch, err := pg.Join(ctx, n, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pl := &recordingPlacer{pgPlacer: pgPlacer{c: pg, to: "a"}}
	a := newClusterNode(t, "a", pg.As("a", epoch), Config{Placer: pl, Peers: &peers{}, Prestart: 1})
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	// Rows in the store name the prestarted sandboxes still starting too;
	// the pool's are those ready to serve a create.
	prestartedRows := func() []string {
		t.Helper()
		sbs, err := a.st.ListNode(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range sbs {
			if sb.State == lifecycle.Prestarted {
				ids = append(ids, sb.ID)
			}
		}
		return ids
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	var pre []string
	for deadline := time.Now().Add(60 * time.Second); len(pre) != 1; pre = a.pools.Prestarted() {
		if time.Now().After(deadline) {
			t.Fatalf("no process was prestarted: %v", pre)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Run keeps the prestarted process: it discards them when it ends.
	defer func() { cancel(); <-done }()

	got, err := a.Create(ctx, api.CreateSandboxRequest{Env: map[string]string{"E": "1"}, Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != pre[0] || got.ID == pl.last || got.State != api.StateRunning || got.Node != "a" {
		t.Errorf("placed cold with a prestarted process: %s %s on %q; want the prestarted %s running on a, not the placed %s", got.ID, got.State, got.Node, pre[0], pl.last)
	}
	if !a.alive(t, got.ID) {
		t.Error("the sandbox served from a prestarted process: its init does not run")
	}
	if _, err := a.st.Get(ctx, pl.last); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the placed row %s served by a prestarted process is still there: %v", pl.last, err)
	}
	if p, err := a.Placement(ctx, got.ID); err != nil || p.Sandbox != got.ID || p.Node != "a" {
		t.Errorf("placement record of %s: %+v, %v; want the placed row's, naming it", got.ID, p, err)
	}
	if got.Placement == nil || got.Placement.Sandbox != got.ID {
		t.Errorf("explained placement: %+v, want it naming %s", got.Placement, got.ID)
	}
	if left := prestartedRows(); slices.Contains(left, got.ID) {
		t.Errorf("prestarted rows after the create: %v, the sandbox %s still one", left, got.ID)
	}
	if res, err := a.agentClient(a.sock(t, got.ID)).Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", "test \"$E\" = 1"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the sandbox served from a prestarted process, with its environment: %+v, %v", res, err)
	}

	// A tenant whose quota the placed row fills is served all the same:
	// the placed row's charge goes with it, in the same write.
	if err := pg.SetQuota(ctx, tenant.Default, store.Quota{Sandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); len(pre) != 1 || pre[0] == got.ID; pre = a.pools.Prestarted() {
		if time.Now().After(deadline) {
			t.Fatalf("no process was prestarted again: %v", pre)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err = a.Create(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != pre[0] || got.State != api.StateRunning || !a.alive(t, got.ID) {
		t.Errorf("placed cold at the tenant's quota: %s %s; want the prestarted %s running", got.ID, got.State, pre[0])
	}
	if _, err := a.Create(ctx, api.CreateSandboxRequest{}); !errors.Is(err, errdefs.ErrQuota) {
		t.Errorf("a create over the tenant's quota: %v, want refused", err)
	}
}

// recordingPlacer is a pgPlacer that writes a cold placement's record, as
// the scheduler does, and keeps the ID of the last sandbox it placed.
type recordingPlacer struct {
	pgPlacer
	last string
}

func (p *recordingPlacer) Place(ctx context.Context, sb *store.Sandbox, req api.CreateSandboxRequest, snapshotNode string) error {
	p.last = sb.ID
	sb.Placement = json.RawMessage(`{"sandbox":"` + sb.ID + `","node":"` + p.to + `"}`)
	return p.pgPlacer.Place(ctx, sb, req, snapshotNode)
}
