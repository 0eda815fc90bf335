package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/network/nettest"
)

// Addresses of the internet host's extra names (see internet).
const (
	allowedA4, allowedA6 = "198.51.100.11", "2001:db8::11" // allowed.example, secret.example
	otherA4, otherA6     = "198.51.100.12", "2001:db8::12" // other.example
	wildA4, wildA6       = "198.51.100.13", "2001:db8::13" // x.wild.example, wild.example
)

// internet gives the topology's internet host more addresses, a DNS server
// for the names above, HTTPS on 443 and a TCP echo on 7; its HTTP on 80
// answers on every address.
func (tp *topology) internet(t testing.TB) *nettest.DNS {
	t.Helper()
	err := netns.Run(tp.inet, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range []string{allowedA4 + "/24", otherA4 + "/24", wildA4 + "/24", allowedA6 + "/64", otherA6 + "/64", wildA6 + "/64"} {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(a)), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	d := &nettest.DNS{TTL: 2, Records: map[string][]netip.Addr{
		"allowed.example": {netip.MustParseAddr(allowedA4), netip.MustParseAddr(allowedA6)},
		"secret.example":  {netip.MustParseAddr(allowedA4), netip.MustParseAddr(allowedA6)},
		"other.example":   {netip.MustParseAddr(otherA4), netip.MustParseAddr(otherA6)},
		"x.wild.example":  {netip.MustParseAddr(wildA4), netip.MustParseAddr(wildA6)},
		"wild.example":    {netip.MustParseAddr(wildA4), netip.MustParseAddr(wildA6)},
	}}
	nettest.ServeDNS(t, tp.inet, "[::]:53", d)
	nettest.ServeHTTP(t, tp.inet, "inet-tls", "[::]:443", true)
	nettest.ServeEcho(t, tp.inet, "[::]:7")
	return d
}

func mustPolicy(t testing.TB, p api.NetworkPolicy) egress.Policy {
	t.Helper()
	pol, err := egress.Parse(&p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// resolveIn asks server, from inside path, for name's records of type qtype.
func resolveIn(path, server, name string, qtype uint16) (int, []netip.Addr, error) {
	c, err := dialIn(path, "udp", net.JoinHostPort(server, "53"))
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).ExchangeWithConn(q, &dns.Conn{Conn: c})
	if err != nil {
		return 0, nil, err
	}
	var addrs []netip.Addr
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(rr.A)
			addrs = append(addrs, a.Unmap())
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA)
			addrs = append(addrs, a)
		}
	}
	return resp.Rcode, addrs, nil
}

// httpHost sends one GET to addr from path with Host host; with sni, over
// TLS with that server name. It returns the status and body.
func httpHost(path, addr, host, sni string) (int, string, error) {
	c, err := dialIn(path, "tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if sni != "" {
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return 0, "", err
		}
		c = tc
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func wantOK(t testing.TB, what string, status int, body string, err error) {
	t.Helper()
	if err != nil || status != 200 {
		t.Errorf("%s: status %d, %v (%q), want 200", what, status, err, body)
	}
}

func wantRefused(t testing.TB, what string, status int, body string, err error) {
	t.Helper()
	if err == nil && status == 200 {
		t.Errorf("%s: 200 %q, want refused", what, body)
	}
}

// TestEgressPolicy checks the egress policies of package egress as the
// firewall, the resolver and the egress proxy enforce them, each refusal
// after a positive control.
func TestEgressPolicy(t *testing.T) {
	tp := newTopology(t, Config{Upstream: []netip.AddrPort{netip.MustParseAddrPort(inet4 + ":53")}})
	m := tp.m
	ups := tp.internet(t)
	if err := m.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	list := mustPolicy(t, api.NetworkPolicy{Egress: egress.DenyAll,
		Allow: []string{"allowed.example", "*.wild.example", inet4, "2001:db8::1", metadata4, private4}})
	attach := func(slot int, pol egress.Policy) *Attachment {
		a, err := m.Attach(ctx, slot, pol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Release(context.Background(), slot) })
		return a
	}
	sbList := attach(1, list)
	sbDeny := attach(2, mustPolicy(t, api.NetworkPolicy{Egress: egress.DenyAll}))
	sbOpen := attach(3, mustPolicy(t, api.NetworkPolicy{Deny: []string{otherA4, otherA6 + "/128"}}))
	gw4, gw6 := sbList.Gateway4.String(), sbList.Gateway6.String()

	t.Run("positive controls", func(t *testing.T) {
		for _, name := range []string{"allowed.example", "other.example", "secret.example", "wild.example"} {
			rc, addrs, err := resolveIn(tp.host, inet4, name, dns.TypeA)
			if err != nil || rc != dns.RcodeSuccess || len(addrs) == 0 {
				t.Errorf("host resolving %s upstream: %d %v %v", name, rc, addrs, err)
			}
		}
		for _, ad := range []string{allowedA4, otherA4, wildA4, allowedA6, otherA6, wildA6, inet4} {
			st, body, err := httpHost(tp.host, hostport(ad, 80), "x", "")
			wantOK(t, "host to "+ad, st, body, err)
		}
		st, body, err := httpHost(tp.host, hostport(allowedA4, 443), "secret.example", "secret.example")
		wantOK(t, "host to https with SNI secret.example", st, body, err)
		// Allow-all with a deny list: everything else answers.
		rc, addrs, err := resolveIn(sbOpen.Netns, gw4, "other.example", dns.TypeA)
		if err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 {
			t.Errorf("allow-all sandbox resolving other.example: %d %v %v", rc, addrs, err)
		}
		for _, ad := range []string{allowedA4, allowedA6, wildA4, inet4} {
			st, body, err := httpHost(sbOpen.Netns, hostport(ad, 80), "any.example", "")
			wantOK(t, "allow-all sandbox to "+ad, st, body, err)
		}
	})

	t.Run("deny list", func(t *testing.T) {
		for _, ad := range []string{otherA4, otherA6} {
			_, err := dialIn(sbOpen.Netns, "tcp", hostport(ad, 80))
			mustNotReach(t, "allow-all sandbox to denied "+ad, err)
			if err != nil && !isRefused(err) {
				t.Errorf("denied %s: %v, want a quick refusal", ad, err)
			}
		}
	})

	t.Run("deny-all", func(t *testing.T) {
		for _, name := range []string{"allowed.example", "other.example"} {
			rc, addrs, err := resolveIn(sbDeny.Netns, gw4, name, dns.TypeA)
			if err != nil || rc != dns.RcodeNameError || len(addrs) > 0 {
				t.Errorf("deny-all resolving %s: rcode %d %v %v, want NXDOMAIN", name, rc, addrs, err)
			}
		}
		for _, ad := range []string{allowedA4, allowedA6, inet4, inet6} {
			_, err := dialIn(sbDeny.Netns, "tcp", hostport(ad, 80))
			mustNotReach(t, "deny-all sandbox to "+ad, err)
		}
	})

	t.Run("allow list", func(t *testing.T) {
		// Before resolving, the allowed name's addresses are closed.
		_, err := dialIn(sbList.Netns, "tcp", hostport(allowedA4, 7))
		mustNotReach(t, "allowed name's address before resolving it", err)
		for _, q := range []struct {
			name   string
			server string
			qtype  uint16
			want   string
		}{
			{"allowed.example", gw4, dns.TypeA, allowedA4},
			{"ALLOWED.example.", gw6, dns.TypeAAAA, allowedA6},
			{"x.wild.example", gw4, dns.TypeA, wildA4},
			{"x.wild.example", gw4, dns.TypeAAAA, wildA6},
		} {
			rc, addrs, err := resolveIn(sbList.Netns, q.server, q.name, q.qtype)
			if err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0].String() != q.want {
				t.Errorf("resolving %s via %s: %d %v %v, want %s", q.name, q.server, rc, addrs, err, q.want)
			}
		}
		for _, name := range []string{"other.example", "secret.example", "wild.example", "leak-" + tp.id + ".example"} {
			rc, _, err := resolveIn(sbList.Netns, gw4, name, dns.TypeA)
			if err != nil || rc != dns.RcodeNameError {
				t.Errorf("resolving unlisted %s: rcode %d %v, want NXDOMAIN", name, rc, err)
			}
		}
		if ups.WasAsked("leak-" + tp.id + ".example") {
			t.Error("the resolver asked upstream about a name the policy does not allow")
		}
		// Now the allowed names' addresses answer, on any port; the others
		// do not.
		for _, ad := range []string{allowedA4, allowedA6, wildA4, wildA6} {
			mustReach(t, "echo on allowed "+ad, echo(sbList.Netns, hostport(ad, 7)))
			st, body, err := httpHost(sbList.Netns, hostport(ad, 80), map[bool]string{true: "allowed.example", false: "x.wild.example"}[ad == allowedA4 || ad == allowedA6], "")
			wantOK(t, "http to allowed "+ad, st, body, err)
		}
		for _, ad := range []string{otherA4, otherA6} {
			_, err := dialIn(sbList.Netns, "tcp", hostport(ad, 7))
			mustNotReach(t, "unresolved "+ad, err)
			st, body, err := httpHost(sbList.Netns, hostport(ad, 80), "other.example", "")
			wantRefused(t, "http to unresolved "+ad, st, body, err)
		}
		// Addresses allowed as such need no name, and pass the proxy unread.
		for _, ad := range []string{inet4, inet6} {
			mustReach(t, "echo on allowed address "+ad, echo(sbList.Netns, hostport(ad, 7)))
			st, body, err := httpHost(sbList.Netns, hostport(ad, 80), "anything.example", "")
			wantOK(t, "http to allowed address "+ad, st, body, err)
		}
		// Metadata and private addresses stay blocked whatever the policy.
		for _, ad := range []string{metadata4, private4} {
			body, err := get(tp.host, url(ad, 80))
			wantBody(t, "positive control: host to "+ad, body, err, "lan "+hostAddrOnLan(ad))
			_, err = get(sbList.Netns, url(ad, 80))
			mustNotReach(t, "allow-listed blocked "+ad, err)
		}
	})

	t.Run("fronting", func(t *testing.T) {
		for _, ad := range []string{allowedA4, allowedA6} {
			st, body, err := httpHost(sbList.Netns, hostport(ad, 80), "allowed.example", "")
			wantOK(t, "positive control: Host allowed.example", st, body, err)
			st, body, err = httpHost(sbList.Netns, hostport(ad, 80), "secret.example", "")
			wantRefused(t, "Host secret.example on "+ad, st, body, err)
			if err == nil && st != http.StatusForbidden {
				t.Errorf("Host secret.example: status %d, want 403", st)
			}
			st, body, err = httpHost(sbList.Netns, hostport(ad, 443), "allowed.example", "allowed.example")
			wantOK(t, "positive control: SNI allowed.example", st, body, err)
			st, body, err = httpHost(sbList.Netns, hostport(ad, 443), "secret.example", "secret.example")
			wantRefused(t, "SNI secret.example on "+ad, st, body, err)
			st, body, err = httpHost(sbList.Netns, hostport(ad, 443), "secret.example", "allowed.example")
			if err == nil && st == 200 && !strings.Contains(body, "secret.example") {
				t.Errorf("SNI allowed.example, Host secret.example: %q", body)
			}
			// An allowed name that resolves elsewhere does not open this
			// address either.
			st, body, err = httpHost(sbList.Netns, hostport(ad, 80), "x.wild.example", "")
			wantRefused(t, "Host x.wild.example on "+ad, st, body, err)
		}
		// A second request on a kept-alive connection is checked too.
		c := mustDial(t, sbList.Netns, "tcp", hostport(allowedA4, 80))
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("first request: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: secret.example\r\n\r\n")
		if resp, err := http.ReadResponse(br, nil); err == nil && resp.StatusCode == 200 {
			t.Error("second request for secret.example on a kept-alive connection: 200")
		}
		// The proxy port itself is closed to sandboxes.
		for _, gw := range []string{gw4, gw6} {
			_, err := dialIn(sbList.Netns, "tcp", hostport(gw, int(m.cfg.ProxyPort)))
			mustNotReach(t, "direct connection to the proxy port", err)
		}
	})

	t.Run("policy change cuts connections", func(t *testing.T) {
		// sbOpen (allow-all) and sbList (inet4 allowed by address) each hold
		// a connection to the echo server on inet4.
		cOpen := mustDial(t, sbOpen.Netns, "tcp", hostport(inet4, 7))
		cList := mustDial(t, sbList.Netns, "tcp", hostport(inet4, 7))
		// And a kept-alive proxied connection.
		cProx := mustDial(t, sbList.Netns, "tcp", hostport(allowedA4, 80))
		cProx.SetDeadline(time.Now().Add(5 * time.Second))
		bp := bufio.NewReader(cProx)
		fmt.Fprintf(cProx, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		if resp, err := http.ReadResponse(bp, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("proxied request: %v %v", resp, err)
		} else {
			io.Copy(io.Discard, resp.Body)
		}
		for _, c := range []net.Conn{cOpen, cList} {
			if err := roundTrip(c, "before"); err != nil {
				t.Fatalf("positive control: %v", err)
			}
		}
		// sbOpen becomes deny-all; sbList loses inet4 and allowed.example
		// but keeps *.wild.example.
		if err := m.SetPolicy(ctx, sbOpen.Slot, mustPolicy(t, api.NetworkPolicy{Egress: egress.DenyAll})); err != nil {
			t.Fatal(err)
		}
		if err := m.SetPolicy(ctx, sbList.Slot, mustPolicy(t, api.NetworkPolicy{Allow: []string{"*.wild.example", "2001:db8::1"}})); err != nil {
			t.Fatal(err)
		}
		for name, c := range map[string]net.Conn{"allow-all to deny-all": cOpen, "address no longer allowed": cList} {
			if err := roundTrip(c, "after"); err == nil {
				t.Errorf("%s: the connection still works", name)
			}
		}
		fmt.Fprintf(cProx, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		if resp, err := http.ReadResponse(bp, nil); err == nil {
			t.Errorf("proxied connection after its name was dropped: %d", resp.StatusCode)
		}
		// What the new policies allow still works: a wild name's address
		// stays resolved, a new connection to inet6 opens.
		mustReach(t, "kept resolved address", echo(sbList.Netns, hostport(wildA4, 7)))
		mustReach(t, "still allowed address", echo(sbList.Netns, hostport(inet6, 7)))
		_, err := dialIn(sbList.Netns, "tcp", hostport(allowedA4, 7))
		mustNotReach(t, "dropped name's address", err)
		rc, _, err := resolveIn(sbList.Netns, gw4, "allowed.example", dns.TypeA)
		if err != nil || rc != dns.RcodeNameError {
			t.Errorf("dropped name resolves: %d %v", rc, err)
		}
		// Back to allow-all: connections open again.
		if err := m.SetPolicy(ctx, sbOpen.Slot, mustPolicy(t, api.NetworkPolicy{Deny: []string{otherA4, otherA6}})); err != nil {
			t.Fatal(err)
		}
		mustReach(t, "allow-all again", echo(sbOpen.Netns, hostport(inet4, 7)))
	})

	t.Run("restart keeps policies", func(t *testing.T) {
		mustReach(t, "positive control", echo(sbList.Netns, hostport(wildA4, 7)))
		m2, err := New(m.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m2.Close()
		if _, known, err := m2.Policy(sbList.Slot); err != nil || known {
			t.Errorf("policy after restart: known %v, %v", known, err)
		}
		// The kernel holds on to what it had: resolved addresses, the
		// deny-all default.
		mustReach(t, "resolved address after restart", echo(sbList.Netns, hostport(wildA4, 7)))
		_, err = dialIn(sbList.Netns, "tcp", hostport(otherA4, 7))
		mustNotReach(t, "unresolved address after restart", err)
		_, err = dialIn(sbDeny.Netns, "tcp", hostport(inet4, 7))
		mustNotReach(t, "deny-all after restart", err)
		mustReach(t, "allow-all after restart", echo(sbOpen.Netns, hostport(inet4, 7)))
		_, err = dialIn(sbOpen.Netns, "tcp", hostport(otherA4, 7))
		mustNotReach(t, "denied after restart", err)
		// Setting the same policy again keeps the resolved addresses.
		if err := m2.SetPolicy(ctx, sbList.Slot, mustPolicy(t, api.NetworkPolicy{Allow: []string{"*.wild.example", "2001:db8::1"}})); err != nil {
			t.Fatal(err)
		}
		mustReach(t, "resolved address after SetPolicy", echo(sbList.Netns, hostport(wildA4, 7)))
	})

	t.Run("release leaves nothing", func(t *testing.T) {
		before := takeCensus(t, tp, sbList.Slot)
		if before.objects != 7 {
			t.Errorf("before: %+v", before)
		}
		if err := m.Release(ctx, sbList.Slot); err != nil {
			t.Fatal(err)
		}
		if c := takeCensus(t, tp, sbList.Slot); c != (census{}) {
			t.Errorf("after release: %+v", c)
		}
		rc, _, err := resolveIn(sbDeny.Netns, gw4, "allowed.example", dns.TypeA)
		if err != nil || rc != dns.RcodeNameError {
			t.Errorf("the resolver after a release: %d %v", rc, err)
		}
	})
}

// echo sends a line to serveEcho's addr from path and reads it back.
func echo(path, addr string) error {
	c, err := dialIn(path, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, "hello")
}

func roundTrip(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, msg); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != msg+"\n" {
		return errors.New("echo: got " + line)
	}
	return nil
}

// TestRestartManySlots: a new Manager installs the table with every attached
// slot's chain and sets in one batch, hundreds of netlink messages whose
// acknowledgements must all fit its socket's receive buffer.
func TestRestartManySlots(t *testing.T) {
	tp := newTopology(t, Config{Logger: discard()})
	m := tp.m
	ctx := context.Background()
	const n = 120
	pol := mustPolicy(t, api.NetworkPolicy{Allow: []string{"example.com", inet4}, Deny: []string{"198.51.100.128/25"}})
	for slot := 0; slot < n; slot++ {
		if _, err := m.Attach(ctx, slot, pol); err != nil {
			t.Fatalf("Attach(%d): %v", slot, err)
		}
	}
	t.Cleanup(func() { m.Sweep(context.Background(), nil) })
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatalf("New with %d attached slots: %v", n, err)
	}
	defer m2.Close()
	if c := takeCensus(t, tp, 0, n-1); c.objects != 14 || c.elements != 8 {
		t.Errorf("after restart: %+v", c)
	}
	a, err := m2.Lookup(n - 1)
	if err != nil {
		t.Fatal(err)
	}
	nettest.ServeEcho(t, tp.inet, "[::]:7")
	mustReach(t, "allowed address after restart", echo(a.Netns, hostport(inet4, 7)))
	_, err = dialIn(a.Netns, "tcp", hostport(inet6, 7))
	mustNotReach(t, "address not allowed after restart", err)
}
