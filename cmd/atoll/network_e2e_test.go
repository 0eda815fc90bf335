package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// netWorld is the private network TestNetworkEndToEnd runs atoll serve in:
//
//	host  the daemon's namespace: its bridge, firewall and resolver live
//	      here; "up0" (198.51.100.2, 2001:db8::2) carries its default
//	      routes to inet, "lan0" leads to lan.
//	inet  an internet host with several addresses, serving DNS on 53, HTTP
//	      on 80 ("inet <client> <host>"), HTTPS on 443, TCP echo on 7.
//	lan   metadata and private addresses: 169.254.169.254, fd00:ec2::254,
//	      10.99.0.1, serving HTTP on 80.
//
// Nothing is sent anywhere else.
type netWorld struct {
	id              string
	host, inet, lan string
	dns             *nettest.DNS
}

const (
	wInet4, wInet6       = "198.51.100.1", "2001:db8::1"
	wAllowed4, wAllowed6 = "198.51.100.11", "2001:db8::11" // allowed.example, secret.example
	wOther4, wOther6     = "198.51.100.12", "2001:db8::12" // other.example
	wListed4             = "198.51.100.13"                 // allowed by address
)

func newNetWorld(t *testing.T) *netWorld {
	b := make([]byte, 3)
	rand.Read(b)
	w := &netWorld{id: "e" + hex.EncodeToString(b)}
	w.host = nettest.NewNetns(t, "atollt-"+w.id+"-host")
	w.inet = nettest.NewNetns(t, "atollt-"+w.id+"-inet")
	w.lan = nettest.NewNetns(t, "atollt-"+w.id+"-lan")
	nettest.Link(t, w.host, "up0", []string{"198.51.100.2/24", "2001:db8::2/64"},
		w.inet, "eth0", []string{wInet4 + "/24", wAllowed4 + "/24", wOther4 + "/24", wListed4 + "/24",
			wInet6 + "/64", wAllowed6 + "/64", wOther6 + "/64"}, 1500)
	nettest.Link(t, w.host, "lan0", []string{"169.254.169.1/16", "fd00:ec2::1/64", "10.99.0.2/24"},
		w.lan, "eth0", []string{"169.254.169.254/16", "fd00:ec2::254/64", "10.99.0.1/24"}, 1500)
	nettest.DefaultRoutes(t, w.host, "up0", wInet4, wInet6)
	w.dns = &nettest.DNS{TTL: 30, Records: map[string][]netip.Addr{
		"allowed.example": {netip.MustParseAddr(wAllowed4), netip.MustParseAddr(wAllowed6)},
		"secret.example":  {netip.MustParseAddr(wAllowed4), netip.MustParseAddr(wAllowed6)},
		"other.example":   {netip.MustParseAddr(wOther4), netip.MustParseAddr(wOther6)},
	}}
	nettest.ServeDNS(t, w.inet, "[::]:53", w.dns)
	nettest.ServeHTTP(t, w.inet, "inet", "[::]:80", false)
	nettest.ServeHTTP(t, w.inet, "inet-tls", "[::]:443", true)
	nettest.ServeEcho(t, w.inet, "[::]:7")
	nettest.ServeBulk(t, w.inet, "[::]:9")
	nettest.ServeHTTP(t, w.lan, "lan", "[::]:80", false)
	// The daemon's namespaces and veths are named after the bridge; a
	// daemon killed with SIGKILL leaves its warm namespaces' files.
	t.Cleanup(func() {
		ents, _ := os.ReadDir(nettest.Dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), w.id) {
				p := filepath.Join(nettest.Dir, e.Name())
				unix.Unmount(p, unix.MNT_DETACH)
				os.Remove(p)
			}
		}
	})
	return w
}

// dial connects to addr from the daemon's namespace.
func (w *netWorld) dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = nettest.In(w.host, func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// fromHost fetches url from the host namespace: the positive controls.
func (w *netWorld) fromHost(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: w.dial}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// startNetworkedVMDaemon starts atoll serve with networking in a netWorld
// of its own, for vm sandboxes: no pools, so every sandbox boots.
func startNetworkedVMDaemon(t *testing.T) (*netWorld, *daemon) {
	t.Helper()
	requireVM(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	data := testenv.Dir(t)
	linkVMCache(t, data)
	d := startDaemonIn(t, data, w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--warm-pool", "0", "--prestart", "0", "--network-pool", "0")
	return w, d
}

// bulkScript moves argv[3] bytes to ("up") or from ("down") the bulk port
// of argv[1] and prints the rate in Mbit/s.
const bulkScript = `import socket, sys, time
host, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.create_connection((host, 9), timeout=30)
t0 = time.monotonic()
got = 0
if mode == "up":
    s.sendall(b"up\n")
    buf = bytes(65536)
    left = n
    while left > 0:
        k = min(left, len(buf))
        s.sendall(buf[:k])
        left -= k
    s.shutdown(socket.SHUT_WR)
    got = int(s.recv(64))
else:
    s.sendall(b"down %d\n" % n)
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got += len(b)
dt = time.monotonic() - t0
if got != n:
    sys.exit("moved %d of %d bytes" % (got, n))
print(n * 8 / dt / 1e6)
`

// bulkRate runs bulkScript in sandbox id against host.
func bulkRate(t *testing.T, c *atoll.Client, id, host, mode string, n int) float64 {
	t.Helper()
	out, code := sh(t, c, id, fmt.Sprintf("python3 -c '%s' %s %s %d 2>&1", bulkScript, host, mode, n))
	var mbit float64
	if _, err := fmt.Sscan(out, &mbit); code != 0 || err != nil {
		t.Fatalf("bulk %s in %s: %q (exit %d)", mode, id, out, code)
	}
	return mbit
}

// slotOf is the slot of a sandbox on the default 10.213.0.0/16 subnet.
func slotOf(t *testing.T, sb api.Sandbox) int {
	t.Helper()
	if sb.Network == nil {
		t.Fatalf("sandbox %s has no network", sb.ID)
	}
	a := netip.MustParseAddr(sb.Network.IPv4).As4()
	return int(a[2])<<8 + int(a[3]) - 2
}

// traces lists what is left in the host namespace of the network of slot:
// namespace file, veth, firewall chain, sets and elements, conntrack
// entries.
func (w *netWorld) traces(t *testing.T, slot int, addrs ...string) []string {
	t.Helper()
	var out []string
	name := fmt.Sprintf("%s-%d", w.id, slot)
	if _, err := os.Lstat(filepath.Join(nettest.Dir, name)); err == nil {
		out = append(out, "namespace "+name)
	}
	nettest.In(w.host, func() error {
		if _, err := netlink.LinkByName(name); err == nil {
			out = append(out, "veth "+name)
		}
		return nil
	})
	fd, err := unix.Open(w.host, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	nft, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	// The server's table is named after its bridge, w.id (not atoll0).
	table := &nftables.Table{Name: "atoll-" + w.id, Family: nftables.TableFamilyINet}
	chains, err := nft.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		if c.Table.Name == table.Name && c.Name == fmt.Sprintf("s%d", slot) {
			out = append(out, "chain "+c.Name)
		}
	}
	sets, err := nft.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[netip.MustParseAddr(a)] = true
	}
	for _, s := range sets {
		if strings.HasPrefix(s.Name, fmt.Sprintf("s%d_", slot)) {
			out = append(out, "set "+s.Name)
			continue
		}
		if s.Interval {
			continue
		}
		elems, err := nft.GetSetElements(s)
		if err != nil {
			continue
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok && want[a] {
				out = append(out, "element "+a.String()+" of "+s.Name)
			}
		}
	}
	ct, err := conntrack.Dial(&mdnetlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	flows, err := ct.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		for _, a := range []netip.Addr{f.TupleOrig.IP.SourceAddress, f.TupleOrig.IP.DestinationAddress,
			f.TupleReply.IP.SourceAddress, f.TupleReply.IP.DestinationAddress} {
			if want[a.Unmap()] {
				out = append(out, "conntrack entry "+f.TupleOrig.IP.SourceAddress.String()+" -> "+f.TupleOrig.IP.DestinationAddress.String())
				break
			}
		}
	}
	return out
}

// TestVMNetworkEndToEnd runs vm sandboxes on a server with networking on:
// the guest reaches the internet by name through the resolver and the egress
// proxy, a deny-all sandbox does not, and a delete leaves nothing.
func TestVMNetworkEndToEnd(t *testing.T) {
	testenv.RequireCommand(t, "curl")
	_, d := startNetworkedVMDaemon(t)
	data := d.data
	c := d.client()
	ctx := context.Background()
	curl := func(id string, args ...string) (string, bool) {
		t.Helper()
		out, code := sh(t, c, id, "curl -fsS --max-time 10 "+strings.Join(args, " ")+" 2>&1")
		return out, code == 0
	}
	out, code := d.cli("create", "--runtime", "vm")
	if code != 0 {
		t.Fatalf("create --runtime vm: %s\n%s", out, d.out.String())
	}
	a := strings.TrimSpace(out)
	if out, ok := curl(a, "http://allowed.example/"); !ok || !strings.HasPrefix(out, "inet ") {
		t.Errorf("allow-all vm by name: %q", out)
	}
	if out, ok := curl(a, "http://"+wOther4+"/"); !ok {
		t.Errorf("allow-all vm by address: %q", out)
	}
	out, code = d.cli("create", "--runtime", "vm", "--egress", "deny-all")
	if code != 0 {
		t.Fatalf("create --runtime vm --egress deny-all: %s", out)
	}
	b := strings.TrimSpace(out)
	if out, ok := curl(b, "http://"+wInet4+"/"); ok {
		t.Errorf("deny-all vm reached the internet: %q", out)
	}
	for _, id := range []string{a, b} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(data, "run-vm", "sandboxes", id)); err == nil {
			t.Errorf("left after delete: run-vm/sandboxes/%s", id)
		}
	}
}

// TestNetworkEndToEnd runs the real `atoll serve` in a namespace of its own
// with networking on, and checks from inside sandboxes what the issue asks:
// isolation, deny-all, allow-lists by name and address, DNS, Host and SNI
// fronting, IPv6, blocked metadata and private ranges, a policy change that
// cuts a connection, and a delete that leaves nothing.
func TestNetworkEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "curl")
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	d := startDaemonIn(t, testenv.Dir(t), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--warm-pool", "1", "--prestart", "1", "--network-pool", "2")
	c := d.client()
	ctx := context.Background()
	create := func(req api.CreateSandboxRequest) api.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("create: %v\n%s", err, d.out.String())
		}
		return sb
	}
	// run runs a shell script in sandbox id and returns its output and
	// whether it exited 0.
	run := func(id, script string) (string, bool) {
		t.Helper()
		out, code := sh(t, c, id, script)
		return out, code == 0
	}
	// curl fails on HTTP errors too: the egress proxy refuses with 403.
	curl := func(id string, args ...string) (string, bool) {
		t.Helper()
		return run(id, "curl -fsS --max-time 5 "+strings.Join(args, " ")+" 2>&1")
	}
	// connect opens a TCP connection to the echo port, which the egress
	// proxy does not see: the firewall alone decides.
	connect := func(id, addr string) bool {
		t.Helper()
		_, ok := run(id, "python3 -c 'import socket; socket.create_connection((\""+addr+"\", 7), timeout=3)' 2>&1")
		return ok
	}
	mustCurl := func(what, id string, args ...string) string {
		t.Helper()
		out, ok := curl(id, args...)
		if !ok {
			t.Errorf("%s: curl %s failed: %s", what, strings.Join(args, " "), out)
		}
		return out
	}
	mustNotCurl := func(what, id string, args ...string) {
		t.Helper()
		if out, ok := curl(id, args...); ok {
			t.Errorf("%s: curl %s worked, want refused: %s", what, strings.Join(args, " "), out)
		}
	}

	a := create(api.CreateSandboxRequest{})
	b := create(api.CreateSandboxRequest{})
	if a.Network == nil || a.Network.Policy.Egress != "allow-all" || a.Network.IPv4 == b.Network.IPv4 {
		t.Fatalf("networks: %+v %+v", a.Network, b.Network)
	}

	// gvisor's sentry has a network stack of its own over the sandbox's
	// eth0; what the host enforces applies to it unchanged.
	t.Run("gvisor sandboxes are networked alike", func(t *testing.T) {
		testenv.RequireCommand(t, "runsc")
		rts, err := c.Runtimes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, rt := range rts {
			if rt.Available && !rt.Capabilities.Network {
				t.Errorf("runtime %s: no network capability", rt.Name)
			}
		}
		g := create(api.CreateSandboxRequest{Runtime: "gvisor", MemoryMiB: 512, Network: &api.NetworkPolicy{Allow: []string{"allowed.example"}}})
		if g.Network == nil || g.Network.IPv4 == "" || g.Network.IPv4 == a.Network.IPv4 {
			t.Fatalf("a gvisor sandbox's network: %+v", g.Network)
		}
		if out, _ := run(g.ID, "dmesg | head -1"); !strings.Contains(out, "gVisor") {
			t.Errorf("not gVisor's kernel: %q", out)
		}
		out := mustCurl("listed name", g.ID, "http://allowed.example/")
		if !strings.HasPrefix(out, "inet 198.51.100.2 allowed.example") {
			t.Errorf("listed name: %q (want the host's uplink address: NAT)", out)
		}
		mustCurl("listed name over IPv6", g.ID, "-6", "http://allowed.example/")
		mustNotCurl("unlisted name", g.ID, "http://other.example/")
		if connect(g.ID, wOther4) || connect(g.ID, wInet6) {
			t.Error("an unlisted address's echo port answers a gvisor sandbox")
		}
		for _, u := range []string{"http://169.254.169.254/", "http://10.99.0.1/"} {
			mustNotCurl("metadata and private ranges", g.ID, "-g", u)
		}
		// The sentry's own server, reached from the host.
		if _, code := sh(t, c, g.ID, "cd /tmp && (python3 -m http.server --bind :: 8080 >/dev/null 2>&1 &) ; sleep 2"); code != 0 {
			t.Fatal("starting a server")
		}
		if _, err := w.fromHost("http://" + g.Network.IPv4 + ":8080/"); err != nil {
			t.Errorf("the host to a gvisor sandbox's server: %v", err)
		}
		mustNotCurl("another sandbox to a gvisor sandbox", a.ID, "http://"+g.Network.IPv4+":8080/")
		// A fork with memory: the child's network stack takes up its own
		// namespace's addresses.
		if _, err := c.StartProcess(ctx, g.ID, api.ExecRequest{Shell: counterShell}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		checkNetworkedMemoryFork(t, c, g.ID)
		// A policy change reaches it too.
		if _, err := c.SetNetwork(ctx, g.ID, api.NetworkPolicy{Egress: "deny-all"}); err != nil {
			t.Fatal(err)
		}
		mustNotCurl("listed name after deny-all", g.ID, "http://allowed.example/")
		if err := c.DeleteSandbox(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("sandboxes cannot reach each other", func(t *testing.T) {
		if _, code := sh(t, c, a.ID, "cd /tmp && (python3 -m http.server --bind :: 8080 >/dev/null 2>&1 &) ; sleep 1"); code != 0 {
			t.Fatal("starting a server")
		}
		for _, addr := range []string{a.Network.IPv4, "[" + a.Network.IPv6 + "]"} {
			u := "http://" + addr + ":8080/"
			if _, err := w.fromHost(u); err != nil {
				t.Errorf("positive control: the host to %s: %v", u, err)
			}
			mustCurl("positive control: the sandbox to itself", a.ID, "-g", u)
			mustNotCurl("another sandbox", b.ID, "-g", u)
		}
	})

	t.Run("allow-all reaches the internet by address and by name", func(t *testing.T) {
		out := mustCurl("by name", a.ID, "http://allowed.example/")
		if !strings.HasPrefix(out, "inet 198.51.100.2 allowed.example") {
			t.Errorf("by name: %q (want the host's uplink address: NAT)", out)
		}
		mustCurl("by IPv6 name", a.ID, "-6", "http://allowed.example/")
		mustCurl("by address", a.ID, "http://"+wOther4+"/")
		out, _ = run(a.ID, "cat /etc/resolv.conf /etc/hosts")
		if !strings.Contains(out, "nameserver 10.213.0.1") || !strings.Contains(out, a.Network.IPv4+"\t"+a.ID) {
			t.Errorf("resolv.conf and hosts: %q", out)
		}
	})

	t.Run("metadata and private ranges are blocked", func(t *testing.T) {
		for _, u := range []string{"http://169.254.169.254/", "http://[fd00:ec2::254]/", "http://10.99.0.1/"} {
			if body, err := w.fromHost(u); err != nil || !strings.HasPrefix(body, "lan ") {
				t.Errorf("positive control: the host to %s: %q %v", u, body, err)
			}
			mustNotCurl("allow-all sandbox", a.ID, "-g", u)
		}
	})

	t.Run("deny-all", func(t *testing.T) {
		out, code := d.cli("create", "--egress", "deny-all")
		if code != 0 {
			t.Fatalf("create --egress deny-all: %s", out)
		}
		id := strings.TrimSpace(out)
		mustCurl("positive control: allow-all", a.ID, "http://"+wInet4+"/")
		mustNotCurl("deny-all by address", id, "http://"+wInet4+"/")
		if connect(id, wInet4) || connect(id, wInet6) {
			t.Error("deny-all reaches an echo port")
		}
		mustNotCurl("deny-all by IPv6 address", id, "-g", "http://["+wInet6+"]/")
		mustNotCurl("deny-all by name", id, "http://allowed.example/")
		if out, ok := run(id, "getent hosts allowed.example"); ok {
			t.Errorf("deny-all resolves a name: %s", out)
		}
	})

	l := create(api.CreateSandboxRequest{Network: &api.NetworkPolicy{Allow: []string{"allowed.example", wListed4}}})
	t.Run("allow list", func(t *testing.T) {
		if l.Network.Policy.Egress != "deny-all" {
			t.Errorf("policy shown: %+v", l.Network.Policy)
		}
		out := mustCurl("listed name", l.ID, "http://allowed.example/")
		if !strings.Contains(out, "allowed.example") {
			t.Errorf("listed name: %q", out)
		}
		mustCurl("listed name over IPv6", l.ID, "-6", "http://allowed.example/")
		mustCurl("listed address", l.ID, "http://"+wListed4+"/")
		mustCurl("positive control: other.example from allow-all", a.ID, "http://other.example/")
		mustNotCurl("unlisted name", l.ID, "http://other.example/")
		if !connect(a.ID, wOther4) || !connect(l.ID, wAllowed4) || !connect(l.ID, wAllowed6) {
			t.Error("positive control: echo port from allow-all, or of a resolved listed name")
		}
		if connect(l.ID, wOther4) || connect(l.ID, wOther6) || connect(l.ID, wInet4) {
			t.Error("an unlisted address's echo port answers")
		}
		mustNotCurl("unlisted address", l.ID, "http://"+wOther4+"/")
		mustNotCurl("unlisted IPv6 address", l.ID, "-g", "http://["+wOther6+"]/")
		if out, ok := run(l.ID, "getent hosts other.example"); ok {
			t.Errorf("an unlisted name resolves: %s", out)
		}
		leak := "leak-" + w.id + ".example"
		run(l.ID, "getent hosts "+leak)
		if w.dns.WasAsked(leak) {
			t.Error("the resolver asked upstream about an unlisted name")
		}
	})

	t.Run("Host and SNI fronting fail", func(t *testing.T) {
		mustCurl("positive control: HTTPS with a listed name", l.ID, "-k", "https://allowed.example/")
		mustCurl("positive control: secret.example from allow-all", a.ID, "-k", "--resolve", "secret.example:443:"+wAllowed4, "https://secret.example/")
		out, _ := run(l.ID, "curl -sS --max-time 5 -o /dev/null -w '%{http_code}' -H 'Host: secret.example' http://allowed.example/")
		if out != "403" {
			t.Errorf("Host secret.example on an allowed address: %q, want 403", out)
		}
		mustNotCurl("SNI secret.example on an allowed address", l.ID, "-k", "--resolve", "secret.example:443:"+wAllowed4, "https://secret.example/")
		mustNotCurl("SNI secret.example on an allowed IPv6 address", l.ID, "-k", "--resolve", "secret.example:443:["+wAllowed6+"]", "https://secret.example/")
	})

	t.Run("a policy change cuts a forbidden connection", func(t *testing.T) {
		script := `import socket, sys, time
s = socket.create_connection(("` + wInet4 + `", 7), timeout=3)
for i in range(200):
    try:
        s.sendall(b"x\n")
        if s.recv(16) != b"x\n":
            raise Exception("bad echo")
        print("ok", flush=True)
    except Exception as e:
        print("cut", e, flush=True)
        sys.exit(0)
    time.sleep(0.1)
`
		if _, err := c.StartProcess(ctx, b.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "python3 -c '" + script + "' > /tmp/echo.log 2>&1"}, Background: true}); err != nil {
			t.Fatal(err)
		}
		waitFor := func(what, pattern string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				out, _ := run(b.ID, "cat /tmp/echo.log")
				if strings.Contains(out, pattern) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: log %q", what, out)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		waitFor("positive control: the connection works", "ok")
		out, code := d.cli("network", b.ID, "--egress", "deny-all", "--allow", "allowed.example")
		if code != 0 || !strings.Contains(out, "deny-all") {
			t.Fatalf("atoll network: %s", out)
		}
		waitFor("the forbidden connection is cut", "cut")
		mustCurl("what the new policy allows", b.ID, "http://allowed.example/")
		n, err := c.GetNetwork(ctx, b.ID)
		if err != nil || n.Policy.Egress != "deny-all" || len(n.Policy.Allow) != 1 {
			t.Errorf("GetNetwork: %+v %v", n, err)
		}
	})

	var capped api.Sandbox
	t.Run("bandwidth caps", func(t *testing.T) {
		const egressCap, ingressCap = 8, 16 // Mbit/s
		const up, down = 3 << 19, 3 << 20   // bytes: ~1.5 s each at the caps
		// within checks a capped rate: not above the cap (a 64 KiB burst
		// and timing aside), and not starved far below it.
		within := func(what string, got, cap float64) {
			t.Helper()
			t.Logf("%s: %.1f Mbit/s (cap %v)", what, got, cap)
			if got > 1.25*cap || got < 0.3*cap {
				t.Errorf("%s: %.1f Mbit/s, want about %v", what, got, cap)
			}
		}
		if r := bulkRate(t, c, a.ID, wInet4, "up", up); r < 3*egressCap {
			t.Errorf("positive control: uncapped upload %.1f Mbit/s", r)
		}
		if r := bulkRate(t, c, a.ID, wInet4, "down", down); r < 3*ingressCap {
			t.Errorf("positive control: uncapped download %.1f Mbit/s", r)
		}
		out, code := d.cli("create", "--egress-mbit", "8", "--ingress-mbit", "16")
		if code != 0 {
			t.Fatalf("create --egress-mbit: %s", out)
		}
		var err error
		if capped, err = c.GetSandbox(ctx, strings.TrimSpace(out)); err != nil {
			t.Fatal(err)
		}
		if bw := capped.Network.Policy.Bandwidth; bw == nil || *bw != (api.Bandwidth{EgressMbit: egressCap, IngressMbit: ingressCap}) {
			t.Errorf("policy shown: %+v", capped.Network.Policy)
		}
		within("capped upload", bulkRate(t, c, capped.ID, wInet4, "up", up), egressCap)
		within("capped download", bulkRate(t, c, capped.ID, wInet4, "down", down), ingressCap)
		within("capped upload over IPv6", bulkRate(t, c, capped.ID, wInet6, "up", up), egressCap)
		if out, ok := run(capped.ID, "tc qdisc del dev eth0 root 2>&1"); ok {
			t.Errorf("root in the sandbox removed its cap: %s", out)
		}
		// Changed while running: the egress cap lifted, then set again.
		if _, err := c.SetNetwork(ctx, capped.ID, api.NetworkPolicy{Bandwidth: &api.Bandwidth{IngressMbit: ingressCap}}); err != nil {
			t.Fatal(err)
		}
		if r := bulkRate(t, c, capped.ID, wInet4, "up", up); r < 3*egressCap {
			t.Errorf("upload with the cap lifted: %.1f Mbit/s", r)
		}
		if out, code := d.cli("network", capped.ID, "--egress-mbit", "8", "--ingress-mbit", "16"); code != 0 || !strings.Contains(out, "egress 8 Mbit/s, ingress 16 Mbit/s") {
			t.Fatalf("atoll network --egress-mbit: %s", out)
		}
		within("upload capped again", bulkRate(t, c, capped.ID, wInet4, "up", up), egressCap)
	})

	t.Run("the policy survives stop and start and a daemon restart", func(t *testing.T) {
		if _, err := c.StopSandbox(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		if left := w.traces(t, slotOf(t, l), l.Network.IPv4, l.Network.IPv6); len(left) > 0 {
			t.Errorf("a stopped sandbox's network is left: %v", left)
		}
		if _, err := c.StartSandbox(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		mustCurl("listed name after a restart", l.ID, "http://allowed.example/")
		mustNotCurl("unlisted address after a restart", l.ID, "http://"+wOther4+"/")
		d.kill()
		d.start()
		c = d.client()
		mustCurl("listed name after a daemon restart", l.ID, "http://allowed.example/")
		mustNotCurl("unlisted address after a daemon restart", l.ID, "http://"+wOther4+"/")
		mustCurl("allow-all after a daemon restart", a.ID, "http://"+wOther4+"/")
		if capped.ID != "" {
			out, _ := run(capped.ID, "tc qdisc show dev eth0")
			if !strings.Contains(out, "tbf") || !strings.Contains(out, "8Mbit") {
				t.Errorf("egress cap after a daemon restart: %q", out)
			}
		}
	})

	t.Run("delete leaves no trace", func(t *testing.T) {
		slot := slotOf(t, l)
		mustCurl("traffic to leave conntrack entries", l.ID, "http://allowed.example/")
		if left := w.traces(t, slot, l.Network.IPv4, l.Network.IPv6); len(left) < 4 {
			t.Errorf("positive control: a running sandbox's network: %v", left)
		}
		if err := c.DeleteSandbox(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		if left := w.traces(t, slot, l.Network.IPv4, l.Network.IPv6); len(left) > 0 {
			t.Errorf("left after delete: %v", left)
		}
	})
	_ = atoll.ErrNotFound
}

// TestNetworkMeasure reports what networking costs (docs/benchmarks.md):
// create → ready on a server with networking against one without, both
// cold (no warm pool, no prestarted processes: the network pool is what
// stands between a create and its network), interleaved so that the
// machine's load falls on both; and TCP throughput between a sandbox and
// the test host beside the same transfer from the host's namespace. It
// reports figures and fails only if something does not work.
func TestNetworkMeasure(t *testing.T) {
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	ctx := context.Background()
	create := func(c *atoll.Client) time.Duration {
		t.Helper()
		t0 := time.Now()
		sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
		d := time.Since(t0)
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		return d
	}
	q := func(ds []time.Duration) (p50, p99 time.Duration) {
		slices.Sort(ds)
		return ds[len(ds)/2].Round(10 * time.Microsecond), ds[len(ds)*99/100].Round(10 * time.Microsecond)
	}
	// compare times creates on a server with networking and one without,
	// both given args.
	var con *atoll.Client
	var prev *daemon
	compare := func(what string, pause time.Duration, args ...string) {
		if prev != nil {
			prev.stop() // this pair's "on" takes over the bridge
		}
		on := startDaemonIn(t, testenv.Dir(t), w.host, append([]string{"--network", "on", "--network-bridge", w.id,
			"--dns-upstream", wInet4, "--network-pool", "4"}, args...)...)
		off := startDaemonIn(t, testenv.Dir(t), w.host, append([]string{"--network", "off"}, args...)...)
		con = on.client()
		coff := off.client()
		create(con) // each builds its host template
		create(coff)
		const n = 40
		var don, doff []time.Duration
		for i := 0; i < n; i++ {
			time.Sleep(pause) // the pools refill
			don = append(don, create(con))
			doff = append(doff, create(coff))
		}
		on50, on99 := q(don)
		off50, off99 := q(doff)
		t.Logf("create → ready, %s, n=%d: network on p50 %v p99 %v; off p50 %v p99 %v; difference at p50 %v",
			what, n, on50, on99, off50, off99, on50-off50)
		off.stop()
		prev = on
	}
	compare("prestarted processes (the default)", 300*time.Millisecond, "--warm-pool", "0", "--prestart", "2")
	compare("cold (no warm pool, no prestarted process)", 50*time.Millisecond, "--warm-pool", "0", "--prestart", "0")

	sb := newSandbox(ctx, t, con, api.CreateSandboxRequest{})
	// fromHost runs the same script in the host's namespace: the peer.
	fromHost := func(mode string, size int) float64 {
		t.Helper()
		cmd := exec.Command("python3", "-c", bulkScript, wInet4, mode, fmt.Sprint(size))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := nettest.In(w.host, cmd.Start); err != nil {
			t.Fatal(err)
		}
		var mbit float64
		if err := cmd.Wait(); err != nil {
			t.Fatalf("bulk %s from the host: %v: %s", mode, err, out.String())
		}
		if _, err := fmt.Sscan(out.String(), &mbit); err != nil {
			t.Fatalf("bulk %s from the host: %q", mode, out.String())
		}
		return mbit
	}
	const size = 64 << 20
	for _, mode := range []string{"up", "down"} {
		var sbr, hr []float64
		for i := 0; i < 5; i++ {
			sbr = append(sbr, bulkRate(t, con, sb.ID, wInet4, mode, size))
			hr = append(hr, fromHost(mode, size))
		}
		slices.Sort(sbr)
		slices.Sort(hr)
		t.Logf("TCP %s, 64 MiB, median of 5: sandbox ↔ test host %.0f Mbit/s; host namespace ↔ test host %.0f Mbit/s (%.2f×)",
			mode, sbr[2], hr[2], sbr[2]/hr[2])
	}
}
