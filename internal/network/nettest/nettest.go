// Package nettest builds private networks of network namespaces for tests,
// so that nothing of the real host's network is touched: namespaces linked
// by veths, and test hosts in them serving HTTP, HTTPS, TCP echo and DNS on
// public-looking documentation addresses (198.51.100.0/24, 2001:db8::/64).
package nettest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/netns"
)

// Dir is where the namespaces are bind-mounted.
const Dir = "/run/netns"

// In runs fn on a thread that has joined the network namespace at path.
func In(path string, fn func() error) error { return netns.Run(path, fn) }

// NewNetns makes a namespace named name under Dir with lo up, removed when
// t ends.
func NewNetns(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(Dir, name)
	// Shared, as atoll serve (and iproute2) makes it: were it made so
	// after this namespace is bound there, by a server the test starts,
	// the binding would be hidden under the new mount and outlive the test.
	if err := netns.PrepareDir(Dir); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// This thread's namespace is never restored: it ends with the
		// goroutine, still locked.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			errc <- err
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		t.Fatalf("making namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
	})
	return path
}

// Link connects namespace a to b with a veth: link aName in a with aAddrs,
// bName in b with bAddrs (prefixes such as "198.51.100.1/24").
func Link(t testing.TB, a, aName string, aAddrs []string, b, bName string, bAddrs []string, mtu int) {
	t.Helper()
	bfd, err := unix.Open(b, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(bfd)
	err = In(a, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = aName, mtu
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: bName, PeerNamespace: netlink.NsFd(bfd)})
	})
	if err != nil {
		t.Fatalf("veth %s: %v", aName, err)
	}
	configure := func(path, link string, addrs []string) {
		err := In(path, func() error {
			l, err := netlink.LinkByName(link)
			if err != nil {
				return err
			}
			for _, s := range addrs {
				p := netip.MustParsePrefix(s)
				ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
					return fmt.Errorf("%s: %w", s, err)
				}
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatalf("configuring %s: %v", link, err)
		}
	}
	configure(a, aName, aAddrs)
	configure(b, bName, bAddrs)
}

// DefaultRoutes routes everything from namespace path through link to the
// gateways gws.
func DefaultRoutes(t testing.TB, path, link string, gws ...string) {
	t.Helper()
	err := In(path, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		for _, gw := range gws {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Listen listens on addr inside the namespace at path until t ends.
func Listen(t testing.TB, path, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := In(path, func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ServeHTTP answers "<name> <client address> <host>" on addr inside path;
// with tls, over TLS with a self-signed certificate for any name.
func ServeHTTP(t testing.TB, path, name, addr string, useTLS bool) {
	t.Helper()
	ln := Listen(t, path, "tcp", addr)
	if useTLS {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s %s %s", name, netip.MustParseAddr(host).Unmap(), r.Host)
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
}

// ServeEcho echoes what each connection on addr inside path sends.
func ServeEcho(t testing.TB, path, addr string) {
	t.Helper()
	ServeTCP(t, path, addr, func(c net.Conn) { io.Copy(c, c) })
}

// ServeBulk moves bulk data on addr inside path, for throughput: a
// connection that sends "down N\n" gets N bytes and EOF; one that sends
// "up\n" and then data gets the number of bytes it sent, in decimal, once
// it has shut down its side.
func ServeBulk(t testing.TB, path, addr string) {
	t.Helper()
	ServeTCP(t, path, addr, func(c net.Conn) {
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		var n int64
		switch {
		case line == "up\n":
			n, _ = io.Copy(io.Discard, r)
			fmt.Fprint(c, n)
		case strings.HasPrefix(line, "down "):
			if n, err = strconv.ParseInt(strings.TrimSpace(line[5:]), 10, 64); err == nil {
				io.CopyN(c, zeros{}, n)
			}
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// ServeTCP runs handle for each connection on addr inside path, and closes
// the connection after it, until t ends.
func ServeTCP(t testing.TB, path, addr string, handle func(net.Conn)) {
	t.Helper()
	ln := Listen(t, path, "tcp", addr)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); handle(c); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// DNS is a test DNS server: it answers A and AAAA questions for the names of
// Records and NXDOMAIN for others, and remembers every name it was asked.
type DNS struct {
	Records map[string][]netip.Addr // canonical name -> addresses
	TTL     uint32

	mu    sync.Mutex
	asked []string
}

// Asked lists the names the server was asked, in order.
func (d *DNS) Asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.asked...)
}

// WasAsked reports whether the server was asked name.
func (d *DNS) WasAsked(name string) bool {
	for _, n := range d.Asked() {
		if n == name {
			return true
		}
	}
	return false
}

// ServeDNS serves d on UDP and TCP addr inside path.
func ServeDNS(t testing.TB, path, addr string, d *DNS) {
	t.Helper()
	var pc net.PacketConn
	if err := In(path, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	ln := Listen(t, path, "tcp", addr)
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(req)
		if len(req.Question) != 1 {
			r.Rcode = dns.RcodeFormatError
			w.WriteMsg(r)
			return
		}
		q := req.Question[0]
		name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
		d.mu.Lock()
		d.asked = append(d.asked, name)
		d.mu.Unlock()
		addrs, ok := d.Records[name]
		if !ok {
			r.Rcode = dns.RcodeNameError
			w.WriteMsg(r)
			return
		}
		ttl := d.TTL
		if ttl == 0 {
			ttl = 300
		}
		for _, a := range addrs {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: ttl}
			switch {
			case a.Is4() && q.Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				r.Answer = append(r.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case a.Is6() && q.Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				r.Answer = append(r.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		w.WriteMsg(r)
	})
	servers := []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() { defer wg.Done(); s.ActivateAndServe() }()
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
		pc.Close()
		wg.Wait()
	})
}

func selfSigned(t testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "atoll test"},
		DNSNames:  []string{"*"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
