// Package netcluster runs several `atoll serve` processes on one machine as
// the nodes of a test cluster. Each node runs in a network namespace of its
// own with an address on a shared LAN, and has its own data directory,
// sandbox bridge (which names its sandboxes' namespaces, veths and nftables
// table), cgroup parent, API and port-proxy listeners.
//
// The LAN is a bridge in a namespace of its own that plays the host: the
// real host's network is never touched, two clusters in one test process
// never meet (each has its own LAN, on the same addresses), and removing the
// namespace removes the bridge and every node's link with it. The test
// process reaches the nodes from the LAN (Node.Client), and servers that
// listen only on the host's loopback or on a unix socket (the PostgreSQL and
// S3 servers scripts/test.sh starts) are offered to the nodes on the LAN's
// gateway address by a forwarder in the test process (Cluster.Forward):
// it listens in the LAN namespace and dials in the host's, so neither
// server needs to know about the cluster.
//
//	LAN namespace  br0 10.250.0.1/24 (and 198.51.100.1/24, see Public)
//	  n1 ── eth0 10.250.0.11/24 in node 1's namespace, default route via .1
//	  n2 ── eth0 10.250.0.12/24 ...
package netcluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// Addresses on the LAN. 10.250.0.0/24 is private, so a node's sandboxes are
// refused it by the egress firewall's defaults (network.BlockedPrefixes);
// Public is a documentation address on the LAN's bridge that they may reach,
// the positive control for such refusals: it serves HTTP on port 80,
// answering "lan CLIENT HOST".
var (
	Gateway = netip.MustParseAddr("10.250.0.1")
	LAN     = netip.MustParsePrefix("10.250.0.0/24")
	Public  = netip.MustParseAddr("198.51.100.1")
)

const (
	apiPort   = 7400
	proxyPort = 7401
	// startTimeout bounds a node's start: a layer image to make, runtimes
	// to probe (their choices are cached in /run/atoll after the first).
	startTimeout = 90 * time.Second
)

// Config configures a Cluster.
type Config struct {
	// Bin is the atoll binary the nodes run.
	Bin string
	// Nodes is how many, default 3.
	Nodes int
	// Args are extra `atoll serve` flags for every node.
	Args []string
	// NodeArgs, if set, are extra flags for node i (1, 2, ...) after
	// Args: its --node-label, say.
	NodeArgs func(i int) []string
	// Cluster makes the nodes one cluster (atoll serve --cluster): its
	// state in a schema of its own on the PostgreSQL server of
	// ATOLL_TEST_POSTGRES_URL, dropped when the test ends, its blobs on the
	// S3 server of ATOLL_TEST_S3_URL; node i is named n<i> and listens for
	// other nodes on its address, port NodePort.
	Cluster bool
}

// NodePort is the port of a cluster node's node-to-node listener.
const NodePort = 7443

// Cluster is a LAN and its nodes.
type Cluster struct {
	t   testing.TB
	id  string // 6 hex digits, in every name the cluster makes
	dir string
	bin string
	// LANNetns is the path of the LAN namespace.
	LANNetns string
	Nodes    []*Node

	wg sync.WaitGroup // the forwarders' goroutines
}

// New makes the LAN and starts cfg.Nodes nodes on it, at once, and waits
// until every one answers. Everything is undone when t ends, whether it
// failed or not: nodes' sandboxes deleted, nodes stopped, mounts, namespaces,
// bridge and links removed. It needs root and iproute2's kernel features
// (skipped, or failed with ATOLL_TEST_STRICT=1, without them).
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	b := make([]byte, 3)
	rand.Read(b)
	c := &Cluster{t: t, id: hex.EncodeToString(b), dir: testenv.Dir(t), bin: cfg.Bin}
	c.LANNetns = nettest.NewNetns(t, "atollc-"+c.id+"-lan")
	err := nettest.In(c.LANNetns, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "br0"
		br := &netlink.Bridge{LinkAttrs: attrs}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		for _, a := range []netip.Prefix{netip.PrefixFrom(Gateway, LAN.Bits()), netip.PrefixFrom(Public, 24)} {
			if err := netlink.AddrAdd(br, addr(a)); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(br)
	})
	if err != nil {
		testenv.Skip(t, fmt.Sprintf("making the cluster's LAN bridge: %v", err))
	}
	nettest.ServeHTTP(t, c.LANNetns, "lan", netip.AddrPortFrom(Public, 80).String(), false)
	for i := range cfg.Nodes {
		c.Nodes = append(c.Nodes, c.newNode(i+1, cfg))
	}
	// A SIGKILLed node leaves its warm namespaces' files, named after its
	// bridge; the LAN's and nodes' own are removed by nettest. Registered
	// before the nodes' cleanups, so it runs after them.
	t.Cleanup(func() {
		ents, _ := os.ReadDir(nettest.Dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "c"+c.id) {
				p := filepath.Join(nettest.Dir, e.Name())
				unix.Unmount(p, unix.MNT_DETACH)
				os.Remove(p)
			}
		}
		c.wg.Wait()
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("node %d's log (last 4 KiB):\n%s", n.Index, n.logTail(4096))
			}
		}
	})
	// The stores' forwarders close before the cleanup above waits for
	// them: made after it.
	if cfg.Cluster {
		pg, s3 := c.clusterStores()
		for _, n := range c.Nodes {
			n.clustered = true
			n.args = append(n.args, "--cluster", pg, "--blob", s3, "--node-name", n.Name(),
				"--node-listen", netip.AddrPortFrom(n.Addr, NodePort).String())
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.Nodes))
	for i, n := range c.Nodes {
		n.register()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.start(nil)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster {
		var key string
		for _, n := range c.Nodes {
			key = cmp.Or(key, n.Key)
		}
		if key == "" {
			t.Fatal("no node of the cluster wrote the first API key")
		}
		for _, n := range c.Nodes {
			n.Key = key
		}
	}
	return c
}

func addr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// AddAddr gives the LAN's bridge one more address, p (such as
// 10.251.0.1/24), for a test server there.
func (c *Cluster) AddAddr(p netip.Prefix) {
	c.t.Helper()
	err := nettest.In(c.LANNetns, func() error {
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(br, addr(p))
	})
	if err != nil {
		c.t.Fatalf("adding %s to the LAN: %v", p, err)
	}
}

// Node is one `atoll serve` in its namespace.
type Node struct {
	c     *Cluster
	Index int // from 1
	// Netns is the path of the node's namespace; Addr its LAN address.
	Netns string
	Addr  netip.Addr
	// Data is its data directory; Bridge and CgroupParent the names of its
	// sandbox bridge and cgroups (--network-bridge, --cgroup-parent).
	Data, Bridge, CgroupParent string
	// URL is its API's, Key its admin key (known once it started).
	URL, Key string
	args     []string
	logPath  string

	// clustered: a node of a cluster, which shares its API keys.
	clustered bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func (c *Cluster) newNode(i int, cfg Config) *Node {
	a := LAN.Addr().As4()
	a[3] = byte(10 + i)
	n := &Node{c: c, Index: i,
		Addr:         netip.AddrFrom4(a),
		Data:         filepath.Join(c.dir, fmt.Sprintf("n%d", i)),
		Bridge:       fmt.Sprintf("c%sn%d", c.id, i),
		CgroupParent: fmt.Sprintf("atoll-c%s-n%d", c.id, i),
		logPath:      filepath.Join(c.dir, fmt.Sprintf("n%d.log", i)),
	}
	n.URL = fmt.Sprintf("http://%s", netip.AddrPortFrom(n.Addr, apiPort))
	n.Netns = nettest.NewNetns(c.t, fmt.Sprintf("atollc-%s-n%d", c.id, i))
	lanFD, err := unix.Open(c.LANNetns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer unix.Close(lanFD)
	// The veth is made in the node's namespace with its LAN end, n<i>,
	// sent to the LAN.
	err = nettest.In(n.Netns, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "eth0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: n.lanLink(), PeerNamespace: netlink.NsFd(lanFD)}); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, addr(netip.PrefixFrom(n.Addr, LAN.Bits()))); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: Gateway.AsSlice()})
	})
	if err == nil {
		err = nettest.In(c.LANNetns, func() error {
			l, err := netlink.LinkByName(n.lanLink())
			if err != nil {
				return err
			}
			br, err := netlink.LinkByName("br0")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
	}
	if err != nil {
		c.t.Fatalf("linking node %d to the LAN: %v", i, err)
	}
	n.args = slices.Concat([]string{"serve",
		"--data", n.Data,
		"--listen", n.URL[len("http://"):],
		"--proxy-listen", netip.AddrPortFrom(n.Addr, proxyPort).String(),
		"--network", "on", "--network-bridge", n.Bridge,
		"--cgroup-parent", n.CgroupParent,
		"--layer-image-size", fmt.Sprint(int64(8 << 30)),
	}, cfg.Args)
	if cfg.NodeArgs != nil {
		n.args = append(n.args, cfg.NodeArgs(i)...)
	}
	return n
}

// Name is the node's name in its cluster.
func (n *Node) Name() string { return fmt.Sprintf("n%d", n.Index) }

// clusterStores makes the cluster's schema and returns the URLs of its
// state and blob stores as the nodes reach them.
func (c *Cluster) clusterStores() (pg, s3 string) {
	c.t.Helper()
	s3 = c.S3URL()
	if os.Getenv(pgtest.Env) == "" || s3 == "" {
		testenv.Skip(c.t, "a cluster needs "+pgtest.Env+" and ATOLL_TEST_S3_URL (scripts/test.sh starts both servers)")
	}
	// Made before the nodes' cleanups are registered: dropped after them.
	schema := pgtest.NewSchema(c.t, "atoll_c"+c.id+"_")
	u, err := url.Parse(c.PostgresURL())
	if err != nil {
		c.t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	return u.String(), s3
}

// lanLink is the name of the node's veth end on the LAN.
func (n *Node) lanLink() string { return fmt.Sprintf("n%d", n.Index) }

// register makes the node's cleanup: kill it, start it again without pools
// to delete its sandboxes (they outlive the server by design), stop it, and
// unmount what it mounted under its data directory.
func (n *Node) register() {
	t := n.c.t
	t.Cleanup(func() {
		n.Kill()
		// A test that ended in a partition: the LAN reaches the node again.
		if err := n.linkUp(true); err != nil {
			t.Errorf("cleanup: node %d: %v", n.Index, err)
		}
		if err := n.start([]string{"--warm-pool", "0", "--prestart", "0", "--network-pool", "0"}); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			c := n.Client()
			sbs, _ := c.ListSandboxes(ctx, atoll.ListOptions{})
			for _, sb := range sbs {
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Errorf("cleanup: node %d: deleting sandbox %s: %v", n.Index, sb.ID, err)
				}
			}
			cancel()
		} else {
			t.Errorf("cleanup: node %d: %v", n.Index, err)
		}
		n.Kill()
		unmountUnder(n.Data)
		// The parents stay after their sandboxes' cgroups are gone, as
		// the default /atoll does on a single machine.
		for _, p := range []string{n.CgroupParent, n.CgroupParent + "-gvisor", n.CgroupParent + "-vm"} {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", p))
			for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", p)) {
				if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("cleanup: node %d: %v", n.Index, err)
				}
			}
		}
	})
}

// unmountUnder lazily unmounts every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var mnts []string
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mnts = append(mnts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mnts)))
	for _, m := range mnts {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// Start starts the node again (after Kill or Stop) with extra flags, and
// waits until it answers; it fails the test if it does not.
func (n *Node) Start(extra ...string) {
	n.c.t.Helper()
	if err := n.start(extra); err != nil {
		n.c.t.Fatal(err)
	}
}

// Restart kills the node with SIGKILL, as a crash would, and starts it.
func (n *Node) Restart(extra ...string) {
	n.c.t.Helper()
	n.Kill()
	n.Start(extra...)
}

func (n *Node) start(extra []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.done: // it exited on its own (a fenced node does)
		default:
			return fmt.Errorf("node %d is running", n.Index)
		}
	}
	log, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "--- start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(n.c.bin, slices.Concat(n.args, extra)...)
	// A file, not a pipe: the node's sandboxes may hold its descriptors
	// after it is killed, and Wait must not wait for them.
	cmd.Stdout, cmd.Stderr = log, log
	if err := nettest.In(n.Netns, cmd.Start); err != nil {
		return fmt.Errorf("starting node %d: %w", n.Index, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	if err := n.waitHealthy(done); err != nil {
		cmd.Process.Kill()
		<-done
		n.cmd = nil
		return fmt.Errorf("node %d: %w\n%s", n.Index, err, n.logTail(2048))
	}
	key, err := os.ReadFile(filepath.Join(n.Data, "api-key"))
	if errors.Is(err, os.ErrNotExist) && (n.Key != "" || n.clustered) {
		// A cluster's nodes share their keys: only the node that made
		// the first one wrote it (New hands it to the others).
		return nil
	}
	if err != nil {
		return err
	}
	n.Key = strings.TrimSpace(string(key))
	return nil
}

// waitHealthy polls the node's GET /v1/health from the LAN until it answers
// 200, the process exits, or startTimeout passes.
func (n *Node) waitHealthy(exited <-chan struct{}) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: n.c.DialLAN, DisableKeepAlives: true}}
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := hc.Get(n.URL + "/v1/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("atoll serve exited before it answered")
		case <-deadline.C:
			return fmt.Errorf("no answer to /v1/health after %s", startTimeout)
		case <-tick.C:
		}
	}
}

// Kill ends the node with SIGKILL; its sandboxes keep running.
func (n *Node) Kill() { n.signal(syscall.SIGKILL) }

// Stop ends the node with SIGTERM, as an operator would; its sandboxes keep
// running.
func (n *Node) Stop() { n.signal(syscall.SIGTERM) }

func (n *Node) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// Running reports whether the node's process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Exited is closed when the node's process, running now, exits on its
// own or is ended; nil if it is not running.
func (n *Node) Exited() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	return n.done
}

// ExitCode is the exit status of the node's process once it has exited
// (-1 if a signal ended it), and false while it runs or was never started.
func (n *Node) ExitCode() (int, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0, false
	}
	select {
	case <-n.done:
		return n.cmd.ProcessState.ExitCode(), true
	default:
		return 0, false
	}
}

// Cut takes the node's link to the LAN down, from the LAN's side: a
// partition. Restore brings it back.
func (n *Node) Cut() { n.setLink(false) }

// Restore ends a Cut.
func (n *Node) Restore() { n.setLink(true) }

func (n *Node) setLink(up bool) {
	n.c.t.Helper()
	if err := n.linkUp(up); err != nil {
		n.c.t.Fatal(err)
	}
}

// linkUp sets the node's link on the LAN up or down.
func (n *Node) linkUp(up bool) error {
	err := nettest.In(n.c.LANNetns, func() error {
		l, err := netlink.LinkByName(n.lanLink())
		if err != nil {
			return err
		}
		if up {
			return netlink.LinkSetUp(l)
		}
		return netlink.LinkSetDown(l)
	})
	if err != nil {
		return fmt.Errorf("setting node %d's link up=%v: %w", n.Index, up, err)
	}
	return nil
}

// Client is a client of the node's API with its admin key, connecting from
// the LAN as a client of the cluster would.
func (n *Node) Client() *atoll.Client { return n.ClientWith(n.Key) }

// ClientWith is a client of the node's API with key, from the LAN, with
// the client's options opts.
func (n *Node) ClientWith(key string, opts ...atoll.Option) *atoll.Client {
	hc := &http.Client{Transport: &http.Transport{DialContext: n.c.DialLAN}}
	return atoll.New(n.URL, key, append([]atoll.Option{atoll.WithHTTPClient(hc)}, opts...)...)
}

// Dial connects to address from the node's namespace, as the node's own
// process would (a node-to-node connection, say).
func (n *Node) Dial(ctx context.Context, network, address string) (c net.Conn, err error) {
	err = nettest.In(n.Netns, func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}

func (n *Node) logTail(max int) string {
	b, _ := os.ReadFile(n.logPath)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// Log is everything the node has written, over all its starts.
func (n *Node) Log() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

// DialLAN connects to address from the LAN namespace.
func (c *Cluster) DialLAN(ctx context.Context, network, address string) (conn net.Conn, err error) {
	err = nettest.In(c.LANNetns, func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// Forward offers target, a TCP address ("127.0.0.1:5432") or a unix
// socket ("unix:/run/pg/.s.PGSQL.5432") in the test process's own (the
// host's) namespace, to the nodes at the returned address on the LAN's
// gateway, until the test ends.
func (c *Cluster) Forward(target string) netip.AddrPort {
	c.t.Helper()
	network, address := "tcp", target
	if p, ok := strings.CutPrefix(target, "unix:"); ok {
		network, address = "unix", p
	}
	var ln net.Listener
	err := nettest.In(c.LANNetns, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(Gateway, 0).String())
		return err
	})
	if err != nil {
		c.t.Fatalf("forwarding %s: %v", target, err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	// track adds (or, with on false, removes) a connection pair; it is
	// false once the forwarder is closed.
	track := func(a, b net.Conn, on bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			return false
		}
		if on {
			conns[a], conns[b] = true, true
		} else {
			delete(conns, a)
			delete(conns, b)
		}
		return true
	}
	c.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for cn := range conns {
			cn.Close()
		}
		conns = nil
		mu.Unlock()
	})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				out, err := net.DialTimeout(network, address, 5*time.Second)
				if err != nil {
					in.Close()
					return
				}
				if !track(in, out, true) {
					in.Close()
					out.Close()
					return
				}
				splice(in, out)
				track(in, out, false)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// splice copies both ways until either side ends, then closes both.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}

// PostgresURL is ATOLL_TEST_POSTGRES_URL (the server scripts/test.sh
// starts, on a unix socket or a loopback port) as the nodes reach it: over
// a forwarder on the LAN's gateway, postgres://USER@10.250.0.1:PORT/DB.
// Empty when the variable is not set.
func (c *Cluster) PostgresURL() string {
	c.t.Helper()
	raw := os.Getenv("ATOLL_TEST_POSTGRES_URL")
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		c.t.Fatalf("ATOLL_TEST_POSTGRES_URL: %v", err)
	}
	q := u.Query()
	port := cmp.Or(q.Get("port"), u.Port(), "5432")
	target := net.JoinHostPort(cmp.Or(u.Hostname(), "localhost"), port)
	if h := q.Get("host"); strings.HasPrefix(h, "/") {
		target = "unix:" + filepath.Join(h, ".s.PGSQL."+port)
	} else if h != "" {
		target = net.JoinHostPort(h, port)
	}
	q.Del("host")
	q.Del("port")
	if u.User == nil && q.Has("user") {
		u.User = url.User(q.Get("user"))
		q.Del("user")
	}
	q.Set("sslmode", "disable")
	u.Host, u.RawQuery = c.Forward(target).String(), q.Encode()
	return u.String()
}

// S3URL is ATOLL_TEST_S3_URL (the S3 server scripts/test.sh starts on a
// loopback port) with its endpoint as the nodes reach it, over a forwarder
// on the LAN's gateway. Empty when the variable is not set.
func (c *Cluster) S3URL() string {
	c.t.Helper()
	raw := os.Getenv("ATOLL_TEST_S3_URL")
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		c.t.Fatalf("ATOLL_TEST_S3_URL: %v", err)
	}
	q := u.Query()
	ep, err := url.Parse(q.Get("endpoint"))
	if err != nil || ep.Host == "" {
		c.t.Fatalf("ATOLL_TEST_S3_URL: want an endpoint=URL parameter")
	}
	ep.Host = c.Forward(ep.Host).String()
	q.Set("endpoint", ep.String())
	u.RawQuery = q.Encode()
	return u.String()
}
