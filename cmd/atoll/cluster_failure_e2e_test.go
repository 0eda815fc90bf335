package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// failLease is the nodes' lease in the failure tests: short, for speed.
const failLease = 3 * time.Second

// failCluster starts three cluster nodes with a short lease and the
// capacity disk (GiB) each, and makes six sandboxes of 10 GiB through node
// 1, each with a file written through node 1. It returns them by node
// name. With a disk of 20, they fill the cluster, two a node.
func failCluster(t *testing.T, disk int) (*netcluster.Cluster, map[string][]api.Sandbox) {
	t.Helper()
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-capacity", fmt.Sprintf("cpu=4,memory=4Gi,disk=%d,sandboxes=16", disk),
			"--node-lease", failLease.String()}})
	ctx := context.Background()
	c1 := cl.Nodes[0].Client()
	on := map[string][]api.Sandbox{}
	for range 6 {
		sb := newSandbox(ctx, t, c1, api.CreateSandboxRequest{CPU: 0.5, MemoryMiB: 256, DiskGiB: 10})
		if _, err := c1.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader("before "+sb.ID), 0o644); err != nil {
			t.Fatal(err)
		}
		on[sb.Node] = append(on[sb.Node], sb)
	}
	t.Logf("placed by node: n1 %d, n2 %d, n3 %d", len(on["n1"]), len(on["n2"]), len(on["n3"]))
	return cl, on
}

// victim is the node the test fails: node 3, or node 2 if node 3 runs
// none of the sandboxes.
func victim(t *testing.T, cl *netcluster.Cluster, on map[string][]api.Sandbox) *netcluster.Node {
	t.Helper()
	for _, n := range []*netcluster.Node{cl.Nodes[2], cl.Nodes[1]} {
		if len(on[n.Name()]) > 0 {
			return n
		}
	}
	t.Fatalf("nodes 2 and 3 run no sandbox: %v", on)
	return nil
}

// waitFor polls cond every 50 ms until it holds, failing the test after
// limit. It returns how long it took.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	t0 := time.Now()
	for !cond() {
		if time.Since(t0) > limit {
			t.Fatalf("%s: not after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(t0)
}

// nodeOf is node name as c lists it.
func nodeOf(t *testing.T, c *atoll.Client, name string) api.Node {
	t.Helper()
	ns, err := c.ListNodes(context.Background())
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	for _, n := range ns {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s in %+v", name, ns)
	return api.Node{}
}

// procsOf is the processes in sandbox id's cgroup on node n.
func procsOf(n *netcluster.Node, id string) []string {
	b, _ := os.ReadFile(filepath.Join(sandboxCgroup(n.CgroupParent, id), "cgroup.procs"))
	return strings.Fields(string(b))
}

// netnsOf names the sandbox network namespaces of node n: named after its
// bridge.
func netnsOf(n *netcluster.Node) []string {
	var out []string
	ents, _ := os.ReadDir(nettest.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), n.Bridge+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// checkLost checks, through every node in through, that each of sbs is
// lost on node lost and says why and since when.
func checkLost(t *testing.T, through []*netcluster.Node, lost *netcluster.Node, sbs []api.Sandbox) {
	t.Helper()
	ctx := context.Background()
	for _, nd := range through {
		for _, sb := range sbs {
			got, err := nd.Client().GetSandbox(ctx, sb.ID)
			if err != nil || got.State != api.StateLost || got.Node != lost.Name() ||
				!strings.Contains(got.Error, "node "+lost.Name()+" was fenced: lease expired") || got.StoppedAt == nil {
				t.Errorf("GET %s through node %d: %+v, %v; want lost on %s with the cause and time", sb.ID, nd.Index, got, err, lost.Name())
			}
		}
	}
}

// checkIntact checks, through every node in through, that the sandboxes
// of the nodes other than lost (nil: of every node) run, exec, and keep
// the file written before.
func checkIntact(t *testing.T, through []*netcluster.Node, on map[string][]api.Sandbox, lost *netcluster.Node) {
	t.Helper()
	ctx := context.Background()
	for name, sbs := range on {
		if lost != nil && name == lost.Name() {
			continue
		}
		for _, sb := range sbs {
			for _, nd := range through {
				c := nd.Client()
				got, err := c.GetSandbox(ctx, sb.ID)
				if err != nil || got.State != api.StateRunning || got.Node != name {
					t.Errorf("GET %s through node %d: %+v, %v", sb.ID, nd.Index, got, err)
					continue
				}
				if out, code := sh(t, c, sb.ID, "cat /tmp/f"); out != "before "+sb.ID || code != 0 {
					t.Errorf("cat /tmp/f in %s (on %s) through node %d: %q exit %d", sb.ID, name, nd.Index, out, code)
				}
			}
		}
	}
}

// TestClusterNodeKilled kills a node with SIGKILL: its lease runs out,
// another node fences it, and every other node reports its sandboxes lost,
// on that node, with the cause and the time, and streams a lost event of
// each (GET /v1/events through another node); everything on the other
// nodes is intact. Started again, the node joins under a new epoch and stops what
// was left running of its lost sandboxes, which stay lost.
func TestClusterNodeKilled(t *testing.T) {
	cl, on := failCluster(t, 20)
	ctx := context.Background()
	v := victim(t, cl, on)
	others := []*netcluster.Node{}
	for _, n := range cl.Nodes {
		if n != v {
			others = append(others, n)
		}
	}
	c := others[0].Client()
	before := nodeOf(t, c, v.Name())
	for _, sb := range on[v.Name()] {
		if len(procsOf(v, sb.ID)) == 0 {
			t.Fatalf("sandbox %s on %s has no process before the kill", sb.ID, v.Name())
		}
	}
	if ns := netnsOf(v); len(ns) != len(on[v.Name()]) {
		t.Fatalf("%s has sandbox networks %v before the kill, want %d", v.Name(), ns, len(on[v.Name()]))
	}

	// Lost events, streamed by another node from the journal.
	sctx, cancelStream := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelStream()
	lostEvents, err := c.Events(sctx, atoll.EventsOptions{Types: []string{api.LifecycleLost}})
	if err != nil {
		t.Fatal(err)
	}
	defer lostEvents.Close()

	t0 := time.Now()
	v.Kill()
	// The lease as it stands once the node is dead. A heartbeat that was
	// on its way may still extend it, which only makes the fence later.
	lease := nodeOf(t, c, v.Name()).LeaseExpires
	took := waitFor(t, 5*failLease, v.Name()+" fenced", func() bool { return nodeOf(t, c, v.Name()).State == "fenced" })
	t.Logf("node %s killed -> fenced in %s (lease %s, expiring %s after the kill)",
		v.Name(), took.Round(time.Millisecond), failLease, lease.Sub(t0).Round(time.Millisecond))
	if fenced := t0.Add(took); fenced.Before(lease) {
		t.Errorf("fenced %s before its lease ran out", lease.Sub(fenced))
	}
	for _, n := range others {
		if got := nodeOf(t, n.Client(), v.Name()); got.State != "fenced" || got.Epoch != before.Epoch {
			t.Errorf("node %d lists %s as %s epoch %d", n.Index, v.Name(), got.State, got.Epoch)
		}
	}
	// The CLI, from the LAN, through another node.
	nodeLs := exec.Command(atollBinary(t), "node", "ls", "--url", others[0].URL, "--api-key", others[0].Key)
	var ls []byte
	if err := nettest.In(cl.LANNetns, func() (err error) { ls, err = nodeLs.CombinedOutput(); return err }); err != nil {
		t.Fatalf("atoll node ls: %v\n%s", err, ls)
	}
	shown := false
	for _, line := range strings.Split(string(ls), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == v.Name() {
			shown = f[1] == "fenced" && strings.Contains(line, "expired")
		}
	}
	if !shown {
		t.Errorf("atoll node ls does not show %s fenced, its lease expired:\n%s", v.Name(), ls)
	}
	t.Logf("atoll node ls:\n%s", ls)
	checkLost(t, others, v, on[v.Name()])
	checkIntact(t, others, on, v)
	want := map[string]bool{}
	for _, sb := range on[v.Name()] {
		want[sb.ID] = true
	}
	for range on[v.Name()] {
		e, err := lostEvents.Next()
		if err != nil {
			t.Fatalf("the lost events: %v (still missing %v)", err, want)
		}
		if !want[e.Sandbox] || e.Type != api.LifecycleLost || e.State != api.StateLost || e.Tenant == "" ||
			!strings.Contains(e.Reason, "node "+v.Name()+" was fenced: lease expired") {
			t.Errorf("lost event %+v, want one of %v's, once, saying why", e, want)
		}
		delete(want, e.Sandbox)
	}
	// A lost sandbox is no one's to run: exec is refused as a conflict
	// that says so, not routed to the dead node.
	lostID := on[v.Name()][0].ID
	var out strings.Builder
	_, err = c.Exec(ctx, lostID, api.ExecRequest{Shell: "true"}, &out, &out)
	var ae *atoll.Error
	if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.Message, "is lost: node "+v.Name()+" was fenced") {
		t.Errorf("exec in lost %s: %v, want 409 saying it is lost", lostID, err)
	} else {
		t.Logf("exec in a lost sandbox: %d %s: %s", ae.StatusCode, ae.Code, ae.Message)
	}
	// Nothing killed the lost sandboxes' processes: their node is gone.
	leftover := 0
	for _, sb := range on[v.Name()] {
		leftover += len(procsOf(v, sb.ID))
	}

	t1 := time.Now()
	v.Start()
	t.Logf("node %s restarted in %s (%s after the kill); %d processes of its lost sandboxes left before",
		v.Name(), time.Since(t1).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), leftover)
	after := nodeOf(t, c, v.Name())
	if after.State != "live" || after.Epoch != before.Epoch+1 {
		t.Errorf("%s after its restart: %s epoch %d, want live epoch %d", v.Name(), after.State, after.Epoch, before.Epoch+1)
	}
	for _, sb := range on[v.Name()] {
		waitFor(t, 10*time.Second, "no process left of lost "+sb.ID, func() bool { return len(procsOf(v, sb.ID)) == 0 })
	}
	// Nor their networks: the node runs nothing, and makes nothing ahead.
	waitFor(t, 10*time.Second, "no sandbox network left on "+v.Name(), func() bool { return len(netnsOf(v)) == 0 })
	// Nothing resurrected: lost through every node, the restarted one too.
	checkLost(t, cl.Nodes, v, on[v.Name()])
	checkIntact(t, cl.Nodes, on, v)
}

// TestClusterNodePartitioned cuts a node's link: it cannot renew, the
// others fence it after its lease and record its sandboxes lost, while it
// keeps them running, not knowing. When the link is back its next
// heartbeat is refused as fenced: it stops every sandbox and exits. The
// other nodes' sandboxes are untouched throughout, and the node, started
// again, joins under a new epoch and takes new placements.
func TestClusterNodePartitioned(t *testing.T) {
	cl, on := failCluster(t, 20)
	ctx := context.Background()
	v := victim(t, cl, on)
	var others []*netcluster.Node
	for _, n := range cl.Nodes {
		if n != v {
			others = append(others, n)
		}
	}
	c := others[0].Client()
	before := nodeOf(t, c, v.Name())

	v.Cut()
	took := waitFor(t, 5*failLease, v.Name()+" fenced", func() bool { return nodeOf(t, c, v.Name()).State == "fenced" })
	t.Logf("node %s cut -> fenced in %s (lease %s)", v.Name(), took.Round(time.Millisecond), failLease)
	checkLost(t, others, v, on[v.Name()])
	checkIntact(t, others, on, v)
	// Cut off, the node cannot know: it keeps its sandboxes.
	if !v.Running() {
		t.Fatalf("node %s exited while cut off:\n%s", v.Name(), v.Log())
	}
	for _, sb := range on[v.Name()] {
		if len(procsOf(v, sb.ID)) == 0 {
			t.Errorf("sandbox %s stopped while its node was cut off", sb.ID)
		}
	}
	list := func() map[string]string {
		l := listSandboxes(ctx, t, c)
		m := map[string]string{}
		for _, sb := range l {
			m[sb.ID] = sb.State + " on " + sb.Node
		}
		return m
	}
	was := list()

	exited := v.Exited()
	t0 := time.Now()
	v.Restore()
	select {
	case <-exited:
	case <-time.After(5 * failLease):
		t.Fatalf("node %s still runs %s after its link came back:\n%s", v.Name(), 5*failLease, v.Log())
	}
	code, _ := v.ExitCode()
	t.Logf("node %s restored -> exited %d in %s", v.Name(), code, time.Since(t0).Round(time.Millisecond))
	if code == 0 {
		t.Errorf("fenced node exited with status 0")
	}
	if !strings.Contains(v.Log(), "fenced") {
		t.Errorf("the fenced node's log does not say it was fenced:\n%s", v.Log())
	}
	for _, sb := range on[v.Name()] {
		if p := procsOf(v, sb.ID); len(p) != 0 {
			t.Errorf("lost sandbox %s still has processes %v after its fenced node exited", sb.ID, p)
		}
	}
	if ns := netnsOf(v); len(ns) != 0 {
		t.Errorf("sandbox networks left after the fenced node exited: %v", ns)
	}
	if now := list(); fmt.Sprint(now) != fmt.Sprint(was) {
		t.Errorf("the cluster's sandboxes changed when the fenced node came back:\n was %v\n now %v", was, now)
	}
	checkLost(t, others, v, on[v.Name()])
	checkIntact(t, others, on, v)

	v.Start()
	after := nodeOf(t, c, v.Name())
	if after.State != "live" || after.Epoch != before.Epoch+1 {
		t.Errorf("%s started again: %s epoch %d, want live epoch %d", v.Name(), after.State, after.Epoch, before.Epoch+1)
	}
	checkLost(t, cl.Nodes, v, on[v.Name()])
	// New placements reach it: the others are full.
	var mine []api.Sandbox
	for range 2 {
		sb, err := v.Client().CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 0.5, MemoryMiB: 256, DiskGiB: 10})
		if err != nil {
			ns, _ := c.ListNodes(ctx)
			t.Fatalf("create through the rejoined node: %v; nodes %+v", err, ns)
		}
		if sb.Node == v.Name() {
			mine = append(mine, sb)
		}
	}
	if len(mine) != 2 {
		t.Fatalf("%d of 2 new sandboxes placed on the rejoined node %s, the only one with room", len(mine), v.Name())
	}
	for _, n := range cl.Nodes {
		if out, code := sh(t, n.Client(), mine[0].ID, "echo ok"); out != "ok\n" || code != 0 {
			t.Errorf("exec in %s (on the rejoined %s) through node %d: %q %d", mine[0].ID, v.Name(), n.Index, out, code)
		}
	}
}

// TestClusterPostgresRestart stops the PostgreSQL server for two leases
// while clients create, exec in, write to and delete sandboxes through
// every node. While it is down the API answers in bounded time, with
// success or a 503 JSON error, never a 500: requests under way wait for the
// store, and once a node has missed it for a lease its health and new
// requests answer 503 at once. Afterwards every acknowledged operation
// holds, no node was fenced (no epoch changed), and creates work again.
func TestClusterPostgresRestart(t *testing.T) {
	ctl := os.Getenv("ATOLL_TEST_POSTGRES_CTL")
	if ctl == "" {
		testenv.Skip(t, "ATOLL_TEST_POSTGRES_CTL is not set (scripts/test.sh sets it)")
	}
	cl, on := failCluster(t, 100)
	ctx := context.Background()
	epochs := map[string]int64{}
	for _, n := range cl.Nodes {
		epochs[n.Name()] = nodeOf(t, cl.Nodes[0].Client(), n.Name()).Epoch
	}

	// bound is the longest an answer may take: the store's retries of a
	// lost server (30 s) and some.
	const bound = 40 * time.Second
	var (
		mu       sync.Mutex
		created  = map[string]string{} // acknowledged, not deleted: ID -> file content
		deleted  []string
		ok       atomic.Int64
		n503     atomic.Int64
		slowest  atomic.Int64
		stop     atomic.Bool
		failures []string
	)
	// do runs one request and classifies its answer.
	do := func(what string, f func(ctx context.Context) error) bool {
		cctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		t0 := time.Now()
		err := f(cctx)
		d := time.Since(t0)
		for {
			s := slowest.Load()
			if int64(d) <= s || slowest.CompareAndSwap(s, int64(d)) {
				break
			}
		}
		var ae *atoll.Error
		switch {
		case err == nil:
			ok.Add(1)
			return true
		case errors.As(err, &ae) && ae.StatusCode == 503 && ae.Code == api.CodeUnavailable:
			n503.Add(1)
		default:
			mu.Lock()
			failures = append(failures, fmt.Sprintf("%s after %s: %v", what, d.Round(time.Millisecond), err))
			mu.Unlock()
		}
		return false
	}
	var wg sync.WaitGroup
	for _, nd := range cl.Nodes {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := nd.Client()
				for i := 0; !stop.Load(); i++ {
					var sb api.Sandbox
					if !do("create", func(ctx context.Context) (err error) {
						sb, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 0.25, MemoryMiB: 128, DiskGiB: 1})
						return err
					}) {
						time.Sleep(50 * time.Millisecond) // as a client backs off
						continue
					}
					body := fmt.Sprintf("node %d worker %d round %d", nd.Index, w, i)
					wrote := do("write", func(ctx context.Context) error {
						_, err := c.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader(body), 0o644)
						return err
					})
					mu.Lock()
					created[sb.ID] = ""
					if wrote {
						created[sb.ID] = body
					}
					mu.Unlock()
					do("exec", func(ctx context.Context) error {
						var out strings.Builder
						code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo hi"}, &out, &out)
						if err == nil && (code != 0 || out.String() != "hi\n") {
							err = fmt.Errorf("exec: %q exit %d", out.String(), code)
						}
						return err
					})
					// Each worker keeps its first sandbox and deletes the
					// others, to stay within the nodes' capacity.
					if i > 0 && do("delete", func(ctx context.Context) error { return c.DeleteSandbox(ctx, sb.ID) }) {
						mu.Lock()
						delete(created, sb.ID)
						deleted = append(deleted, sb.ID)
						mu.Unlock()
					}
				}
			}()
		}
	}
	// Some load before the outage.
	waitFor(t, 30*time.Second, "load under way", func() bool { return ok.Load() >= 10 })
	run := func(arg string) {
		cmd := exec.Command("sh", "-c", ctl+" "+arg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", ctl, arg, err, out)
		}
	}
	okBefore := ok.Load()
	t0 := time.Now()
	run("stop")
	// The server stays down for two leases: every stored lease runs out.
	// Meanwhile the nodes' health turns 503 once their heartbeats have
	// missed the store for a lease.
	// A node that is not ready answers a new request 503 at once, while
	// the workers' requests under way wait for the store.
	var probeID string
	for _, sbs := range on {
		probeID = sbs[0].ID
	}
	down := time.Now()
	unready := map[int]time.Duration{}
	var probes []string
	for time.Since(down) < 2*failLease {
		for _, n := range cl.Nodes {
			if _, seen := unready[n.Index]; seen || healthStatus(t, n) != 503 {
				continue
			}
			unready[n.Index] = time.Since(down).Round(time.Millisecond)
			p0 := time.Now()
			do("probe", func(ctx context.Context) error {
				_, err := n.Client().GetSandbox(ctx, probeID)
				return err
			})
			probes = append(probes, fmt.Sprintf("node %d %s", n.Index, time.Since(p0).Round(time.Millisecond)))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// restart, not start: a stopped server's restart starts it with the
	// options it last ran with (postmaster.opts), as test.sh gave them.
	run("restart")
	outage := time.Since(t0)
	back := time.Now()
	t.Logf("PostgreSQL down %s (stop took %s, restart %s); health 503 after %v",
		outage.Round(time.Millisecond), down.Sub(t0).Round(time.Millisecond),
		time.Since(down.Add(2*failLease)).Round(time.Millisecond), unready)
	if len(unready) != len(cl.Nodes) {
		t.Errorf("nodes whose health answered 503 during the outage: %v, want all", unready)
	}
	t.Logf("requests to unready nodes answered in %v", probes)
	if n503.Load() < int64(len(unready)) {
		t.Errorf("%d requests answered 503 during the outage; want at least the %d probes", n503.Load(), len(unready))
	}
	for _, n := range cl.Nodes {
		waitFor(t, 3*failLease, fmt.Sprintf("node %d healthy again", n.Index), func() bool {
			if !n.Running() {
				t.Fatalf("node %d exited after the restart:\n%s", n.Index, n.Log())
			}
			return healthStatus(t, n) == 200
		})
	}
	t.Logf("every node healthy %s after the restart", time.Since(back).Round(time.Millisecond))
	// Load goes on until it succeeds again, and for two leases after the
	// restart: a node that fenced others too early would have done it
	// by then.
	okAfter := ok.Load()
	waitFor(t, bound, "requests succeeding after the restart", func() bool {
		return ok.Load() >= okAfter+20 && time.Since(back) > 2*failLease
	})
	stop.Store(true)
	wg.Wait()
	t.Logf("under load: %d answered ok (%d before the outage), %d answered 503, slowest answer %s",
		ok.Load(), okBefore, n503.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	for _, f := range failures {
		t.Errorf("not a success nor a 503: %s", f)
	}
	if d := time.Duration(slowest.Load()); d > bound {
		t.Errorf("an answer took %s", d)
	}

	// Heartbeats that failed outside the outage: leases at risk under the
	// load alone (a Renew queued behind placements' row locks).
	for _, n := range cl.Nodes {
		outside := 0
		for _, line := range strings.Split(n.Log(), "\n") {
			ts, ok := strings.CutPrefix(strings.TrimSpace(line), "time=")
			if !ok || !strings.Contains(line, "heartbeat failed") {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, strings.Fields(ts)[0])
			if err == nil && (at.Before(t0) || at.After(back.Add(failLease))) {
				outside++
			}
		}
		if outside > 0 {
			t.Logf("node %d: %d heartbeats failed outside the outage", n.Index, outside)
		}
	}
	// No node fenced, no node rejoined.
	for _, n := range cl.Nodes {
		for _, m := range cl.Nodes {
			got := nodeOf(t, n.Client(), m.Name())
			if got.State != "live" || got.Epoch != epochs[m.Name()] {
				t.Errorf("node %d lists %s as %s epoch %d, want live epoch %d", n.Index, m.Name(), got.State, got.Epoch, epochs[m.Name()])
			}
		}
		if strings.Contains(n.Log(), "fenced a node") {
			t.Errorf("node %d fenced a node:\n%s", n.Index, n.Log())
		}
	}
	// Everything acknowledged holds.
	c := cl.Nodes[1].Client()
	for id, body := range created {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil || sb.State != api.StateRunning {
			t.Errorf("acknowledged sandbox %s: %+v, %v", id, sb, err)
			continue
		}
		if body == "" {
			continue
		}
		rc, err := c.ReadFile(ctx, id, "/tmp/f")
		if err != nil {
			t.Errorf("read %s: %v", id, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != body {
			t.Errorf("%s's /tmp/f: %q, want %q", id, b, body)
		}
	}
	for _, id := range deleted {
		if _, err := c.GetSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("acknowledged delete of %s: GET says %v", id, err)
		}
	}
	checkIntact(t, cl.Nodes, on, nil)
	t.Logf("%d acknowledged creates kept, %d acknowledged deletes gone", len(created), len(deleted))
	// Creates work again, through every node.
	for _, n := range cl.Nodes {
		sb, err := n.Client().CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 0.25, MemoryMiB: 128, DiskGiB: 1})
		if err != nil || sb.State != api.StateRunning {
			t.Errorf("create through node %d after the restart: %+v, %v", n.Index, sb, err)
		}
	}
}

// healthStatus is node n's GET /v1/health status, 0 for no answer; an
// error answer must be JSON.
func healthStatus(t *testing.T, n *netcluster.Node) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := n.Client().Health(ctx)
	var ae *atoll.Error
	switch {
	case err == nil:
		return 200
	case errors.As(err, &ae):
		if ae.Code == "" {
			t.Errorf("node %d's health: %d without a JSON error", n.Index, ae.StatusCode)
		}
		return ae.StatusCode
	}
	return 0
}
