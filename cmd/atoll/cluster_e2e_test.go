package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterNodesShareAHost runs three `atoll serve` processes on this
// machine, each in its own network namespace with its own address, data
// directory, sandbox bridge and cgroup parent (package netcluster), in
// single-machine mode, and checks that they keep to what is theirs: a node
// killed with SIGKILL and restarted re-adopts its own sandboxes and touches
// no other node's (their processes, cgroups and namespaces are the same
// ones, and they work); a node stopped cleanly sweeps nothing of the
// others'; and a sandbox reaches no node address (the API and proxy of its
// own node or another, the LAN's gateway where the PostgreSQL and S3
// servers are offered) while it does reach a public address on the same
// LAN, and the nodes themselves reach each other and those servers.
func TestClusterNodesShareAHost(t *testing.T) {
	start := time.Now()
	cl := startCluster(t, netcluster.Config{
		// No sandboxes made ahead of demand: every one on the host is the
		// test's, and three nodes on two cores start faster.
		Args: []string{"--warm-pool", "0", "--prestart", "0"}})
	ctx := context.Background()

	// Two sandboxes per node, made on all nodes at once.
	const perNode = 2
	ids := make([][]string, len(cl.Nodes))
	var wg sync.WaitGroup
	errs := make([]error, len(cl.Nodes))
	for i, n := range cl.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := n.Client()
			for range perNode {
				sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
				if err != nil {
					errs[i] = fmt.Errorf("node %d: create: %w", n.Index, err)
					return
				}
				ids[i] = append(ids[i], sb.ID)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d sandboxes per node made in %s", perNode, time.Since(start).Round(time.Millisecond))

	// Each node's sandboxes are in its own cgroup parent and namespaces.
	prints := map[string]hostPrint{}
	for i, n := range cl.Nodes {
		for _, id := range ids[i] {
			p := fingerprint(t, n, id)
			if len(p.pids) == 0 {
				t.Fatalf("node %d: sandbox %s has no processes in %s", n.Index, id, sandboxCgroup(n.CgroupParent, id))
			}
			prints[id] = p
			for _, h := range []string{"atoll", "atoll-gvisor", "atoll-vm"} {
				if _, err := os.Stat(sandboxCgroup(h, id)); err == nil {
					t.Errorf("node %d: sandbox %s has a cgroup under the default parent /%s", n.Index, id, h)
				}
			}
		}
	}
	// intact checks that node n's sandboxes are the ones fingerprinted,
	// untouched, and that they work.
	intact := func(t *testing.T, i int, why string) {
		t.Helper()
		n := cl.Nodes[i]
		c := n.Client()
		for _, id := range ids[i] {
			if now := fingerprint(t, n, id); !now.has(prints[id]) {
				t.Errorf("node %d's sandbox %s after %s: host processes %v and namespace %d, were %v and %d",
					n.Index, id, why, now.pids, now.netnsIno, prints[id].pids, prints[id].netnsIno)
			}
			if n.Running() {
				if out, code := sh(t, c, id, "echo ok"); out != "ok\n" || code != 0 {
					t.Errorf("node %d's sandbox %s after %s: exec: %q (exit %d)", n.Index, id, why, out, code)
				}
			}
		}
	}

	t.Run("a request ID through the router", func(t *testing.T) {
		// Asked of node 2, answered by node 1's sandbox's agent: one ID,
		// in the header and the body.
		n2 := cl.Nodes[1]
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: n2.Dial}}
		req, _ := http.NewRequest("GET", n2.URL+"/v1/sandboxes/"+ids[0][0]+"/files?path=/no/such/file", nil)
		req.Header.Set("Authorization", "Bearer "+n2.Key)
		req.Header.Set("X-Request-Id", "routed-1")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if ids := resp.Header.Values("X-Request-Id"); resp.StatusCode != 404 || len(ids) != 1 || ids[0] != "routed-1" || e.RequestID != "routed-1" {
			t.Errorf("routed 404: %s, X-Request-Id %q, body %+v", resp.Status, ids, e)
		}
	})

	t.Run("sandboxes reach no node address", func(t *testing.T) {
		noNodeReach(t, cl, cl.Nodes[0].Client(), ids[0][0])
	})

	t.Run("kill -9 and restart of node 1", func(t *testing.T) {
		t0 := time.Now()
		cl.Nodes[0].Restart()
		t.Logf("node 1 back in %s", time.Since(t0).Round(time.Millisecond))
		sbs, err := cl.Nodes[0].Client().ListSandboxes(ctx, atoll.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sb := range sbs {
			got = append(got, sb.ID)
			if sb.State != api.StateRunning {
				t.Errorf("node 1's sandbox %s is %s after the restart", sb.ID, sb.State)
			}
		}
		if want := slices.Sorted(slices.Values(ids[0])); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
			t.Errorf("node 1 lists %v after the restart, want %v", got, want)
		}
		for i := range cl.Nodes {
			intact(t, i, "node 1's restart")
		}
	})

	t.Run("clean stop of node 2", func(t *testing.T) {
		cl.Nodes[1].Stop()
		// Its sandboxes stay, as they do on a single machine.
		for i := range cl.Nodes {
			intact(t, i, "node 2's stop")
		}
		cl.Nodes[1].Start()
		intact(t, 1, "node 2's start")
	})

	t.Run("partition of node 3", func(t *testing.T) {
		n3 := cl.Nodes[2]
		n3.Cut()
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		if conn, err := cl.Nodes[0].Dial(dctx, "tcp", netip.AddrPortFrom(n3.Addr, 7400).String()); err == nil {
			conn.Close()
			t.Error("node 1 reached node 3 across the cut")
		}
		cancel()
		n3.Restore()
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: cl.Nodes[0].Dial}}
		resp, err := hc.Get(n3.URL + "/v1/health")
		if err != nil {
			t.Fatalf("node 1 to node 3 after the link is back: %v", err)
		}
		resp.Body.Close()
		intact(t, 2, "the partition")
	})
	t.Logf("all in %s", time.Since(start).Round(time.Millisecond))
}

// TestClusterDenyOutranksAllow runs two nodes whose operator allowed
// sandboxes all of 10.0.0.0/8 (for a mirror, say), which holds the nodes'
// own LAN: sandboxes reach the mirror, and still no node address, because
// a server refuses its sandboxes the networks it listens on whatever it
// allows.
func TestClusterDenyOutranksAllow(t *testing.T) {
	cl := startCluster(t, netcluster.Config{Nodes: 2,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--network-pool", "0", "--network-allow", "10.0.0.0/8"}})
	mirror := netip.MustParsePrefix("10.251.0.1/24")
	cl.AddAddr(mirror)
	nettest.ServeHTTP(t, cl.LANNetns, "mirror", netip.AddrPortFrom(mirror.Addr(), 80).String(), false)
	c := cl.Nodes[0].Client()
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, c, sb.ID, tcpGet(netip.AddrPortFrom(mirror.Addr(), 80))); code != 0 || !strings.HasPrefix(out, "mirror ") {
		t.Fatalf("sandbox to the allowed mirror %s: %q (exit %d)", mirror.Addr(), out, code)
	}
	noNodeReach(t, cl, c, sb.ID)
}

// noNodeReach checks that sandbox id on the cluster's first node reaches
// no node address: the API and port proxy of its own node and of another,
// and what the host offers the nodes on the LAN's gateway (a stand-in
// service always; the PostgreSQL and S3 servers when the test script runs
// them). The positive controls: the sandbox reaches a public address on
// the same LAN, and the node itself reaches every one of those addresses.
func noNodeReach(t *testing.T, cl *netcluster.Cluster, c *atoll.Client, id string) {
	t.Helper()
	if testenv.Strict() && os.Getenv("ATOLL_TEST_POSTGRES_URL") == "" {
		t.Fatal("ATOLL_TEST_POSTGRES_URL is not set (scripts/test.sh starts a PostgreSQL server and sets it)")
	}
	ctx := context.Background()
	n1, n2 := cl.Nodes[0], cl.Nodes[1]
	targets := map[string]netip.AddrPort{
		"its own node's API":        netip.AddrPortFrom(n1.Addr, 7400),
		"its own node's port proxy": netip.AddrPortFrom(n1.Addr, 7401),
		"another node's API":        netip.AddrPortFrom(n2.Addr, 7400),
		"another node's port proxy": netip.AddrPortFrom(n2.Addr, 7401),
	}
	standIn := nettest.Listen(t, "/proc/self/ns/net", "tcp", "127.0.0.1:0")
	go func() {
		for {
			c, err := standIn.Accept()
			if err != nil {
				return
			}
			// Answers the request tcpGet sends, so that a sandbox
			// reaching it would see an answer.
			c.SetDeadline(time.Now().Add(5 * time.Second))
			bufio.NewReader(c).ReadString('\n')
			c.Write([]byte("host\n"))
			c.Close()
		}
	}()
	targets["a host service on the gateway"] = cl.Forward(standIn.Addr().String())
	var pg netip.AddrPort
	if u := cl.PostgresURL(); u != "" {
		pg = hostPortOf(t, u)
		targets["PostgreSQL on the gateway"] = pg
	}
	if u := cl.S3URL(); u != "" {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		targets["the S3 server on the gateway"] = hostPortOf(t, pu.Query().Get("endpoint"))
	}
	// The path out of the sandbox to the LAN works, so a refusal below is
	// the firewall's.
	if out, code := sh(t, c, id, tcpGet(netip.AddrPortFrom(netcluster.Public, 80))); code != 0 || !strings.HasPrefix(out, "lan ") {
		t.Fatalf("sandbox on node 1 to a public address on the LAN: %q (exit %d)", out, code)
	}
	for what, ap := range targets {
		conn, err := n1.Dial(ctx, "tcp", ap.String())
		if err != nil {
			t.Errorf("node 1 to %s (%s): %v", what, ap, err)
		} else {
			conn.Close()
		}
		if out, code := sh(t, c, id, tcpGet(ap)); code == 0 {
			t.Errorf("sandbox on node 1 reached %s (%s): %q", what, ap, out)
		}
	}
	if pg.IsValid() {
		// The forwarded PostgreSQL answers the protocol, from a node.
		if got := pgSSLAnswer(t, n1, pg); got != 'N' && got != 'S' {
			t.Errorf("PostgreSQL through the gateway answered %q to an SSLRequest", got)
		}
	}
}

// hostPrint is what the host holds of a running sandbox: the processes in
// its cgroup and its network namespace's inode.
type hostPrint struct {
	pids     []int
	netnsIno uint64
}

// has reports whether p still holds everything old held: the same
// processes (execs may add some) and the same namespace.
func (p hostPrint) has(old hostPrint) bool {
	for _, pid := range old.pids {
		if !slices.Contains(p.pids, pid) {
			return false
		}
	}
	return p.netnsIno == old.netnsIno && p.netnsIno != 0
}

func fingerprint(t *testing.T, n *netcluster.Node, id string) hostPrint {
	t.Helper()
	var p hostPrint
	b, _ := os.ReadFile(filepath.Join(sandboxCgroup(n.CgroupParent, id), "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			p.pids = append(p.pids, pid)
		}
	}
	// The sandbox's namespace is named after its node's bridge and its slot.
	ents, _ := os.ReadDir(nettest.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), n.Bridge+"-") || len(p.pids) == 0 {
			continue
		}
		var ns, pidNS syscall.Stat_t
		if syscall.Stat(filepath.Join(nettest.Dir, e.Name()), &ns) == nil &&
			syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", p.pids[0]), &pidNS) == nil && ns.Ino == pidNS.Ino {
			p.netnsIno = ns.Ino
		}
	}
	return p
}

// sandboxCgroup is the cgroup of sandbox id under parent: its pids
// controller's on a v1 or hybrid host, else the unified one.
func sandboxCgroup(parent, id string) string {
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err == nil {
		return filepath.Join("/sys/fs/cgroup/pids", parent, id)
	}
	return filepath.Join("/sys/fs/cgroup", parent, id)
}

// tcpGet is a shell script that sends an HTTP request to ap and prints the
// answer, failing if it cannot connect within 3 seconds.
func tcpGet(ap netip.AddrPort) string {
	return fmt.Sprintf(`timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%d && printf "GET / HTTP/1.0\r\n\r\n" >&3 && sed -n "\$p" <&3'`, ap.Addr(), ap.Port())
}

// hostPortOf is the address of URL u's host.
func hostPortOf(t *testing.T, u string) netip.AddrPort {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := netip.ParseAddrPort(pu.Host)
	if err != nil {
		t.Fatalf("address of %s: %v", u, err)
	}
	return ap
}

// pgSSLAnswer sends PostgreSQL's SSLRequest to ap from node n and returns
// the server's one-byte answer ('S' or 'N').
func pgSSLAnswer(t *testing.T, n *netcluster.Node, ap netip.AddrPort) byte {
	t.Helper()
	conn, err := n.Dial(context.Background(), "tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := conn.Read(b); err != nil {
		t.Fatalf("PostgreSQL through the gateway: %v", err)
	}
	return b[0]
}
