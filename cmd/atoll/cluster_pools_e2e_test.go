package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
)

// TestClusterWarmPools runs three cluster nodes whose warm pools follow
// demand (--warm-pool 2 each at most). With no creates, no node keeps a
// warm sandbox. After a stream of creates of the built-in template through
// every node, each node keeps its share warm; then a burst of creates
// through all three nodes at once takes the warm sandboxes first (their
// placement records say warm, and the sandbox answered is the pooled one,
// running with what the create asked for), and the rest start cold, spread
// over every node.
func TestClusterWarmPools(t *testing.T) {
	testenv.RequireRoot(t)
	cl := netcluster.New(t, netcluster.Config{Bin: atollBinary(t), Cluster: true,
		Args: []string{"--warm-pool", "2", "--prestart", "0", "--node-lease", "3s",
			"--node-capacity", "cpu=8,memory=8Gi,disk=80,sandboxes=16"}})
	ctx := context.Background()
	c1 := cl.Nodes[0].Client()
	small := api.CreateSandboxRequest{CPU: 0.5, MemoryMiB: 128, DiskGiB: 1}
	warm := func() map[string]int {
		t.Helper()
		ns, err := c1.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, n := range ns {
			out[n.Name] = n.Warm[""]
		}
		return out
	}

	// No demand, no warm sandboxes.
	time.Sleep(3 * time.Second)
	for n, w := range warm() {
		if w != 0 {
			t.Errorf("node %s keeps %d warm sandboxes before anyone created one", n, w)
		}
	}

	// Demand: 18 creates (and deletes) in a few seconds, 3.6 a minute
	// over the 5-minute window, 1.2 per node and minute: 2 warm each.
	var wg sync.WaitGroup
	for i := range cl.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cl.Nodes[i].Client()
			for range 6 {
				sb, err := c.CreateSandbox(ctx, small)
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	deadline := time.Now().Add(60 * time.Second)
	for w := warm(); w["n1"] != 2 || w["n2"] != 2 || w["n3"] != 2; w = warm() {
		if time.Now().After(deadline) {
			ns, _ := c1.ListNodes(ctx)
			for _, n := range ns {
				t.Logf("%s: warm %v, demand %v, committed %+v", n.Name, n.Warm, n.Demand, n.Committed)
			}
			t.Fatalf("after the demand, warm sandboxes by node %v; want 2 each", w)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ns, _ := c1.ListNodes(ctx)
	for _, n := range ns {
		t.Logf("%s: warm %v, demand %v a minute", n.Name, n.Warm, n.Demand)
	}
	// A scheduler's view of the nodes is up to a second old
	// (scheduler.Config.Refresh): once every view is newer than the
	// pools, every scheduler counts on them.
	time.Sleep(1500 * time.Millisecond)

	// The burst: 24 creates, 8 through each node at once.
	type made struct {
		sb api.Sandbox
		ms float64
	}
	var mu sync.Mutex
	var all []made
	for i := range cl.Nodes {
		for k := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := small
				req.Explain = true
				req.Env = map[string]string{"BURST": fmt.Sprintf("%d-%d", i, k)}
				t0 := time.Now()
				sb, err := cl.Nodes[i].Client().CreateSandbox(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, made{sb, float64(time.Since(t0).Microseconds()) / 1000})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	warmOn, coldOn := map[string]int{}, map[string]int{}
	var warmMS, coldMS []float64
	for _, m := range all {
		sb := m.sb
		if sb.Placement == nil || sb.Placement.Node != sb.Node || sb.Placement.Sandbox != sb.ID {
			t.Errorf("%s on %s: placement %+v", sb.ID, sb.Node, sb.Placement)
			continue
		}
		if sb.State != api.StateRunning || sb.CPU != 0.5 || sb.MemoryMiB != 128 {
			t.Errorf("%s: %s with %v CPU, %d MiB; want running with what the create asked for", sb.ID, sb.State, sb.CPU, sb.MemoryMiB)
		}
		if sb.Placement.Warm {
			warmOn[sb.Node]++
			warmMS = append(warmMS, m.ms)
		} else {
			coldOn[sb.Node]++
			coldMS = append(coldMS, m.ms)
		}
	}
	t.Logf("burst of 24: warm by node %v (ms %v), cold by node %v (ms %v)", warmOn, median(warmMS), coldOn, median(coldMS))
	if warmOn["n1"]+warmOn["n2"]+warmOn["n3"] < 6 {
		t.Errorf("the burst took %v warm sandboxes by node, want the 6 waiting", warmOn)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if warmOn[n] == 0 {
			t.Errorf("no warm sandbox taken on %s", n)
		}
		if coldOn[n] == 0 {
			t.Errorf("no cold start on %s: cold by node %v", n, coldOn)
		}
	}
	if t.Failed() {
		for _, m := range all {
			p := m.sb.Placement
			var cs []string
			for _, c := range p.Candidates {
				cs = append(cs, fmt.Sprintf("%s %.3f %v %v", c.Node, c.Score, c.Parts, c.Drawn))
			}
			t.Logf("%s warm %v on %s, refused %v, draw %s: %s", m.sb.ID, p.Warm, m.sb.Node, p.Refused, p.Draw, strings.Join(cs, "; "))
		}
	}

	// A sandbox served warm is the one the create asked for, with its
	// environment, and its placement record is kept under its ID.
	for _, m := range all {
		if !m.sb.Placement.Warm {
			continue
		}
		sb := m.sb
		var out strings.Builder
		code, err := c1.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo -n $BURST"}}, &out, io.Discard)
		if err != nil || code != 0 || out.Len() == 0 {
			t.Errorf("exec in %s, served warm: exit %d, %q, %v", sb.ID, code, out.String(), err)
		}
		p, err := c1.GetPlacement(ctx, sb.ID)
		if err != nil || !p.Warm || p.Sandbox != sb.ID || p.Node != sb.Node {
			t.Errorf("placement of %s, served warm: %+v, %v", sb.ID, p, err)
		}
		break
	}
	for _, m := range all {
		if err := c1.DeleteSandbox(ctx, m.sb.ID); err != nil {
			t.Errorf("delete %s: %v", m.sb.ID, err)
		}
	}
}

// median of ms, 0 for none.
func median(ms []float64) float64 {
	if len(ms) == 0 {
		return 0
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	return s[len(s)/2]
}
