package main

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterQuota checks that a tenant's quota holds across a cluster's
// nodes: creates through two nodes at once, each placing with its own
// scheduler on both nodes (room for 12 sandboxes each, so that the 24 creates all find room), make exactly
// max_sandboxes (6), the rest answered 429
// quota_exceeded naming the quota; every node reports the same use; a
// stopped sandbox is not started again over the quota through either; and
// a tenant's create rate is the cluster's, not each node's.
func TestClusterQuota(t *testing.T) {
	testenv.RequireRoot(t)
	cl := netcluster.New(t, netcluster.Config{Bin: atollBinary(t), Cluster: true, Nodes: 2,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-capacity", "cpu=8,memory=16Gi,disk=100,sandboxes=12"}})
	ctx := context.Background()
	admin := cl.Nodes[0].Client()
	k, err := admin.CreateKey(ctx, api.CreateKeyRequest{Name: "team-c"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Nodes[1].Client().SetQuota(ctx, "team-c", api.TenantQuota{MaxSandboxes: 6}); err != nil {
		t.Fatal(err)
	}
	clients := []*atoll.Client{cl.Nodes[0].ClientWith(k.Key), cl.Nodes[1].ClientWith(k.Key)}
	// The cluster's cleanup deletes the admin's sandboxes, the only ones
	// its key sees: team-c's go first.
	t.Cleanup(func() {
		sbs, _ := clients[0].ListSandboxes(ctx, atoll.ListOptions{})
		for _, sb := range sbs {
			if err := clients[0].DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: deleting %s: %v", sb.ID, err)
			}
		}
	})
	small := api.CreateSandboxRequest{CPU: 0.25, MemoryMiB: 128, DiskGiB: 1}

	// Each node's scheduler sees both nodes once its view is newer than
	// the last join (scheduler.Config.Refresh, a second).
	time.Sleep(1500 * time.Millisecond)
	made, refused := createAtOnce(t, clients, 24, small, func(e *atoll.Error) bool {
		return e.Code == api.CodeQuota && e.Quota != nil && e.Quota.Name == "max_sandboxes" && e.Quota.Limit == 6
	})
	nodes := map[string]int{}
	for _, sb := range made {
		nodes[sb.Node]++
	}
	t.Logf("24 creates through 2 nodes against max_sandboxes 6: %d made (by node %v), %d refused", len(made), nodes, refused)
	if len(made) != 6 || refused != 18 {
		t.Fatalf("%d made, %d refused; want 6 and 18", len(made), refused)
	}
	if len(nodes) != 2 {
		t.Errorf("sandboxes on %v, want both nodes", nodes)
	}
	for i, c := range clients {
		tn, err := c.GetTenant(ctx, "team-c")
		if err != nil || tn.Used.Sandboxes != 6 {
			t.Errorf("team-c through n%d: %+v, %v", i+1, tn.Used, err)
		}
	}

	// A stop makes room for one create, through the other node; the
	// stopped one then cannot start again through either.
	if _, err := clients[0].StopSandbox(ctx, made[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := clients[1].CreateSandbox(ctx, small); err != nil {
		t.Fatalf("create after a stop: %v", err)
	}
	for i, c := range clients {
		_, err := c.StartSandbox(ctx, made[0].ID)
		var e *atoll.Error
		if !errors.As(err, &e) || e.StatusCode != 429 || e.Quota == nil || e.Quota.Name != "max_sandboxes" || e.Quota.Used != 6 {
			t.Errorf("start over quota through n%d: %v", i+1, err)
		}
	}

	// One create in 5 s, creates through both nodes at once: one is made
	// in all (buckets of each node's would make one through each), the
	// others are told when to come back.
	kd, err := admin.CreateKey(ctx, api.CreateKeyRequest{Name: "team-d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetQuota(ctx, "team-d", api.TenantQuota{CreatesPerSecond: 0.2}); err != nil {
		t.Fatal(err)
	}
	rated := []*atoll.Client{cl.Nodes[0].ClientWith(kd.Key, atoll.WithBusyRetries(0)),
		cl.Nodes[1].ClientWith(kd.Key, atoll.WithBusyRetries(0))}
	t.Cleanup(func() {
		sbs, _ := rated[0].ListSandboxes(ctx, atoll.ListOptions{})
		for _, sb := range sbs {
			if err := rated[0].DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: deleting %s: %v", sb.ID, err)
			}
		}
	})
	made, refused = createAtOnce(t, rated, 8, small, func(e *atoll.Error) bool {
		return e.StatusCode == 429 && e.Quota != nil && e.Quota.Name == "creates_per_second" && e.RetryAfter > 0
	})
	if len(made) != 1 || refused != 7 {
		t.Errorf("8 creates at once through 2 nodes at 0.2 a second: %d made, %d refused; want 1 and 7", len(made), refused)
	}
}

// createAtOnce sends n creates of req at once, the i-th through
// clients[i%len(clients)], and returns the sandboxes made and how many
// were refused as refusal says; any other failure fails t.
func createAtOnce(t *testing.T, clients []*atoll.Client, n int, req api.CreateSandboxRequest, refusal func(*atoll.Error) bool) (made []api.Sandbox, refused int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := clients[i%len(clients)].CreateSandbox(context.Background(), req)
			mu.Lock()
			defer mu.Unlock()
			var e *atoll.Error
			switch {
			case err == nil:
				made = append(made, sb)
			case errors.As(err, &e) && refusal(e):
				refused++
			default:
				t.Errorf("create through node %d: %v", i%len(clients)+1, err)
			}
		}()
	}
	wg.Wait()
	return made, refused
}
