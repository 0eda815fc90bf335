package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// A topology is a private network for one test, made of namespaces so that
// nothing of the real host is touched:
//
//	host    plays the host: the Manager's bridge, table and forwarding live
//	        here; its uplink "up0" (198.51.100.2/24, 2001:db8::2/64, MTU
//	        1450) carries its default routes, and "lan0" leads to lan.
//	inet    an "internet" host: 198.51.100.1 and 2001:db8::1, with no route
//	        to the sandboxes' subnets, so replies only come back through NAT.
//	lan     addresses that sandboxes must not reach, reachable from host:
//	        169.254.169.254, fd00:ec2::254, 10.99.0.1 (RFC 1918), and
//	        192.168.77.1 (RFC 1918, which the tests' Config allows).
//
// inet and lan serve HTTP on port 80, answering "<name> <client address>".
type topology struct {
	id         string // unique per topology; the bridge's name
	host       string // namespace paths
	inet, lan  string
	m          *Manager
	hostHandle *netlink.Handle
}

const (
	inet4       = "198.51.100.1"
	inet6       = "2001:db8::1"
	uplink4     = "198.51.100.2"
	uplink6     = "2001:db8::2"
	metadata4   = "169.254.169.254"
	metadata6   = "fd00:ec2::254"
	private4    = "10.99.0.1"
	allowed4    = "192.168.77.1"
	uplinkMTU   = 1450
	testNetnsIn = "/run/netns"
)

var allowedPrefix = netip.MustParsePrefix("192.168.77.0/24")

func uniqueID(t testing.TB) string {
	b := make([]byte, 3)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// newTopology builds the test network and a Manager in it; cfg's Bridge and
// HostNetns are filled in. Everything goes away when t ends.
func newTopology(t testing.TB, cfg Config) *topology {
	t.Helper()
	testenv.RequireRoot(t)
	if err := Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	if err := netns.PrepareDir(testNetnsIn); err != nil {
		t.Fatal(err)
	}
	tp := &topology{id: uniqueID(t)}
	mk := func(role string) string {
		p := filepath.Join(testNetnsIn, "atollt-"+tp.id+"-"+role)
		if err := netns.Create(p, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(lo)
		}); err != nil {
			t.Fatalf("making %s namespace: %v", role, err)
		}
		t.Cleanup(func() { netns.Remove(p) })
		return p
	}
	tp.host, tp.inet, tp.lan = mk("host"), mk("inet"), mk("lan")
	fd, err := unix.Open(tp.host, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	tp.hostHandle, err = netlink.NewHandleAt(vnetns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.hostHandle.Close)

	tp.link(t, "up0", tp.inet, uplinkMTU,
		[]string{uplink4 + "/24", uplink6 + "/64"},
		[]string{inet4 + "/24", inet6 + "/64"})
	tp.link(t, "lan0", tp.lan, 1500,
		[]string{"169.254.169.1/16", "fd00:ec2::1/64", "10.99.0.2/24", "192.168.77.2/24"},
		[]string{metadata4 + "/16", metadata6 + "/64", private4 + "/24", allowed4 + "/24"})
	// The host's default routes go to the internet host.
	up0, err := tp.hostHandle.LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	for _, gw := range []string{inet4, inet6} {
		if err := tp.hostHandle.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatalf("default route via %s: %v", gw, err)
		}
	}
	serveHTTP(t, tp.inet, "inet", "[::]:80")
	serveHTTP(t, tp.lan, "lan", "[::]:80")

	cfg.Bridge = tp.id
	cfg.HostNetns = tp.host
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	tp.m, err = New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	m := tp.m
	t.Cleanup(func() {
		if err := m.Teardown(context.Background()); err != nil {
			t.Errorf("Teardown: %v", err)
		}
		m.Close()
	})
	return tp
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// link connects the host namespace to peer with a veth: name on the host
// side with hostAddrs, eth0 in peer with peerAddrs.
func (tp *topology) link(t testing.TB, name, peer string, mtu int, hostAddrs, peerAddrs []string) {
	t.Helper()
	fd, err := unix.Open(peer, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = name, mtu
	if err := tp.hostHandle.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(fd)}); err != nil {
		t.Fatalf("veth %s: %v", name, err)
	}
	configure := func(h *netlink.Handle, link string, addrs []string) {
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			p := netip.MustParsePrefix(a)
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatalf("%s %s: %v", link, a, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	configure(tp.hostHandle, name, hostAddrs)
	err = netns.Run(peer, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		configure(h, "eth0", peerAddrs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// serveHTTP answers "<name> <client address>" on addr inside path.
func serveHTTP(t testing.TB, path, name, addr string) net.Listener {
	t.Helper()
	ln := nettest.Listen(t, path, "tcp", addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s %s", name, netip.MustParseAddr(host).Unmap())
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return ln
}

// serveTCP accepts connections on addr inside path and writes "hello" to each.
func serveTCP(t testing.TB, path, addr string) {
	t.Helper()
	nettest.ServeTCP(t, path, addr, func(c net.Conn) { c.Write([]byte("hello")) })
}

// serveUDP echoes datagrams on addr inside path.
func serveUDP(t testing.TB, path, addr string) {
	t.Helper()
	var pc net.PacketConn
	err := netns.Run(path, func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listening on udp %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
}

const dialTimeout = 2 * time.Second

// dialIn connects from inside path.
func dialIn(path, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Run(path, func() (err error) {
		c, err = (&net.Dialer{Timeout: dialTimeout}).Dial(network, addr)
		return err
	})
	return c, err
}

// get fetches url from inside path and returns the body.
func get(path, url string) (string, error) { return getWithin(path, url, 2*dialTimeout) }

// getWithin is get allowing it limit, connecting included.
func getWithin(path, url string, limit time.Duration) (string, error) {
	client := &http.Client{
		Timeout: limit,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialIn(path, network, addr)
			},
		},
	}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// mustDial is dialIn that fails t if it cannot connect; the connection
// closes when t ends.
func mustDial(t testing.TB, path, network, addr string) net.Conn {
	t.Helper()
	c, err := dialIn(path, network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialBrief is dialIn for an exchange that must be over within
// dialTimeout.
func dialBrief(path, network, addr string) (net.Conn, error) {
	c, err := dialIn(path, network, addr)
	if err == nil {
		c.SetDeadline(time.Now().Add(dialTimeout))
	}
	return c, err
}

// tcpHello connects to addr from path and reads the greeting of serveTCP.
func tcpHello(path, addr string) error {
	c, err := dialBrief(path, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "hello" {
		return fmt.Errorf("got %q", b)
	}
	return nil
}

// udpEcho sends a datagram to addr from path and waits for its echo.
func udpEcho(path, addr string) error {
	c, err := dialBrief(path, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "ping" {
		return fmt.Errorf("got %q", buf[:n])
	}
	return nil
}

func hostport(addr string, port int) string {
	return net.JoinHostPort(addr, fmt.Sprint(port))
}

func url(addr string, port int) string { return "http://" + hostport(addr, port) + "/" }

// mustReach fails t unless fn succeeds; mustNotReach fails it unless fn fails.
func mustReach(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: want success, got %v", what, err)
	}
}

func mustNotReach(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: reached, want refused", what)
	}
}

func wantBody(t testing.TB, what, got string, err error, want string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	} else if got != want {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

// isRefused reports whether err is an active refusal (reset or ICMP), as
// the firewall gives, rather than a timeout.
func isRefused(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.EHOSTUNREACH) ||
		errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EACCES)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
