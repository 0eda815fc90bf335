package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterMode runs three `atoll serve --cluster` nodes, each in its own
// network namespace, on the PostgreSQL and S3 servers scripts/test.sh
// starts: creates through one node are placed over all three; a sandbox is
// reached (exec, files, its record) through every node, whichever runs it;
// every node lists the whole cluster and its nodes; and routing never lets
// one tenant's key reach another tenant's sandbox.
func TestClusterMode(t *testing.T) {
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-capacity", "cpu=4,memory=4Gi,disk=20,sandboxes=8"}})
	ctx := context.Background()
	c1, c3 := cl.Nodes[0].Client(), cl.Nodes[2].Client()

	nodes, err := c1.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 {
		t.Fatalf("node 1 lists %d nodes: %+v", len(nodes), nodes)
	}
	for _, n := range nodes {
		if n.State != "live" || n.Capacity.Sandboxes != 8 || n.Epoch < 1 || !strings.HasSuffix(n.Address, ":7443") {
			t.Errorf("node %+v", n)
		}
	}

	// Six creates through node 1, at once: placed over the nodes.
	const n = 6
	t0 := time.Now()
	sbs, err := atOnce(n, func(int) (api.Sandbox, error) {
		return c1.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d creates through node 1 in %s", n, time.Since(t0).Round(time.Millisecond))
	on := map[string][]string{}
	for _, sb := range sbs {
		if sb.State != api.StateRunning {
			t.Errorf("sandbox %s is %s", sb.ID, sb.State)
		}
		on[sb.Node] = append(on[sb.Node], sb.ID)
	}
	t.Logf("placed by node: n1 %d, n2 %d, n3 %d", len(on["n1"]), len(on["n2"]), len(on["n3"]))
	if len(on) < 2 || on[""] != nil {
		t.Errorf("placements by node: %v; want them spread over the nodes", on)
	}

	// Each sandbox, through each node: its record, exec, a file written
	// through one node and read through another.
	for _, sb := range sbs {
		for i, nd := range cl.Nodes {
			c := nd.Client()
			got, err := c.GetSandbox(ctx, sb.ID)
			if err != nil || got.Node != sb.Node || got.State != api.StateRunning {
				t.Errorf("GET %s through node %d: %+v, %v", sb.ID, i+1, got, err)
			}
			if out, code := sh(t, c, sb.ID, "echo $((6*7))"); out != "42\n" || code != 0 {
				t.Errorf("exec in %s (on %s) through node %d: %q exit %d", sb.ID, sb.Node, i+1, out, code)
			}
		}
		body := "written through node 1 for " + sb.ID
		if _, err := c1.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader(body), 0o644); err != nil {
			t.Fatalf("write through node 1: %v", err)
		}
		rc, err := c3.ReadFile(ctx, sb.ID, "/tmp/f")
		if err != nil {
			t.Fatalf("read through node 3: %v", err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != body {
			t.Errorf("read %s through node 3: %q", sb.ID, b)
		}
	}

	// Every node lists the whole cluster.
	for i, nd := range cl.Nodes {
		l, err := nd.Client().ListSandboxes(ctx, atoll.ListOptions{})
		if err != nil || len(l) != n {
			t.Errorf("node %d lists %d sandboxes (%v), want %d", i+1, len(l), err, n)
		}
	}
	nodes, err = c3.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	committed := 0
	for _, nd := range nodes {
		committed += nd.Committed.Sandboxes
		if nd.Committed.Sandboxes != len(on[nd.Name]) {
			t.Errorf("node %s: committed %d sandboxes, runs %d", nd.Name, nd.Committed.Sandboxes, len(on[nd.Name]))
		}
	}

	// Another tenant's key, through any node, finds none of them.
	k, err := c1.CreateKey(ctx, api.CreateKeyRequest{Name: "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	for i, nd := range cl.Nodes {
		other := nd.ClientWith(k.Key)
		for _, sb := range sbs {
			if _, err := other.GetSandbox(ctx, sb.ID); !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("team-b's key through node %d: GET %s (on %s): %v, want not found", i+1, sb.ID, sb.Node, err)
			}
			var out strings.Builder
			if _, err := other.Exec(ctx, sb.ID, api.ExecRequest{Shell: "id"}, &out, &out); !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("team-b's key through node %d: exec in %s: %v, want not found", i+1, sb.ID, err)
			}
		}
	}

	// A client given several nodes' URLs (ATOLL_URL=URL1,URL2) goes on to
	// the next when one is down.
	cl.Nodes[0].Stop()
	hc := &http.Client{Transport: &http.Transport{DialContext: cl.DialLAN}}
	multi := atoll.New(cl.Nodes[0].URL+","+cl.Nodes[1].URL, cl.Nodes[0].Key, atoll.WithHTTPClient(hc))
	for _, sb := range sbs {
		if sb.Node == cl.Nodes[0].Name() {
			// Its node is down: a clean 503, not a hang or a 500.
			var out strings.Builder
			if _, err := multi.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true"}, &out, &out); !errors.Is(err, atoll.ErrUnavailable) {
				t.Errorf("exec in %s, whose node is down: %v, want unavailable", sb.ID, err)
			}
			// Only its tenant learns that: to another tenant's key it
			// is any ID not theirs, and without a key, nothing.
			if _, err := cl.Nodes[1].ClientWith(k.Key).Exec(ctx, sb.ID, api.ExecRequest{Shell: "true"}, &out, &out); !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("team-b's key: exec in %s, whose node is down: %v, want not found", sb.ID, err)
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", cl.Nodes[1].URL+"/v1/sandboxes/"+sb.ID, nil)
			if resp, err := hc.Do(req); err != nil {
				t.Error(err)
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(b), cl.Nodes[0].Name()) {
					t.Errorf("no key: GET %s, whose node is down: %d %s, want 401", sb.ID, resp.StatusCode, b)
				}
			}
			continue
		}
		if out, code := sh(t, multi, sb.ID, "cat /tmp/f"); code != 0 || !strings.HasSuffix(out, sb.ID) {
			t.Errorf("exec in %s (on %s) with node 1 down, over %s,%s: %q exit %d", sb.ID, sb.Node, cl.Nodes[0].URL, cl.Nodes[1].URL, out, code)
		}
	}
	cl.Nodes[0].Start()

	// Deletes through node 3 free the capacity everywhere.
	for _, sb := range sbs {
		if err := c3.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Errorf("delete %s through node 3: %v", sb.ID, err)
		}
	}
	nodes, _ = c1.ListNodes(ctx)
	for _, nd := range nodes {
		if nd.Committed.Sandboxes != 0 {
			t.Errorf("node %s after the deletes: %+v", nd.Name, nd.Committed)
		}
	}
}
