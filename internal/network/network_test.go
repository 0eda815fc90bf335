package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestProbe(t *testing.T) {
	testenv.RequireRoot(t)
	if err := Probe(); err != nil {
		// Fail rather than skip in strict mode: this is what CI must have.
		testenv.Skip(t, err.Error())
	}
}

// TestNetwork checks the isolation guarantees of the package comment, each
// refusal after a positive control that shows the target answering.
func TestNetwork(t *testing.T) {
	tp := newTopology(t, Config{
		GatewayTCPPorts: []uint16{53, 3128},
		Allow:           []netip.Prefix{allowedPrefix},
	})
	m := tp.m
	ctx := context.Background()
	a, err := m.Attach(ctx, 1, egress.Policy{})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	pool := warmPool(t, m, 1)
	b, err := pool.Get(ctx, 2, egress.Policy{})
	if err != nil {
		t.Fatalf("Pool.Get: %v", err)
	}
	t.Cleanup(func() {
		m.Release(ctx, 1)
		m.Release(ctx, 2)
	})

	// A serves HTTP on 8080, dual-stack, from inside its namespace.
	serveHTTP(t, a.Netns, "sandbox-a", "[::]:8080")
	// The host plays the resolver (53) and the egress proxy (3128) on the
	// gateway, and has other ports that sandboxes must not reach.
	for _, gw := range []netip.Addr{a.Gateway4, a.Gateway6} {
		serveTCP(t, tp.host, hostport(gw.String(), 53))
		serveTCP(t, tp.host, hostport(gw.String(), 3128))
		serveUDP(t, tp.host, hostport(gw.String(), 53))
		serveUDP(t, tp.host, hostport(gw.String(), 5353))
	}
	serveTCP(t, tp.host, "[::]:8081") // every host address, the uplink's too

	t.Run("attachment", func(t *testing.T) {
		cfg := m.Config()
		if a.MTU != uplinkMTU {
			t.Errorf("MTU %d, want the uplink's %d", a.MTU, uplinkMTU)
		}
		wantA4, wantA6 := cfg.slotAddrs(1)
		if a.Addr4 != wantA4 || a.Addr6 != wantA6 || a.Addr4.String() != "10.213.0.3/16" {
			t.Errorf("addresses %s %s, want %s %s", a.Addr4, a.Addr6, wantA4, wantA6)
		}
		if a.Gateway4.String() != "10.213.0.1" || a.Gateway6 != nthAddr(cfg.Subnet6, 1) {
			t.Errorf("gateways %s %s", a.Gateway4, a.Gateway6)
		}
		if !cfg.Subnet6.Addr().IsPrivate() || cfg.Subnet6.Bits() != 64 {
			t.Errorf("default IPv6 subnet %s is not a ULA /64", cfg.Subnet6)
		}
		if b.Netns != filepath.Join("/run/netns", tp.id+"-2") || b.HostLink != tp.id+"-2" {
			t.Errorf("pool attachment named %s %s", b.Netns, b.HostLink)
		}
		for _, att := range []*Attachment{a, b} {
			err := netns.Run(att.Netns, func() error {
				eth0, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				if eth0.Attrs().MTU != uplinkMTU || eth0.Attrs().Flags&net.FlagUp == 0 {
					t.Errorf("slot %d eth0: MTU %d flags %v", att.Slot, eth0.Attrs().MTU, eth0.Attrs().Flags)
				}
				lo, err := netlink.LinkByName("lo")
				if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
					t.Errorf("slot %d lo is not up: %v", att.Slot, err)
				}
				for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
					addrs, err := netlink.AddrList(eth0, fam)
					if err != nil {
						return err
					}
					found := false
					for _, ad := range addrs {
						p, _ := prefixOf(ad.IPNet)
						found = found || p == att.Addr4 || p == att.Addr6
					}
					if !found {
						t.Errorf("slot %d eth0 lacks its family %d address: %v", att.Slot, fam, addrs)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var isolated bool
			if l, err := tp.hostHandle.LinkByName(att.HostLink); err != nil {
				t.Fatal(err)
			} else if pi := l.Attrs().Protinfo; pi != nil {
				isolated = pi.Isolated
			} else if pi, err := tp.hostHandle.LinkGetProtinfo(l); err == nil {
				isolated = pi.Isolated
			}
			if !isolated {
				t.Errorf("bridge port %s is not isolated", att.HostLink)
			}
		}
	})

	t.Run("host reaches sandbox", func(t *testing.T) {
		for _, ad := range []netip.Addr{a.Addr4.Addr(), a.Addr6.Addr()} {
			body, err := get(tp.host, url(ad.String(), 8080))
			if err == nil && !strings.HasPrefix(body, "sandbox-a ") {
				t.Errorf("host to %s: got %q", ad, body)
			}
			mustReach(t, "host to sandbox "+ad.String(), err)
		}
	})

	t.Run("sandboxes cannot reach each other", func(t *testing.T) {
		for _, ad := range []netip.Addr{a.Addr4.Addr(), a.Addr6.Addr()} {
			u := url(ad.String(), 8080)
			_, err := get(tp.host, u)
			mustReach(t, "positive control: host to "+u, err)
			_, err = get(a.Netns, u)
			mustReach(t, "positive control: sandbox a to itself "+u, err)
			_, err = get(b.Netns, u)
			mustNotReach(t, "sandbox b to sandbox a "+u, err)
		}
	})

	t.Run("sandboxes reach the internet through NAT", func(t *testing.T) {
		for _, att := range []*Attachment{a, b} {
			body, err := get(att.Netns, url(inet4, 80))
			wantBody(t, "IPv4 to the internet host", body, err, "inet "+uplink4)
			body, err = get(att.Netns, url(inet6, 80))
			wantBody(t, "IPv6 to the internet host", body, err, "inet "+uplink6)
		}
	})

	t.Run("sandbox reaches only the gateway ports", func(t *testing.T) {
		for _, gw := range []netip.Addr{a.Gateway4, a.Gateway6} {
			for _, port := range []int{53, 3128} {
				mustReach(t, "positive control: host to tcp "+hostport(gw.String(), port), tcpHello(tp.host, hostport(gw.String(), port)))
				mustReach(t, "sandbox to allowed tcp "+hostport(gw.String(), port), tcpHello(a.Netns, hostport(gw.String(), port)))
			}
			mustReach(t, "sandbox to allowed udp 53", udpEcho(a.Netns, hostport(gw.String(), 53)))
			mustReach(t, "positive control: host to udp 5353", udpEcho(tp.host, hostport(gw.String(), 5353)))
			mustNotReach(t, "sandbox to udp 5353 on the gateway", udpEcho(a.Netns, hostport(gw.String(), 5353)))
		}
		for _, ad := range []string{a.Gateway4.String(), a.Gateway6.String(), uplink4, uplink6} {
			hp := hostport(ad, 8081)
			mustReach(t, "positive control: host to "+hp, tcpHello(tp.host, hp))
			err := tcpHello(a.Netns, hp)
			mustNotReach(t, "sandbox to host port "+hp, err)
			if err != nil && !isRefused(err) {
				t.Errorf("sandbox to host port %s: %v, want a quick refusal", hp, err)
			}
		}
	})

	t.Run("blocked destinations", func(t *testing.T) {
		for _, ad := range []string{metadata4, metadata6, private4} {
			u := url(ad, 80)
			body, err := get(tp.host, u)
			wantBody(t, "positive control: host to "+u, body, err, "lan "+hostAddrOnLan(ad))
			_, err = get(a.Netns, u)
			mustNotReach(t, "sandbox to "+u, err)
			if err != nil && !isRefused(err) {
				t.Errorf("sandbox to %s: %v, want a quick refusal", u, err)
			}
		}
		// The operator allowed 192.168.77.0/24: the same path works.
		body, err := get(a.Netns, url(allowed4, 80))
		wantBody(t, "sandbox to the operator-allowed private host", body, err, "lan 192.168.77.2")
	})

	t.Run("sandbox cannot change its network", func(t *testing.T) {
		testenv.RequireCommand(t, "ip")
		// As the host's root the change works: the positive control.
		if out, err := runIn(a.Netns, false, "ip", "link", "set", "dev", "eth0", "mtu", "1400"); err != nil {
			t.Fatalf("positive control: ip as host root: %v: %s", err, out)
		}
		runIn(a.Netns, false, "ip", "link", "set", "dev", "eth0", "mtu", "1450")
		for _, args := range [][]string{
			{"ip", "link", "set", "dev", "eth0", "mtu", "1400"},
			{"ip", "addr", "add", "10.213.0.200/16", "dev", "eth0"},
			{"ip", "route", "replace", "default", "via", "10.213.0.4"},
			{"ip", "link", "add", "x0", "type", "dummy"},
		} {
			if out, err := runIn(a.Netns, true, args...); err == nil {
				t.Errorf("%s as sandbox root: worked, want refused: %s", strings.Join(args, " "), out)
			} else if !strings.Contains(string(out), "Operation not permitted") {
				t.Errorf("%s as sandbox root: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		// Debian's python3, which the sandbox's unprivileged host uids can
		// execute (a pyenv shim under /root is not).
		const python = "/usr/bin/python3"
		if _, err := os.Stat(python); err != nil {
			testenv.Skip(t, "needs "+python)
		}
		raw := `import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw ok")`
		if out, err := runIn(a.Netns, false, python, "-c", raw); err != nil || !strings.Contains(string(out), "raw ok") {
			t.Fatalf("positive control: raw socket as host root: %v: %s", err, out)
		}
		if out, err := runIn(a.Netns, true, python, "-c", raw); err == nil || !strings.Contains(string(out), "Operation not permitted") {
			t.Errorf("raw socket as sandbox root: %v: %s; want EPERM", err, out)
		}
		// What the namespace lets sandbox root do all the same.
		bind := `import socket; s = socket.socket(); s.bind(("0.0.0.0", 80)); print("bound")`
		if out, err := runIn(a.Netns, true, python, "-c", bind); err != nil || !strings.Contains(string(out), "bound") {
			t.Errorf("binding port 80 as sandbox root: %v: %s", err, out)
		}
		ping := `import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print("ping ok")`
		if out, err := runIn(a.Netns, true, python, "-c", ping); err != nil || !strings.Contains(string(out), "ping ok") {
			t.Errorf("ping socket as sandbox root: %v: %s", err, out)
		}
	})

	t.Run("router advertisements from a sandbox change nothing", func(t *testing.T) {
		// Positive control: the same advertisement configures a plain
		// namespace that takes advertisements.
		tx := filepath.Join(testNetnsIn, "atollt-"+tp.id+"-tx")
		rx := filepath.Join(testNetnsIn, "atollt-"+tp.id+"-rx")
		for _, p := range []string{tx, rx} {
			if err := netns.Create(p, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { netns.Remove(p) })
		}
		rxfd, err := unix.Open(rx, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(rxfd)
		err = netns.Run(tx, func() error {
			attrs := netlink.NewLinkAttrs()
			attrs.Name = "eth0"
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(rxfd)}); err != nil {
				return err
			}
			return linkUp("eth0")
		})
		if err != nil {
			t.Fatal(err)
		}
		err = netns.Run(rx, func() error {
			if err := writeSysctl("net.ipv6.conf.eth0.accept_ra", "2"); err != nil {
				return err
			}
			return linkUp("eth0")
		})
		if err != nil {
			t.Fatal(err)
		}
		took := func(path, link string) bool {
			var found bool
			netns.Run(path, func() error {
				l, err := netlink.LinkByName(link)
				if err != nil {
					return err
				}
				addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
				for _, a := range addrs {
					found = found || rogueRAPrefix.Contains(netip.AddrFrom16([16]byte(a.IP.To16())))
				}
				routes, _ := netlink.RouteList(nil, netlink.FAMILY_V6)
				for _, r := range routes {
					found = found || r.Dst == nil && r.Gw != nil && r.Gw.IsLinkLocalUnicast()
				}
				return nil
			})
			return found
		}
		deadline := time.Now().Add(10 * time.Second)
		var sendErr error
		for !took(rx, "eth0") {
			if time.Now().After(deadline) {
				t.Fatalf("positive control: the advertisement configured nothing (last send: %v)", sendErr)
			}
			// Until tx's link-local address is ready, sending fails.
			sendErr = sendRA(tx)
			time.Sleep(200 * time.Millisecond)
		}
		// From a sandbox (sent as the host's root: the sandbox itself could
		// not open the raw socket), for as long as the control needed.
		for i := 0; i < 5; i++ {
			if err := sendRA(b.Netns); err != nil {
				t.Fatalf("sending an advertisement from the sandbox: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if took(tp.host, tp.id) {
			t.Error("the host took a sandbox's router advertisement")
		}
		if took(a.Netns, "eth0") {
			t.Error("another sandbox took a sandbox's router advertisement")
		}
	})

	t.Run("host ignores router advertisements", func(t *testing.T) {
		err := netns.Run(tp.host, func() error {
			for _, k := range []string{"accept_ra", "accept_redirects"} {
				v, err := readSysctl("net.ipv6.conf." + tp.id + "." + k)
				if err != nil {
					return err
				}
				if v != "0" {
					t.Errorf("bridge %s = %s", k, v)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("restart keeps sandboxes", func(t *testing.T) {
		// A daemon restart: the old Manager goes without a word, a new one
		// rewrites the table and must keep a and b's elements.
		m2, err := New(m.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m2.Close()
		if got, err := m2.Lookup(1); err != nil || got.Addr4 != a.Addr4 || got.Addr6 != a.Addr6 ||
			got.Netns != a.Netns || got.MTU != a.MTU {
			t.Errorf("Lookup after restart: %+v, %v; want %+v", got, err, a)
		}
		body, err := get(a.Netns, url(inet4, 80))
		wantBody(t, "sandbox to the internet after restart", body, err, "inet "+uplink4)
		body, err = get(b.Netns, url(inet6, 80))
		wantBody(t, "sandbox to the internet after restart", body, err, "inet "+uplink6)
		if _, err := m2.Lookup(7); err == nil {
			t.Error("Lookup of a slot never attached: found")
		}
	})
}

// hostAddrOnLan is the host's address on the lan link in ad's subnet: what
// the lan's server reports as the client of a request from the host.
func hostAddrOnLan(ad string) string {
	switch ad {
	case metadata4:
		return "169.254.169.1"
	case metadata6:
		return "fd00:ec2::1"
	case private4:
		return "10.99.0.2"
	}
	return "192.168.77.2"
}

// runIn runs a command inside the namespace at path, as the host's root, or
// (sandbox) as root of a new user namespace mapped to an unprivileged host
// range, as the ns runtime starts sandboxes.
func runIn(path string, sandbox bool, args ...string) ([]byte, error) {
	cmd := exec.Command(args[0], args[1:]...)
	if sandbox {
		idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 27, Size: 65536}}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: idmap, GidMappings: idmap,
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
		}
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := netns.Run(path, cmd.Start); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return []byte(out.String()), err
}

func TestChildJoinsNetns(t *testing.T) {
	tp := newTopology(t, Config{})
	a, err := tp.m.Attach(context.Background(), 0, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.m.Release(context.Background(), 0) })
	var st unix.Stat_t
	if err := unix.Stat(a.Netns, &st); err != nil {
		t.Fatal(err)
	}
	out, err := runIn(a.Netns, true, "readlink", "/proc/self/ns/net")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"
	if strings.TrimSpace(string(out)) != want {
		t.Errorf("child's namespace %s, want %s", out, want)
	}
	// And the parent's threads are back where they were.
	self, _ := os.Readlink("/proc/thread-self/ns/net")
	if self == want {
		t.Error("calling thread left in the sandbox namespace")
	}
}

// linkUp sets link name of the current network namespace up.
func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// warmPool runs a pool of n over m until t ends, and returns it once it
// holds n.
func warmPool(t testing.TB, m *Manager, n int) *Pool {
	t.Helper()
	pool := NewPool(m, n)
	runPool(t, pool)
	waitLen(t, pool, n)
	return pool
}

func runPool(t testing.TB, p *Pool) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func waitLen(t testing.TB, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d warm entries, want %d", p.Len(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// census counts what the Manager has in the host namespace for the given
// slots: namespace files, host links, firewall elements (verdict map, open
// and proxied sets), slot chains and sets, conntrack entries, neighbour
// entries with a MAC on the bridge.
type census struct{ netns, links, elements, objects, conntrack, neigh int }

func takeCensus(t testing.TB, tp *topology, slots ...int) census {
	t.Helper()
	m := tp.m
	var c census
	addrs := map[netip.Addr]bool{}
	names := map[string]bool{}
	for _, s := range slots {
		a4, a6 := m.cfg.slotAddrs(s)
		addrs[a4.Addr()], addrs[a6.Addr()] = true, true
		names[m.cfg.slotName(s)] = true
	}
	ents, _ := os.ReadDir(m.cfg.NetnsDir)
	for _, e := range ents {
		if names[e.Name()] {
			c.netns++
		}
	}
	links, err := tp.hostHandle.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if names[l.Attrs().Name] {
			c.links++
		}
	}
	m.nftMu.Lock()
	for _, s := range []*nftables.Set{m.rs.sandbox4, m.rs.sandbox6, m.rs.open4, m.rs.open6, m.rs.proxied4, m.rs.proxied6} {
		elems, err := m.nft.GetSetElements(s)
		if err != nil {
			m.nftMu.Unlock()
			t.Fatal(err)
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok && addrs[a] {
				c.elements++
			}
		}
	}
	inSlots := func(name string) bool {
		slot, ok := parseSlotObject(name)
		return ok && slices.Contains(slots, slot)
	}
	chains, err := m.nft.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		m.nftMu.Unlock()
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == m.rs.table.Name && inSlots(ch.Name) {
			c.objects++
		}
	}
	sets, err := m.nft.GetSets(m.rs.table)
	if err != nil {
		m.nftMu.Unlock()
		t.Fatal(err)
	}
	for _, s := range sets {
		if inSlots(s.Name) {
			c.objects++
		}
	}
	m.nftMu.Unlock()
	ct, err := m.dialConntrack()
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	flows, err := ct.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if flowMatches(f, func(a netip.Addr) bool { return addrs[a] }) {
			c.conntrack++
		}
	}
	neighs, err := tp.hostHandle.NeighList(m.bridgeIx, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		// Entries without a MAC (incomplete, failed) are the kernel's
		// attempts to reach a released address, the last packets of a
		// closed connection say: they hold nothing and expire.
		if a, ok := netip.AddrFromSlice(n.IP); ok && addrs[a.Unmap()] && len(n.HardwareAddr) > 0 {
			c.neigh++
		}
	}
	return c
}

// traffic makes conntrack entries for att: to the internet over both
// families, to the resolver port, and from the host in.
func traffic(t testing.TB, tp *topology, att *Attachment) {
	t.Helper()
	for _, u := range []string{url(inet4, 80), url(inet6, 80)} {
		if _, err := get(att.Netns, u); err != nil {
			t.Fatalf("sandbox %d to %s: %v", att.Slot, u, err)
		}
	}
	if err := udpEcho(att.Netns, hostport(att.Gateway4.String(), 53)); err != nil {
		t.Fatalf("sandbox %d to the resolver: %v", att.Slot, err)
	}
	if _, err := get(tp.host, url(att.Addr4.Addr().String(), 8080)); err != nil {
		t.Fatalf("host to sandbox %d: %v", att.Slot, err)
	}
}

func TestReleaseLeavesNothing(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	serveUDP(t, tp.host, hostport("10.213.0.1", 53))
	pool := warmPool(t, m, 1)
	cold, err := m.Attach(ctx, 5, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	warm, err := pool.Get(ctx, 6, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	for _, att := range []*Attachment{cold, warm} {
		serveHTTP(t, att.Netns, "sandbox", "[::]:8080")
		traffic(t, tp, att)
	}
	before := takeCensus(t, tp, 5, 6)
	if want := (census{netns: 2, links: 2, elements: 8, objects: 14}); before.netns != want.netns || before.links != want.links ||
		before.elements != want.elements || before.objects != want.objects || before.conntrack < 8 || before.neigh < 2 {
		t.Fatalf("before release: %+v, want %+v and at least 8 conntrack and 2 neighbour entries", before, want)
	}
	for _, slot := range []int{5, 6} {
		if err := m.Release(ctx, slot); err != nil {
			t.Fatalf("Release(%d): %v", slot, err)
		}
	}
	if after := takeCensus(t, tp, 5, 6); after != (census{}) {
		t.Errorf("after release: %+v, want nothing (before: %+v)", after, before)
	}
	if exists(cold.Netns) || netns.Mounted(warm.Netns) {
		t.Error("namespace files left")
	}
	// Releasing again is fine; so is attaching the slot anew.
	if err := m.Release(ctx, 5); err != nil {
		t.Errorf("second Release: %v", err)
	}
	again, err := m.Attach(ctx, 5, egress.Policy{})
	if err != nil {
		t.Fatalf("Attach after Release: %v", err)
	}
	body, err := get(again.Netns, url(inet4, 80))
	wantBody(t, "reattached sandbox to the internet", body, err, "inet "+uplink4)
	if err := m.Release(ctx, 5); err != nil {
		t.Fatal(err)
	}
}

func TestSweep(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	serveUDP(t, tp.host, hostport("10.213.0.1", 53))
	var atts []*Attachment
	for _, slot := range []int{1, 2, 3} {
		a, err := m.Attach(ctx, slot, egress.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		serveHTTP(t, a.Netns, "sandbox", "[::]:8080")
		traffic(t, tp, a)
		atts = append(atts, a)
	}
	// Warm entries of a pool that dies with the daemon.
	for i := 0; i < 2; i++ {
		if _, err := m.warmEntry(); err != nil {
			t.Fatal(err)
		}
	}
	// A half-made slot: a namespace file with no veth.
	half := filepath.Join(m.cfg.NetnsDir, m.cfg.slotName(9))
	if err := netns.Create(half, nil); err != nil {
		t.Fatal(err)
	}

	// The daemon restarts; the store says only slot 2 still has a network.
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.Sweep(ctx, []int{2}); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if c := takeCensus(t, tp, 1, 3, 9); c != (census{}) {
		t.Errorf("after sweep, slots 1, 3, 9: %+v, want nothing", c)
	}
	if c := takeCensus(t, tp, 2); c.netns != 1 || c.links != 1 || c.elements != 4 || c.objects != 7 || c.conntrack == 0 || c.neigh == 0 {
		t.Errorf("after sweep, kept slot 2: %+v", c)
	}
	ents, _ := os.ReadDir(m.cfg.NetnsDir)
	for _, e := range ents {
		if m.cfg.isWarmName(e.Name()) {
			t.Errorf("warm namespace %s left", e.Name())
		}
	}
	links, _ := tp.hostHandle.LinkList()
	for _, l := range links {
		if m.cfg.isWarmName(l.Attrs().Name) {
			t.Errorf("warm veth %s left", l.Attrs().Name)
		}
	}
	body, err := get(atts[1].Netns, url(inet4, 80))
	wantBody(t, "kept sandbox to the internet", body, err, "inet "+uplink4)
	// A pool's own warm entries survive its Manager's sweep.
	pool := warmPool(t, m2, 2)
	if err := m2.Sweep(ctx, []int{2}); err != nil {
		t.Fatal(err)
	}
	if n := pool.Len(); n != 2 {
		t.Fatalf("pool has %d entries after sweep", n)
	}
	b, err := pool.Get(ctx, 4, egress.Policy{})
	if err != nil {
		t.Fatalf("Get after sweep: %v", err)
	}
	body, err = get(b.Netns, url(inet6, 80))
	wantBody(t, "pool sandbox to the internet after sweep", body, err, "inet "+uplink6)
	m2.Release(ctx, 4)
	m2.Release(ctx, 2)
}

func TestPool(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	pool := warmPool(t, m, 3)
	for slot := 10; slot < 15; slot++ { // more than the pool holds
		a, err := pool.Get(ctx, slot, egress.Policy{})
		if err != nil {
			t.Fatalf("Get(%d): %v", slot, err)
		}
		body, err := get(a.Netns, url(inet4, 80))
		wantBody(t, "pool sandbox to the internet", body, err, "inet "+uplink4)
	}
	if _, err := pool.Get(ctx, 10, egress.Policy{}); err == nil {
		t.Error("Get of an attached slot: no error")
	}
	if _, err := pool.Get(ctx, -1, egress.Policy{}); err == nil {
		t.Error("Get of slot -1: no error")
	}
	waitLen(t, pool, 3)
	for slot := 10; slot < 15; slot++ {
		if err := m.Release(ctx, slot); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewRefusesOverlappingSubnet(t *testing.T) {
	tp := newTopology(t, Config{})
	cfg := tp.m.cfg
	cfg.Bridge = tp.id + "x"
	cfg.Subnet4 = netip.MustParsePrefix("198.51.100.0/25") // the uplink's
	cfg.Subnet6 = netip.Prefix{}                           // derived from the new name
	if m, err := New(cfg); err == nil {
		m.Teardown(context.Background())
		m.Close()
		t.Fatal("New with a subnet the host routes elsewhere: no error")
	}
	if _, err := tp.hostHandle.LinkByName(cfg.Bridge); err == nil {
		t.Error("refused bridge was made")
	}
}

// TestAttachOverCrashLeftovers: a crash between making a slot's namespace and
// its veth can leave either; attaching the slot again works regardless, and
// a slot whose namespace file exists is refused rather than taken over.
func TestAttachOverCrashLeftovers(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	stale := &netlink.Veth{LinkAttrs: netlink.NewLinkAttrs(), PeerName: tp.id + "p"}
	stale.Name = m.cfg.slotName(12)
	if err := tp.hostHandle.LinkAdd(stale); err != nil {
		t.Fatal(err)
	}
	a, err := m.Attach(ctx, 12, egress.Policy{})
	if err != nil {
		t.Fatalf("Attach over a stale link: %v", err)
	}
	body, err := get(a.Netns, url(inet4, 80))
	wantBody(t, "sandbox to the internet", body, err, "inet "+uplink4)
	if _, err := m.Attach(ctx, 12, egress.Policy{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Attach: %v, want ErrConflict", err)
	}
	body, err = get(a.Netns, url(inet4, 80))
	wantBody(t, "sandbox to the internet after a refused Attach", body, err, "inet "+uplink4)
	if err := m.Release(ctx, 12); err != nil {
		t.Fatal(err)
	}
	if c := takeCensus(t, tp, 12); c != (census{}) {
		t.Errorf("after release: %+v", c)
	}
}

var rogueRAPrefix = netip.MustParsePrefix("2001:db8:bad::/64")

// sendRA multicasts a router advertisement for a default route and the
// prefix rogueRAPrefix on eth0 of the namespace at path.
func sendRA(path string) error {
	ra := []byte{
		134, 0, 0, 0, // type, code, checksum (the kernel fills it in)
		64, 0, 0x07, 0x08, // hop limit, flags, router lifetime 1800 s
		0, 0, 0, 0, 0, 0, 0, 0, // reachable time, retransmission timer
		3, 4, 64, 0xc0, // prefix information: on-link, autonomous
		0, 1, 0x51, 0x80, 0, 0, 0x38, 0x40, 0, 0, 0, 0, // lifetimes, reserved
	}
	prefix := rogueRAPrefix.Addr().As16()
	ra = append(ra, prefix[:]...)
	return netns.Run(path, func() error {
		c, err := net.ListenPacket("ip6:ipv6-icmp", "::")
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.(*net.IPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255)
		})
		if serr != nil {
			return serr
		}
		_, err = c.WriteTo(ra, &net.IPAddr{IP: net.ParseIP("ff02::1"), Zone: "eth0"})
		return err
	})
}

// TestConcurrentAttach: attaching runs concurrently for different slots, and
// of two attaches of one slot exactly one wins without hurting the other.
func TestConcurrentAttach(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	pool := warmPool(t, m, 2)
	type result struct {
		a   *Attachment
		err error
	}
	results := make(chan result, 8)
	for i := 0; i < 8; i++ {
		slot := 20 + i%4
		go func() {
			var r result
			if i%2 == 0 {
				r.a, r.err = pool.Get(ctx, slot, egress.Policy{})
			} else {
				r.a, r.err = m.Attach(ctx, slot, egress.Policy{})
			}
			if r.err != nil {
				r.a = &Attachment{Slot: slot}
			}
			results <- r
		}()
	}
	won := map[int]*Attachment{}
	for i := 0; i < 8; i++ {
		r := <-results
		switch {
		case r.err == nil:
			if won[r.a.Slot] != nil {
				t.Errorf("slot %d attached twice", r.a.Slot)
			}
			won[r.a.Slot] = r.a
		case !errors.Is(r.err, errdefs.ErrConflict):
			t.Errorf("slot %d: %v, want success or ErrConflict", r.a.Slot, r.err)
		}
	}
	for slot := 20; slot < 24; slot++ {
		a := won[slot]
		if a == nil {
			t.Errorf("slot %d: no attach won", slot)
			continue
		}
		body, err := get(a.Netns, url(inet4, 80))
		wantBody(t, "sandbox to the internet", body, err, "inet "+uplink4)
		if err := m.Release(ctx, slot); err != nil {
			t.Error(err)
		}
	}
	if c := takeCensus(t, tp, 20, 21, 22, 23); c != (census{}) {
		t.Errorf("after release: %+v", c)
	}
}
