package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterSnapshots takes a snapshot on node 1 of a three-node cluster.
// Not archived, it is on node 1 only: with node 1 cordoned a create from it
// is refused, naming the node and saying to archive it. Archived, a create
// from it through node 2 is placed (on node 2, the only node open), which
// fetches it from the object store (the answer, the placement record and
// node 2's log say so) and runs the child with the snapshot's files; the
// snapshot stays archived, for the next create elsewhere. Another tenant's
// key gets 404 for it through every node. Draining node 1 archives the
// snapshots it holds, and a create from one then runs on another node.
func TestClusterSnapshots(t *testing.T) {
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-lease", "3s",
			"--node-capacity", "cpu=4,memory=4Gi,disk=20,sandboxes=8"}})
	ctx := context.Background()
	c1, c2, c3 := cl.Nodes[0].Client(), cl.Nodes[1].Client(), cl.Nodes[2].Client()
	bucket, err := blob.Open(ctx, os.Getenv("ATOLL_TEST_S3_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()

	small := api.CreateSandboxRequest{CPU: 0.25, MemoryMiB: 64, DiskGiB: 1}
	src := onNode1(t, cl, small)[0]
	if _, err := c1.WriteFile(ctx, src.ID, "/root/f", strings.NewReader("made on n1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, c1, src.ID, "head -c 8388608 /dev/urandom > /root/blob && sha256sum /root/blob"); code != 0 {
		t.Fatalf("writing /root/blob: %q exit %d", out, code)
	}
	sum, _ := sh(t, c1, src.ID, "sha256sum /root/blob")
	snap, err := c1.CreateSnapshot(ctx, src.ID, api.CreateSnapshotRequest{Name: "one"})
	if err != nil {
		t.Fatal(err)
	}

	// Not archived, with node 1 cordoned: no node can take it, and the
	// answer says which node holds it and what to do.
	if err := c1.CordonNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	_, err = c2.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: snap.ID, CPU: 0.25, MemoryMiB: 64, DiskGiB: 1})
	var apiErr *atoll.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable ||
		!strings.Contains(apiErr.Message, "node n1") || !strings.Contains(apiErr.Message, "archive") {
		t.Fatalf("create from a snapshot held by cordoned n1: %v; want 503 naming n1 and saying to archive", err)
	}
	t.Logf("not archived, its node cordoned: %v", err)

	// Archiving goes through the node holding it; another refuses.
	if _, err := c2.ArchiveSnapshot(ctx, snap.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || !strings.Contains(apiErr.Message, "node n1") {
		t.Errorf("archive of n1's snapshot through n2: %v; want 409 naming n1", err)
	}
	if a, err := c1.ArchiveSnapshot(ctx, snap.ID); err != nil || a.State != api.SnapshotArchived {
		t.Fatalf("archiving: %+v %v", a, err)
	}

	// Archived: placed on n2 (n1 and n3 cordoned), which pulls it.
	if err := c1.CordonNode(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	child, err := c3.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: snap.ID, CPU: 0.25, MemoryMiB: 64, DiskGiB: 1, Explain: true})
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("create from the archived snapshot: %v\nnode 2: %s", err, tail(cl.Nodes[1].Log()))
	}
	if child.Node != "n2" || child.SnapshotPull == nil || child.SnapshotPull.Snapshot != snap.ID || child.SnapshotPull.Bytes < 8<<20 || child.SnapshotPull.MS <= 0 {
		t.Fatalf("child of the archived snapshot: node %q, snapshot_pull %+v", child.Node, child.SnapshotPull)
	}
	if p := child.Placement; p == nil || p.Node != "n2" || p.Snapshot != snap.ID || !p.SnapshotPull {
		t.Errorf("placement record: %+v; want snapshot %s pulled on n2", p, snap.ID)
	}
	if p, err := c1.GetPlacement(ctx, child.ID); err != nil || !p.SnapshotPull {
		t.Errorf("stored placement record: %+v %v", p, err)
	}
	t.Logf("create from the archived snapshot on n2 in %s; pulling %d bytes took %.1f ms", took.Round(time.Millisecond),
		child.SnapshotPull.Bytes, child.SnapshotPull.MS)
	if got := readFile(t, c1, child.ID, "/root/f"); got != "made on n1" {
		t.Errorf("the child's /root/f on n2: %q", got)
	}
	if got, _ := sh(t, c1, child.ID, "sha256sum /root/blob"); got != sum {
		t.Errorf("the child's /root/blob on n2: %q, want %q", got, sum)
	}
	if !strings.Contains(cl.Nodes[1].Log(), "pulled snapshot") {
		t.Errorf("node 2's log does not say it pulled the snapshot")
	}
	// It stays archived: its object is still there, and n3 can use it too.
	if s, err := c1.GetSnapshot(ctx, snap.ID); err != nil || s.State != api.SnapshotArchived {
		t.Errorf("the snapshot after the create: %+v %v", s, err)
	}
	keys, err := bucket.List(ctx, "snapshots/")
	if err != nil || !slices.Contains(keys, "snapshots/"+snap.ID+".tar") {
		t.Errorf("the snapshot's object after the create: %v %v", keys, err)
	}
	if err := c1.UncordonNode(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	if err := c1.CordonNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	child3 := newSandbox(ctx, t, c1, api.CreateSandboxRequest{Snapshot: snap.ID, CPU: 0.25, MemoryMiB: 64, DiskGiB: 1})
	if child3.Node != "n3" || child3.SnapshotPull == nil {
		t.Errorf("second child: node %q, snapshot_pull %+v; want n3, pulled", child3.Node, child3.SnapshotPull)
	}
	if got := readFile(t, c2, child3.ID, "/root/f"); got != "made on n1" {
		t.Errorf("the child's /root/f on n3: %q", got)
	}
	for _, n := range []string{"n1", "n2"} {
		if err := c1.UncordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}

	// Hostile: another tenant's key, through every node, finds no such
	// snapshot, archived or not.
	k, err := c1.CreateKey(ctx, api.CreateKeyRequest{Name: "other-team"})
	if err != nil {
		t.Fatal(err)
	}
	live, err := c1.CreateSnapshot(ctx, src.ID, api.CreateSnapshotRequest{Name: "two"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.Nodes {
		for _, id := range []string{snap.ID, live.ID} {
			_, err := n.ClientWith(k.Key).CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: id, CPU: 0.25, MemoryMiB: 64, DiskGiB: 1})
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
				t.Errorf("another tenant's create from snapshot %s through %s: %v; want 404", id, n.Name(), err)
			}
		}
	}

	// Draining n1 archives the snapshot it holds; a create from it then
	// runs elsewhere.
	if err := c2.DrainNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the drain to archive n1's snapshot", func() bool {
		s, err := c2.GetSnapshot(ctx, live.ID)
		return err == nil && s.State == api.SnapshotArchived
	})
	if !strings.Contains(cl.Nodes[0].Log(), "drain: snapshot archived") {
		t.Errorf("n1's log does not say the drain archived its snapshot")
	}
	drained := newSandbox(ctx, t, c2, api.CreateSandboxRequest{Snapshot: live.ID, CPU: 0.25, MemoryMiB: 64, DiskGiB: 1})
	if drained.Node == "n1" || drained.SnapshotPull == nil {
		t.Errorf("child of the drained node's snapshot: node %q, snapshot_pull %+v", drained.Node, drained.SnapshotPull)
	}
	if got := readFile(t, c2, drained.ID, "/root/f"); got != "made on n1" {
		t.Errorf("the child's /root/f after the drain: %q", got)
	}
	for _, id := range []string{child.ID, child3.ID, drained.ID} {
		if err := c2.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
