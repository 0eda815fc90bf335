package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/atoll-dev/atoll/internal/egress"
)

// The sandboxes' resolver listens on the gateway addresses, port 53, UDP
// and TCP. It knows a sandbox by its source address. Under allow-all it
// forwards every question to the upstream servers; under deny-all it
// forwards only questions for names the policy allows, adds the addresses
// of their answers to the sandbox's resolved sets for as long as the answers
// live, and answers NXDOMAIN for every other name, so that a sandbox cannot
// learn addresses, or leak data in questions, beyond its policy.

// upstreamTimeout bounds one question to one upstream server.
const upstreamTimeout = 2 * time.Second

// Listen opens the resolver and the egress proxy on the gateway addresses
// in the host namespace; Run serves them. Without Listen, sandboxes get no
// answers to their questions, and connections the firewall sends to the
// proxy are refused.
func (m *Manager) Listen() (err error) {
	defer func() {
		if err != nil {
			m.closeListeners()
		}
	}()
	m.upstream = m.cfg.Upstream
	if len(m.upstream) == 0 {
		m.upstream = readResolvConf("/etc/resolv.conf")
	}
	if len(m.upstream) == 0 {
		m.log.Warn("no upstream DNS servers: sandboxes' names will not resolve", "op", "resolver")
	}
	for _, gw := range []netip.Addr{m.cfg.gateway4(), m.cfg.gateway6()} {
		addr := netip.AddrPortFrom(gw, 53).String()
		err := m.inHost(func() error {
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return fmt.Errorf("resolver: %w", err)
			}
			m.dns = append(m.dns, &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(m.serveDNS)})
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("resolver: %w", err)
			}
			m.dns = append(m.dns, &dns.Server{Listener: ln, Handler: dns.HandlerFunc(m.serveDNS),
				ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
			pl, err := net.Listen("tcp", netip.AddrPortFrom(gw, m.cfg.ProxyPort).String())
			if err != nil {
				return fmt.Errorf("egress proxy: %w", err)
			}
			m.proxyL = append(m.proxyL, pl)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) closeListeners() {
	for _, s := range m.dns {
		if s.PacketConn != nil {
			s.PacketConn.Close()
		}
		if s.Listener != nil {
			s.Listener.Close()
		}
	}
	for _, l := range m.proxyL {
		l.Close()
	}
}

// Run serves the resolver and the egress proxy that Listen opened until ctx
// ends.
func (m *Manager) Run(ctx context.Context) error {
	if len(m.dns) == 0 && len(m.proxyL) == 0 {
		return errors.New("network: Run before Listen")
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(m.dns)+len(m.proxyL))
	for _, s := range m.dns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.ActivateAndServe(); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("resolver: %w", err)
			}
		}()
	}
	var conns sync.WaitGroup
	for _, l := range m.proxyL {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
						errc <- fmt.Errorf("egress proxy: %w", err)
					}
					return
				}
				conns.Add(1)
				go func() {
					defer conns.Done()
					m.proxy(ctx, c.(*net.TCPConn))
				}()
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, s := range m.dns {
		s.Shutdown()
	}
	for _, l := range m.proxyL {
		l.Close()
	}
	wg.Wait()
	// Proxied connections end with the sandboxes' slots or by themselves;
	// the Manager's Close does not cut them, but Run's caller is told only
	// once they are gone.
	m.slotsMu.Lock()
	for _, st := range m.slots {
		st.closeConns()
	}
	m.slotsMu.Unlock()
	conns.Wait()
	return err
}

// readResolvConf returns the nameservers of a resolv.conf, port 53.
func readResolvConf(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(fields[1]); err == nil && a.Zone() == "" {
			out = append(out, netip.AddrPortFrom(a.Unmap(), 53))
		}
	}
	return out
}

func (m *Manager) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	reply := func(rcode int) {
		r := new(dns.Msg)
		r.SetRcode(req, rcode)
		r.RecursionAvailable = true
		w.WriteMsg(r)
	}
	src, ok := addrOf(w.RemoteAddr())
	slot, known := 0, false
	if ok {
		slot, known = m.cfg.slotOf(src)
	}
	if !known {
		reply(dns.RcodeRefused)
		return
	}
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		reply(dns.RcodeFormatError)
		return
	}
	q := req.Question[0]
	name := egress.Canonical(q.Name)
	m.slotsMu.Lock()
	st := m.slots[slot]
	var pol egress.Policy
	polKnown := false
	if st != nil {
		pol, polKnown = st.pol, st.known
	}
	m.slotsMu.Unlock()
	switch {
	case st == nil:
		reply(dns.RcodeRefused)
		return
	case !polKnown:
		// Found attached at start-up, policy not yet set again.
		reply(dns.RcodeServerFailure)
		return
	case q.Qclass != dns.ClassINET || !pol.AllowsName(name):
		reply(dns.RcodeNameError)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*upstreamTimeout)
	defer cancel()
	fwd := req.Copy()
	fwd.Id = dns.Id()
	resp, err := m.exchange(ctx, fwd)
	if err != nil {
		m.log.Debug("resolving", "slot", slot, "op", "resolver", "err", err)
		reply(dns.RcodeServerFailure)
		return
	}
	resp.Id = req.Id
	if pol.HasNames() {
		var addrs []netip.Addr
		ttl := maxResolved
		for _, rr := range resp.Answer {
			var ip net.IP
			switch rr := rr.(type) {
			case *dns.A:
				ip = rr.A
			case *dns.AAAA:
				ip = rr.AAAA
			default:
				continue
			}
			if a, ok := netip.AddrFromSlice(ip); ok {
				addrs = append(addrs, a.Unmap())
				ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
			}
		}
		if len(addrs) > 0 {
			answerTTL, ok, err := m.addResolved(slot, name, addrs, ttl)
			switch {
			case err != nil:
				m.log.Warn("resolver", "slot", slot, "op", "resolver", "err", err)
				reply(dns.RcodeServerFailure)
				return
			case !ok:
				reply(dns.RcodeNameError)
				return
			}
			for _, rr := range resp.Answer {
				rr.Header().Ttl = min(rr.Header().Ttl, uint32(answerTTL/time.Second))
			}
		}
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

// exchange asks the upstream servers in turn, over UDP and, for a truncated
// answer, TCP.
func (m *Manager) exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	if len(m.upstream) == 0 {
		return nil, errors.New("no upstream DNS servers")
	}
	var errs []error
	for _, up := range m.upstream {
		for _, network := range []string{"udp", "tcp"} {
			resp, err := m.exchangeWith(ctx, network, up, req)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if resp.Truncated && network == "udp" {
				continue
			}
			if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
				errs = append(errs, fmt.Errorf("%s answered %s", up, dns.RcodeToString[resp.Rcode]))
				break
			}
			return resp, nil
		}
	}
	return nil, errors.Join(errs...)
}

func (m *Manager) exchangeWith(ctx context.Context, network string, up netip.AddrPort, req *dns.Msg) (*dns.Msg, error) {
	var conn net.Conn
	err := m.inHost(func() (err error) {
		d := net.Dialer{Timeout: upstreamTimeout}
		conn, err = d.DialContext(ctx, network, up.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	c := &dns.Client{Net: network, Timeout: upstreamTimeout, UDPSize: dns.DefaultMsgSize}
	resp, _, err := c.ExchangeWithConnContext(ctx, req, &dns.Conn{Conn: conn, UDPSize: dns.DefaultMsgSize})
	return resp, err
}

// lookup resolves name's A and AAAA records upstream, for the egress proxy.
func (m *Manager) lookup(ctx context.Context, name string) []netip.Addr {
	var out []netip.Addr
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), t)
		resp, err := m.exchange(ctx, q)
		if err != nil {
			continue
		}
		for _, rr := range resp.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				if a, ok := netip.AddrFromSlice(rr.A); ok {
					out = append(out, a.Unmap())
				}
			case *dns.AAAA:
				if a, ok := netip.AddrFromSlice(rr.AAAA); ok {
					out = append(out, a.Unmap())
				}
			}
		}
	}
	return out
}

func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	}
	return netip.Addr{}, false
}
