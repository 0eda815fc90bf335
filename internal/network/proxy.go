package network

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
)

// The egress proxy takes the connections to ports 80 and 443 of sandboxes
// whose policy allows names (the firewall sends them here in prerouting) and
// lets one through only if its TLS server name (SNI) or, for plain HTTP, the
// Host of every request on it is a name the policy allows and that name
// resolves to the address the sandbox connected to. So an allowed address
// cannot front a denied name: a CDN's address, allowed because an allowed
// name resolved to it, does not carry requests for the CDN's other names.
// Destinations the policy allows by address pass through unread.

const (
	// helloTimeout bounds the wait for a connection's first request or
	// ClientHello, and maxHello its size.
	helloTimeout = 10 * time.Second
	maxHello     = 64 << 10
	// httpIdle bounds the wait for the next request on a plain HTTP
	// connection.
	httpIdle      = 2 * time.Minute
	upDialTimeout = 10 * time.Second
)

// echExtension is TLS Encrypted Client Hello: it hides the real server name
// behind the outer one, so it cannot be checked and is refused.
const echExtension = 0xfe0d

// proxyConn is one proxied connection.
type proxyConn struct {
	client net.Conn
	dst    netip.Addr
	mu     sync.Mutex
	name   string // the name it was let through for; "" if by address
	up     net.Conn
	closed bool
}

func (c *proxyConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.client.Close()
	if c.up != nil {
		c.up.Close()
	}
}

func (c *proxyConn) setName(n string) {
	c.mu.Lock()
	c.name = n
	c.mu.Unlock()
}

// allowedBy reports whether c may go on under st's policy; the caller
// holds slotsMu.
func (c *proxyConn) allowedBy(st *slotState, now time.Time) bool {
	c.mu.Lock()
	name := c.name
	c.mu.Unlock()
	if st.pol.Denied(c.dst) {
		return false
	}
	if st.pol.AllowsAddr(c.dst) {
		return true
	}
	return name != "" && st.pol.AllowsName(name)
}

// proxy serves one connection the firewall redirected.
func (m *Manager) proxy(ctx context.Context, client *net.TCPConn) {
	defer client.Close()
	src, _ := addrOf(client.RemoteAddr())
	slot, ok := m.cfg.slotOf(src)
	if !ok {
		return
	}
	dst, err := originalDst(client)
	if err != nil {
		m.log.Debug("egress proxy: original destination", "slot", slot, "err", err)
		return
	}
	if local, _ := addrOf(client.LocalAddr()); dst.Addr() == local {
		return // not redirected: someone connected to the proxy port itself
	}
	pc := &proxyConn{client: client, dst: dst.Addr()}
	m.slotsMu.Lock()
	st := m.slots[slot]
	var direct bool
	if st != nil && st.known && !st.pol.Denied(pc.dst) {
		direct = st.pol.AllowsAddr(pc.dst)
		st.conns[pc] = struct{}{}
	} else {
		st = nil
	}
	m.slotsMu.Unlock()
	if st == nil {
		return
	}
	defer func() {
		m.slotsMu.Lock()
		delete(st.conns, pc)
		m.slotsMu.Unlock()
		pc.close()
	}()
	if m.forbiddenDst(dst.Addr()) {
		return
	}
	log := m.log.With("slot", slot, "op", "proxy", "dst", dst)
	br := bufio.NewReaderSize(client, maxHello)
	if direct {
		up, err := m.dialUp(ctx, pc, dst)
		if err != nil {
			log.Debug("egress proxy: connecting", "err", err)
			return
		}
		splice(client, br, up, nil)
		return
	}
	client.SetReadDeadline(time.Now().Add(helloTimeout))
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if first[0] == 0x16 { // a TLS handshake record
		m.proxyTLS(ctx, log, slot, pc, br, dst)
		return
	}
	m.proxyHTTP(ctx, log, slot, pc, br, dst)
}

func (m *Manager) proxyTLS(ctx context.Context, log interface{ Debug(string, ...any) }, slot int, pc *proxyConn, br *bufio.Reader, dst netip.AddrPort) {
	var seen bytes.Buffer
	hello, err := readClientHello(io.TeeReader(io.LimitReader(br, maxHello), &seen))
	if err != nil {
		log.Debug("egress proxy: no ClientHello", "err", err)
		return
	}
	name := egress.Canonical(hello.ServerName)
	for _, e := range hello.Extensions {
		if e == echExtension {
			log.Debug("egress proxy: refused encrypted ClientHello", "name", name)
			return
		}
	}
	if !m.proxyAllows(ctx, slot, name, dst.Addr()) {
		log.Debug("egress proxy: refused", "name", name)
		return
	}
	pc.setName(name)
	pc.client.SetReadDeadline(time.Time{})
	up, err := m.dialUp(ctx, pc, dst)
	if err != nil {
		log.Debug("egress proxy: connecting", "err", err)
		return
	}
	if _, err := up.Write(seen.Bytes()); err != nil {
		return
	}
	splice(pc.client, br, up, nil)
}

// errHelloRead ends the handshake readClientHello starts once it has the
// ClientHello.
var errHelloRead = errors.New("client hello read")

// readClientHello parses a TLS ClientHello from r, reading no more than it
// (Go's own TLS stack) needs.
func readClientHello(r io.Reader) (*tls.ClientHelloInfo, error) {
	var hello *tls.ClientHelloInfo
	err := tls.Server(readOnlyConn{r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errHelloRead
		},
	}).Handshake()
	if hello == nil {
		return nil, err
	}
	return hello, nil
}

// readOnlyConn is a net.Conn that reads from r and drops writes (the alert
// the TLS stack sends when readClientHello stops it).
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c readOnlyConn) Close() error                       { return nil }
func (c readOnlyConn) LocalAddr() net.Addr                { return nil }
func (c readOnlyConn) RemoteAddr() net.Addr               { return nil }
func (c readOnlyConn) SetDeadline(t time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(t time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(t time.Time) error { return nil }

// proxyHTTP checks the Host of every request on a plain HTTP connection:
// one connection must not carry a request for a denied name after one for
// an allowed name.
func (m *Manager) proxyHTTP(ctx context.Context, log interface{ Debug(string, ...any) }, slot int, pc *proxyConn, br *bufio.Reader, dst netip.AddrPort) {
	var up net.Conn
	var upr *bufio.Reader
	deadline := helloTimeout
	for {
		pc.client.SetReadDeadline(time.Now().Add(deadline))
		deadline = httpIdle
		if err := headComplete(br); err != nil {
			if errors.Is(err, errHeadTooLarge) {
				forbidden(pc.client, "")
			}
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		name := hostName(req.Host)
		if req.Method == http.MethodConnect || !m.proxyAllows(ctx, slot, name, dst.Addr()) {
			log.Debug("egress proxy: refused", "name", name, "method", req.Method)
			forbidden(pc.client, name)
			return
		}
		pc.setName(name)
		if up == nil {
			if up, err = m.dialUp(ctx, pc, dst); err != nil {
				log.Debug("egress proxy: connecting", "err", err)
				return
			}
			upr = bufio.NewReader(up)
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // Write adds Go's otherwise
		}
		pc.client.SetReadDeadline(time.Time{})
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(upr, req)
		if err != nil {
			return
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// A websocket, say: from here on bytes, both ways.
			if err := resp.Write(pc.client); err != nil {
				return
			}
			splice(pc.client, br, up, upr)
			return
		}
		err = resp.Write(pc.client)
		resp.Body.Close()
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

var errHeadTooLarge = errors.New("request head too large")

// headComplete waits until br holds a whole request head, which must fit its
// buffer: a sandbox cannot make the proxy hold more.
func headComplete(br *bufio.Reader) error {
	for {
		b, _ := br.Peek(br.Buffered())
		if bytes.Contains(b, []byte("\n\r\n")) || bytes.Contains(b, []byte("\n\n")) {
			return nil
		}
		if br.Buffered() >= br.Size() {
			return errHeadTooLarge
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return err
		}
	}
}

// hostName is the name of an HTTP Host header, without port or brackets.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return egress.Canonical(strings.Trim(host, "[]"))
}

func forbidden(w io.Writer, name string) {
	body := fmt.Sprintf("atoll: this sandbox's egress policy does not allow %q here\n", name)
	fmt.Fprintf(w, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// proxyAllows reports whether the policy of slot allows name, and name
// resolves to dst: as the sandbox's resolver answered it, or as the
// upstream servers answer now.
func (m *Manager) proxyAllows(ctx context.Context, slot int, name string, dst netip.Addr) bool {
	if name == "" {
		return false
	}
	m.slotsMu.Lock()
	st := m.slots[slot]
	if st == nil || !st.known || st.pol.Denied(dst) || !st.pol.AllowsName(name) {
		m.slotsMu.Unlock()
		return false
	}
	if st.pol.AllowsAddr(dst) {
		m.slotsMu.Unlock()
		return true
	}
	r := st.resolved[dst]
	ok := r != nil && r.names[name] && r.until.After(time.Now())
	m.slotsMu.Unlock()
	if ok {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 2*upstreamTimeout)
	defer cancel()
	for _, a := range m.lookup(ctx, name) {
		if a == dst {
			return true
		}
	}
	return false
}

// forbiddenDst reports whether the proxy must not connect to a whatever the
// sandbox's policy says: the denied prefixes, the operator's blocked
// prefixes (unless allowed),
// the sandboxes' subnets and the host's own addresses. The firewall keeps
// sandboxes from them; the proxy connects from the host and must do the
// same.
func (m *Manager) forbiddenDst(a netip.Addr) bool {
	a = a.Unmap()
	if m.cfg.Subnet4.Contains(a) || m.cfg.Subnet6.Contains(a) {
		return true
	}
	for _, p := range m.cfg.Deny {
		if p.Contains(a) {
			return true
		}
	}
	allowed := false
	for _, p := range m.cfg.Allow {
		allowed = allowed || p.Contains(a)
	}
	if !allowed {
		for _, p := range BlockedPrefixes {
			if p.Contains(a) {
				return true
			}
		}
	}
	routes, err := m.nl.RouteGet(net.IP(a.AsSlice()))
	if err != nil {
		return true
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL || r.Type == unix.RTN_BROADCAST || r.Type == unix.RTN_MULTICAST {
			return true
		}
	}
	return false
}

// dialUp connects to dst from the host namespace for pc.
func (m *Manager) dialUp(ctx context.Context, pc *proxyConn, dst netip.AddrPort) (net.Conn, error) {
	var up net.Conn
	err := m.inHost(func() (err error) {
		d := net.Dialer{Timeout: upDialTimeout}
		up, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed {
		up.Close()
		return nil, net.ErrClosed
	}
	pc.up = up
	return up, nil
}

// splice copies both ways between client (whose unread bytes start in cr)
// and up (in upr, if not nil) until both directions end.
func splice(client net.Conn, cr io.Reader, up net.Conn, upr io.Reader) {
	if upr == nil {
		upr = up
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(up, cr)
		closeWrite(up)
	}()
	io.Copy(client, upr)
	closeWrite(client)
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
		return
	}
	c.Close()
}

// originalDst is where a connection the firewall redirected was going
// (SO_ORIGINAL_DST, from conntrack).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := addrOf(c.LocalAddr())
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if local.Is4() {
			var sa unix.RawSockaddrInet4
			l := uint32(unsafe.Sizeof(sa))
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
				uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
			if e != 0 {
				serr = e
				return
			}
			p := (*[2]byte)(unsafe.Pointer(&sa.Port))
			out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(p[0])<<8|uint16(p[1]))
			return
		}
		var sa unix.RawSockaddrInet6
		l := uint32(unsafe.Sizeof(sa))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IPV6, ip6tSOOriginalDst,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = e
			return
		}
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return out, fmt.Errorf("reading the original destination: %w", err)
	}
	return out, nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST, SO_ORIGINAL_DST's IPv6 twin.
const ip6tSOOriginalDst = 80
