package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterPlacement runs three cluster nodes, n1 labelled zone=a and n2,
// n3 zone=b, each with room for three sandboxes: a node selector puts
// sandboxes only on the nodes that carry it, and one no node carries is a
// 503 naming it; `atoll create --explain` names every node, a cordoned
// node among those filtered out, with why; the placement record is kept
// with the sandbox; and creates through all three nodes at once fill the
// cluster to exactly its capacity, the rest answered 503 unavailable, no
// node over its capacity.
func TestClusterPlacement(t *testing.T) {
	const viewAge = 1500 * time.Millisecond
	zones := map[int]string{1: "a", 2: "b", 3: "b"}
	bin := atollBinary(t)
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args:     []string{"--warm-pool", "0", "--prestart", "0", "--node-capacity", "cpu=2,memory=4Gi,disk=20,sandboxes=3"},
		NodeArgs: func(i int) []string { return []string{"--node-label", "zone=" + zones[i]} }})
	ctx := context.Background()
	c1 := cl.Nodes[0].Client()
	small := api.CreateSandboxRequest{CPU: 0.5, MemoryMiB: 128, DiskGiB: 1}
	var made []string
	deleteAll := func() {
		t.Helper()
		for _, id := range made {
			if err := c1.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("delete %s: %v", id, err)
			}
		}
		made = nil
	}

	// The CLI, run in node 3's namespace (which reaches every node's API on
	// the LAN), against node 3.
	cli := func(args ...string) (string, error) {
		t.Helper()
		n := cl.Nodes[2]
		cmd := exec.Command("nsenter", append([]string{"--net=" + n.Netns, bin}, args...)...)
		cmd.Env = append(os.Environ(), "ATOLL_URL="+n.URL, "ATOLL_API_KEY="+n.Key)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// A scheduler's view of the nodes is up to a second old
	// (scheduler.Config.Refresh): the one each node read when it joined
	// may lack the nodes that joined after it. Once every view is newer,
	// every placement record names all three.
	time.Sleep(viewAge)
	t.Run("selector", func(t *testing.T) {
		for i := range 3 {
			req := small
			req.NodeSelector = map[string]string{"zone": "b"}
			sb, err := cl.Nodes[i].Client().CreateSandbox(ctx, req)
			if err != nil {
				t.Fatalf("create with zone=b through node %d: %v", i+1, err)
			}
			made = append(made, sb.ID)
			if sb.Node != "n2" && sb.Node != "n3" {
				t.Errorf("zone=b sandbox %s went to %s", sb.ID, sb.Node)
			}
			if sb.Placement != nil {
				t.Errorf("a create that did not ask to explain answered its placement: %+v", sb.Placement)
			}
			// The record is kept: the filtered node is counted, not named.
			p, err := c1.GetPlacement(ctx, sb.ID)
			if err != nil || p.Node != sb.Node || p.Sandbox != sb.ID || p.Passed != 2 || p.Excluded["selector"] != 1 ||
				p.Selector["zone"] != "b" || len(p.Candidates) != 2 {
				t.Errorf("placement of %s: %+v, %v", sb.ID, p, err)
			}
		}
		out, err := cli("create", "--cpu", "0.5", "--memory", "128", "--disk", "1", "--node-selector", "zone=a", "--explain")
		if err != nil {
			t.Fatalf("atoll create --node-selector zone=a --explain: %v\n%s", err, out)
		}
		t.Logf("atoll create --node-selector zone=a --explain:\n%s", out)
		id, _, _ := strings.Cut(out, "\n")
		made = append(made, id)
		sb, err := c1.GetSandbox(ctx, id)
		if err != nil || sb.Node != "n1" {
			t.Errorf("zone=a sandbox: %+v, %v; want it on n1", sb, err)
		}
		for _, want := range []string{"placed on n1: 3 nodes, 1 candidates, 2 filtered out", "n1 won: the only node",
			"n2  selector  selector zone=a", "n3  selector  selector zone=a"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain output lacks %q", want)
			}
		}

		// Every node carries its name: n1 (which has room: the zone=b
		// three may have filled n3) through node 3.
		req := small
		req.NodeSelector = map[string]string{api.NodeNameLabel: "n1"}
		sb, err = cl.Nodes[2].Client().CreateSandbox(ctx, req)
		if err != nil || sb.Node != "n1" {
			t.Errorf("create with %s=n1 through n3: %+v, %v; want it on n1", api.NodeNameLabel, sb, err)
		}
		if err == nil {
			made = append(made, sb.ID)
		}

		// No node carries zone=c: 503, naming the selector.
		req = small
		req.NodeSelector = map[string]string{"zone": "c"}
		_, err = c1.CreateSandbox(ctx, req)
		var e *atoll.Error
		if !errors.As(err, &e) || e.StatusCode != 503 || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "zone=c") {
			t.Errorf("create with a selector no node carries: %v; want 503 unavailable naming zone=c", err)
		}
		deleteAll()
	})

	t.Run("cordoned", func(t *testing.T) {
		if err := c1.CordonNode(ctx, "n2"); err != nil {
			t.Fatal(err)
		}
		// Until the views are read again, the store refuses placements
		// on n2 and they go to the next candidate (Placement.Refused);
		// then the schedulers filter it out.
		time.Sleep(viewAge)
		defer func() {
			if err := c1.UncordonNode(ctx, "n2"); err != nil {
				t.Error(err)
			}
		}()
		out, err := cli("create", "--cpu", "0.5", "--memory", "128", "--disk", "1", "--explain")
		if err != nil {
			t.Fatalf("atoll create --explain: %v\n%s", err, out)
		}
		t.Logf("atoll create --explain, n2 cordoned:\n%s", out)
		id, _, _ := strings.Cut(out, "\n")
		made = append(made, id)
		for _, want := range []string{"3 nodes, 2 candidates, 1 filtered out", "n2  schedule  cordoned", " n1 ", " n3 ", " won"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain output lacks %q", want)
			}
		}
		sb, err := c1.GetSandbox(ctx, id)
		if err != nil || sb.Node == "n2" || sb.Node == "" {
			t.Errorf("sandbox created while n2 is cordoned: %+v, %v", sb, err)
		}
		// The API answers the same through the SDK, with ?explain's twin.
		req := small
		req.Explain = true
		sb, err = cl.Nodes[1].Client().CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, sb.ID)
		p := sb.Placement
		if p == nil || p.Node != sb.Node || len(p.Filtered) != 1 || p.Filtered[0] != (api.PlacementFiltered{Node: "n2", Filter: "schedule", Reason: "cordoned"}) {
			t.Errorf("create with explain through n2: %+v", p)
		}
		deleteAll()
	})

	t.Run("capacity", func(t *testing.T) {
		// Twelve creates, four through each node, at once, into room for
		// nine.
		const perNode = 4
		type result struct {
			sb  api.Sandbox
			err error
		}
		res := make([]result, 3*perNode)
		var wg sync.WaitGroup
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i].sb, res[i].err = cl.Nodes[i%3].Client().CreateSandbox(ctx, small)
			}()
		}
		wg.Wait()
		on := map[string]int{}
		var full int
		for _, r := range res {
			var e *atoll.Error
			switch {
			case r.err == nil:
				made = append(made, r.sb.ID)
				on[r.sb.Node]++
			case errors.As(r.err, &e) && e.StatusCode == 503 && e.Code == api.CodeUnavailable:
				full++
			default:
				t.Errorf("create: %v; want a sandbox or 503 unavailable", r.err)
			}
		}
		t.Logf("placed by node: %v; %d answered 503", on, full)
		if len(made) != 9 || full != 3 {
			t.Errorf("%d created, %d refused; want 9 and 3", len(made), full)
		}
		nodes, err := c1.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			c, cap := n.Committed, n.Capacity
			if c.Sandboxes > cap.Sandboxes || c.CPU > cap.CPU || c.MemoryMiB > cap.MemoryMiB || c.DiskGiB > cap.DiskGiB {
				t.Errorf("node %s over capacity: %+v of %+v", n.Name, c, cap)
			}
			if c.Sandboxes != on[n.Name] {
				t.Errorf("node %s: committed %d sandboxes, runs %d", n.Name, c.Sandboxes, on[n.Name])
			}
		}
		// The next create: a clean 503 JSON error, naming why.
		_, err = cl.Nodes[1].Client().CreateSandbox(ctx, small)
		var e *atoll.Error
		if !errors.As(err, &e) || e.StatusCode != 503 || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "no room") {
			t.Errorf("create into a full cluster: %v; want 503 unavailable", err)
		} else {
			t.Logf("a create into the full cluster: %d %s: %s", e.StatusCode, e.Code, e.Message)
		}
		deleteAll()
	})
}

// TestSingleMachinePlacement: on one machine, --explain says there is one
// node, `atoll placement` says nothing is placed, and a node selector is
// refused, each in words.
func TestSingleMachinePlacement(t *testing.T) {
	d, _, _ := startRooted(t, "--warm-pool", "0", "--prestart", "0")
	out, code := d.cli("create", "--explain")
	if code != 0 {
		t.Fatalf("atoll create --explain: %s", out)
	}
	id, rest, _ := strings.Cut(out, "\n")
	if !strings.Contains(rest, "single machine: one node runs every sandbox") {
		t.Errorf("atoll create --explain on one machine:\n%s", out)
	}
	if out, code := d.cli("placement", id); code == 0 || !strings.Contains(out, "single machine") {
		t.Errorf("atoll placement on one machine: exit %d: %s", code, out)
	}
	if out, code := d.cli("create", "--node-selector", "zone=a"); code == 0 || !strings.Contains(out, "node_selector needs cluster mode") {
		t.Errorf("atoll create --node-selector on one machine: exit %d: %s", code, out)
	}
	if out, code := d.cli("rm", id); code != 0 {
		t.Errorf("atoll rm: %s", out)
	}
}
