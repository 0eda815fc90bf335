package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// moveCluster is three cluster nodes with a short lease and a warm pool
// of warm sandboxes each.
func moveCluster(t *testing.T, warm int) *netcluster.Cluster {
	return startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", strconv.Itoa(warm), "--prestart", "0", "--node-lease", "3s",
			"--node-capacity", "cpu=4,memory=4Gi,disk=20,sandboxes=8"}})
}

// onNode1 creates sandboxes for reqs, all on node 1: the others are
// cordoned meanwhile.
func onNode1(t *testing.T, cl *netcluster.Cluster, reqs ...api.CreateSandboxRequest) []api.Sandbox {
	t.Helper()
	ctx := context.Background()
	c := cl.Nodes[0].Client()
	for _, n := range cl.Nodes[1:] {
		if err := c.CordonNode(ctx, n.Name()); err != nil {
			t.Fatal(err)
		}
	}
	var out []api.Sandbox
	for _, req := range reqs {
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "n1" {
			t.Fatalf("sandbox %s placed on %s with the others cordoned", sb.ID, sb.Node)
		}
		out = append(out, sb)
	}
	for _, n := range cl.Nodes[1:] {
		if err := c.UncordonNode(ctx, n.Name()); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func readFile(t *testing.T, c *atoll.Client, id, path string) string {
	t.Helper()
	rc, err := c.ReadFile(context.Background(), id, path)
	if err != nil {
		t.Fatalf("reading %s in %s: %v", path, id, err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

// TestClusterDrain drains a node holding a running, a stopped and an
// archived sandbox. While the other nodes are cordoned, the drain leaves
// them as they are and reports them left; then it moves all three through
// object storage to the other nodes, the running one running again there; IDs, labels and
// files are unchanged, its warm pool is emptied, and node ls shows the
// drain done, with nothing left on the node.
func TestClusterDrain(t *testing.T) {
	cl := moveCluster(t, 1)
	ctx := context.Background()
	c1, c2 := cl.Nodes[0].Client(), cl.Nodes[1].Client()
	sbs := onNode1(t, cl,
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2, Labels: map[string]string{"role": "running"},
			Network: &api.NetworkPolicy{Egress: "deny-all", Allow: []string{"192.0.2.0/24"}}},
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2, Labels: map[string]string{"role": "stopped"}},
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2, Labels: map[string]string{"role": "archived"}})
	for _, sb := range sbs {
		if _, err := c1.WriteFile(ctx, sb.ID, "/root/f", strings.NewReader("before the drain "+sb.ID), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run, stopped, archived := sbs[0], sbs[1], sbs[2]
	for _, sb := range []api.Sandbox{stopped, archived} {
		if _, err := c1.StopSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c1.ArchiveSandbox(ctx, archived.ID); err != nil {
		t.Fatal(err)
	}

	// n1 holds the running, the stopped (a slot) and its warm sandbox (the
	// second CPU); the archived one holds nothing.
	if n1 := waitNode(t, c1, "n1", func(n api.Node) bool { return n.Committed.Sandboxes == 3 && n.Committed.CPU == 2 }); t.Failed() {
		t.Fatalf("n1 before the drain: %+v", n1.Committed)
	}

	// With the other nodes cordoned, nothing can move: the drain leaves
	// all three as they are, and says so.
	for _, n := range []string{"n2", "n3"} {
		if err := c1.CordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c2.DrainNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, c1, "n1", func(n api.Node) bool { return n.Drain != nil && len(n.Drain.Left) == 3 && n.Drain.Moved == 0 })
	if sb, err := c1.GetSandbox(ctx, run.ID); err != nil || sb.State != api.StateRunning || sb.Node != "n1" || sb.StartedAt.Sub(*run.StartedAt).Abs() > time.Millisecond {
		t.Errorf("the running one with nowhere to go: %s on %s, started %v (was %v), %v", sb.State, sb.Node, sb.StartedAt, run.StartedAt, err)
	}
	if sb, err := c1.GetSandbox(ctx, stopped.ID); err != nil || sb.State != api.StateStopped {
		t.Errorf("the stopped one with nowhere to go: %s, %v", sb.State, err)
	}

	// Room again: the drain goes on.
	t0 := time.Now()
	for _, n := range []string{"n2", "n3"} {
		if err := c1.UncordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{run.ID: api.StateRunning, stopped.ID: api.StateArchived, archived.ID: api.StateArchived}
	deadline := time.Now().Add(60 * time.Second)
	for {
		done := 0
		for id, state := range want {
			sb, err := c2.GetSandbox(ctx, id)
			if err == nil && sb.Node != "n1" && sb.State == state {
				done++
			}
		}
		if done == len(want) {
			break
		}
		if time.Now().After(deadline) {
			for id := range want {
				sb, err := c2.GetSandbox(ctx, id)
				t.Logf("%s: %s on %s (%q) %v", id, sb.State, sb.Node, sb.Error, err)
			}
			t.Fatalf("the drain did not move every sandbox in 60 s\n%s", cl.Nodes[0].Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("drained 3 sandboxes (running, stopped, archived) in %s", time.Since(t0).Round(time.Millisecond))

	for _, sb := range sbs {
		got, err := c1.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		// A moved sandbox says why, until it starts again (the running
		// one did, on its new node, after the drain began).
		moved := got.Error == "node n1 is draining" || got.State == api.StateRunning && got.StartedAt != nil && got.StartedAt.After(t0)
		if got.ID != sb.ID || got.Labels["role"] != sb.Labels["role"] || !moved {
			t.Errorf("%s after the move: labels %v, error %q, started %v", sb.ID, got.Labels, got.Error, got.StartedAt)
		}
		if sb.ID == run.ID && (got.Network == nil || got.Network.Policy.Egress != "deny-all" || len(got.Network.Policy.Allow) != 1) {
			t.Errorf("the running one's network after the move: %+v", got.Network)
		}
		if got.State == api.StateArchived {
			if got, err = c1.StartSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning || got.Node == "n1" {
				t.Fatalf("start %s after the move: %s on %s, %v", sb.ID, got.State, got.Node, err)
			}
		}
		if f := readFile(t, c1, sb.ID, "/root/f"); f != "before the drain "+sb.ID {
			t.Errorf("%s on %s after the move: /root/f is %q", sb.ID, got.Node, f)
		}
	}

	// The drain is done: node ls says so, and n1 holds nothing, not even
	// a warm sandbox.
	n1 := waitNode(t, c1, "n1", func(n api.Node) bool {
		return n.Schedule == api.NodeDraining && n.Drain != nil && len(n.Drain.Left) == 0 && n.Committed.Sandboxes == 0
	})
	if n1.Drain != nil && n1.Drain.Moved != 3 {
		t.Errorf("n1's drain reports %d moved, want 3", n1.Drain.Moved)
	}
}

// waitNode waits up to 10 s for node name to be as ok says; an error if
// it is not by then.
func waitNode(t *testing.T, c *atoll.Client, name string, ok func(api.Node) bool) api.Node {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns, err := c.ListNodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var nd api.Node
		for _, n := range ns {
			if n.Name == name {
				nd = n
			}
		}
		if ok(nd) {
			return nd
		}
		if time.Now().After(deadline) {
			t.Errorf("node %s: %+v, drain %+v", name, nd, nd.Drain)
			return nd
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestClusterRestoreLost kills -9 a node whose sandbox takes checkpoints
// every 2 s: once it is lost, a start through another node restores it
// there from its latest checkpoint, with the file written before it, and
// says from when. A lost sandbox of which nothing reached object storage
// is a conflict saying so.
func TestClusterRestoreLost(t *testing.T) {
	cl := moveCluster(t, 0)
	ctx := context.Background()
	c1, c2 := cl.Nodes[0].Client(), cl.Nodes[1].Client()
	sbs := onNode1(t, cl,
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2, CheckpointEverySec: 2, Labels: map[string]string{"k": "v"}},
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2},
		api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256, DiskGiB: 2, CheckpointEverySec: 3600})
	cp, bare, hourly := sbs[0], sbs[1], sbs[2]
	// Stopped, a checkpointing sandbox's last checkpoint has all its
	// files, however long its interval.
	if _, err := c1.WriteFile(ctx, hourly.ID, "/root/f", strings.NewReader("written before the stop"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.StopSandbox(ctx, hourly.ID); err != nil {
		t.Fatal(err)
	}
	if cp.CheckpointEverySec != 2 {
		t.Errorf("created with checkpoint_every_sec %d", cp.CheckpointEverySec)
	}
	if _, err := c1.WriteFile(ctx, cp.ID, "/root/f", strings.NewReader("checkpointed"), 0o644); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	// Two intervals and a little: a checkpoint after the write reached
	// object storage.
	time.Sleep(5 * time.Second)
	if sb, err := c1.GetSandbox(ctx, cp.ID); err != nil || sb.CheckpointedAt == nil || sb.CheckpointedAt.Before(written) {
		t.Errorf("before the kill: checkpointed_at %v (written at %s), %v", sb.CheckpointedAt, written, err)
	}
	cl.Nodes[0].Kill()
	killed := time.Now()

	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := c2.GetSandbox(ctx, cp.ID)
		if err == nil && sb.State == api.StateLost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox on the killed node: %s, %v; want lost", sb.State, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("lost %s after the kill", time.Since(killed).Round(time.Millisecond))

	t0 := time.Now()
	got, err := c2.StartSandbox(ctx, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restored in %s: %q on %s", time.Since(t0).Round(time.Millisecond), got.RestoredFrom, got.Node)
	if got.State != api.StateRunning || got.Node == "n1" || got.Node == "" || got.ID != cp.ID || got.Labels["k"] != "v" {
		t.Errorf("restored: %+v", got)
	}
	at, ok := strings.CutPrefix(got.RestoredFrom, "checkpoint ")
	when, perr := time.Parse(time.RFC3339, at)
	if !ok || perr != nil || when.Before(written.Add(-time.Second)) || when.After(killed) {
		t.Errorf("restored_from %q: want a checkpoint between the write (%s) and the kill (%s)", got.RestoredFrom, written.Format(time.RFC3339), killed.Format(time.RFC3339))
	}
	if f := readFile(t, c2, cp.ID, "/root/f"); f != "checkpointed" {
		t.Errorf("after the restore /root/f is %q", f)
	}
	// Through any node, the record says where it went and why.
	if sb, err := cl.Nodes[2].Client().GetSandbox(ctx, cp.ID); err != nil || sb.Node != got.Node || sb.State != api.StateRunning {
		t.Errorf("record after the restore: %s on %s, %v", sb.State, sb.Node, err)
	}

	got, err = c2.StartSandbox(ctx, hourly.ID)
	if err != nil || got.State != api.StateRunning || !strings.HasPrefix(got.RestoredFrom, "checkpoint ") {
		t.Errorf("restore of the stopped one: %s, %q, %v", got.State, got.RestoredFrom, err)
	} else if f := readFile(t, c2, hourly.ID, "/root/f"); f != "written before the stop" {
		t.Errorf("after the restore of the stopped one /root/f is %q", f)
	}

	_, err = c2.StartSandbox(ctx, bare.ID)
	var ae *atoll.Error
	if !errors.Is(err, atoll.ErrConflict) || !errors.As(err, &ae) || !strings.Contains(ae.Message, "nothing of it reached object storage") {
		t.Errorf("start of a lost sandbox with nothing stored: %v; want a conflict saying so", err)
	}
	if sb, _ := c2.GetSandbox(ctx, bare.ID); sb.State != api.StateLost {
		t.Errorf("the bare sandbox after the refused restore: %s", sb.State)
	}
	// What cannot be restored can be deleted, through any node.
	if err := cl.Nodes[2].Client().DeleteSandbox(ctx, bare.ID); err != nil {
		t.Errorf("delete of a lost sandbox: %v", err)
	}
	if _, err := c2.GetSandbox(ctx, bare.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("the lost sandbox after its delete: %v", err)
	}
}
