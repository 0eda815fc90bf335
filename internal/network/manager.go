package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/miekg/dns"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/netns"
)

// Attachment is what a sandbox's runtime needs to know about its network.
type Attachment struct {
	Slot int
	// Netns is the path of the sandbox's network namespace: start the
	// sandbox's first process inside it (netns.Run) instead of giving it a
	// network namespace of its own.
	Netns string
	// HostLink is the host end of the veth, a port of the bridge; Link is
	// the sandbox's end, inside Netns.
	HostLink, Link string
	// Addr4 and Addr6 are the sandbox's addresses, with the subnets'
	// prefix lengths.
	Addr4, Addr6 netip.Prefix
	// Gateway4 and Gateway6 are the host's addresses on the bridge: the
	// default routes, and where the resolver and egress proxy listen.
	Gateway4, Gateway6 netip.Addr
	// Resolvers go into the sandbox's /etc/resolv.conf.
	Resolvers []netip.Addr
	MTU       int
}

// Manager owns the host side of sandbox networking: the bridge, the
// nftables table, and one namespace and veth per attached slot. Its methods
// are safe for concurrent use, for different slots.
//
// Lock order (a lock is taken only while holding those above it):
//
//	mu (shared by Attach, Release, SetPolicy and the warm pool; exclusive by Sweep)
//	  warmMu
//	  slotsMu
//	    nftMu
//	    proxyConn.mu (allowedBy, under slotsMu)
//	  ctMu (never with slotsMu or nftMu held: conntrack walks are slow)
//
// Pool.mu is taken on its own, never with a Manager lock held.
type Manager struct {
	cfg Config
	log *slog.Logger
	mtu int
	// hostNS is the host namespace's fd when Config.HostNetns is set, else -1.
	hostNS   int
	nl       *netlink.Handle
	bridgeIx int
	rs       *ruleset

	// nftMu serialises batches on nft, whose queued messages are per Conn.
	nftMu sync.Mutex
	nft   *nftables.Conn

	ctMu sync.Mutex
	ct   *conntrack.Conn // dialled on first use, dropped after an error

	// mu is held shared by everything that creates or removes a slot's or a
	// warm entry's objects, and exclusively by Sweep, so that Sweep never
	// sees something half made.
	mu sync.RWMutex

	warmMu sync.Mutex
	// warm holds the names of warm pool entries that this Manager's pools
	// own; Sweep leaves them alone.
	warm    map[string]bool
	warmSeq int

	// slotsMu guards slots, the attached slots' policies and what the
	// resolver gave them; it is taken before nftMu.
	slotsMu sync.Mutex
	slots   map[int]*slotState

	// The resolver and the egress proxy, once Listen has opened them.
	dns    []*dns.Server
	proxyL []net.Listener
	// upstream are the resolver's upstream servers.
	upstream []netip.AddrPort
}

// New checks that the kernel can enforce the network model (Probe), then
// makes or adopts the bridge, sets the host's forwarding sysctls and
// installs the nftables table, keeping the sandboxes that are already
// attached (after a daemon restart) reachable.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := Probe(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, hostNS: -1, warm: map[string]bool{}, slots: map[int]*slotState{}}
	ok := false
	defer func() {
		if !ok {
			m.Close()
		}
	}()
	if cfg.HostNetns != "" {
		m.hostNS, err = unix.Open(cfg.HostNetns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening host network namespace: %w", err)
		}
		m.nl, err = netlink.NewHandleAt(vnetns.NsHandle(m.hostNS))
	} else {
		m.nl, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	if err := netns.PrepareDir(cfg.NetnsDir); err != nil {
		return nil, err
	}
	m.mtu = cfg.MTU
	if m.mtu == 0 {
		m.mtu = m.uplinkMTU()
	}
	if err := m.setupBridge(); err != nil {
		return nil, err
	}
	if err := m.inHost(enableForwarding); err != nil {
		return nil, err
	}

	// A batch goes in one sendmsg, and every message of it is
	// acknowledged, the kernel queueing all the acknowledgements before the
	// library reads one: installing the table with many attached slots
	// (about 30 messages each) needs buffers far above the defaults.
	nftOpts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigBuffers)}
	if m.hostNS >= 0 {
		nftOpts = append(nftOpts, nftables.WithNetNSFd(m.hostNS))
	}
	if m.nft, err = nftables.New(nftOpts...); err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	m.rs = newRuleset(cfg.Table)
	attached, err := m.attachedSlots()
	if err != nil {
		return nil, err
	}
	// Attached slots keep what the kernel holds for them, resolved
	// addresses included, until their policy is set again (SetPolicy).
	kernels := map[int]*slotKernel{}
	carried := m.readSlotKernels(attached)
	for _, slot := range attached {
		k := carried[slot]
		kernels[slot] = k
		st := &slotState{kernel: *k, resolved: map[netip.Addr]*resolvedAddr{}, conns: map[*proxyConn]struct{}{}}
		for _, r := range k.resolved {
			st.resolved[r.addr] = &resolvedAddr{names: map[string]bool{}, until: time.Now().Add(r.timeout)}
		}
		m.slots[slot] = st
	}
	m.nftMu.Lock()
	err = m.rs.install(m.nft, cfg, kernels)
	if err == nil {
		err = m.nft.Flush()
	}
	m.nftMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("installing nftables table %s: %w", cfg.Table, err)
	}
	ok = true
	m.log.Info("network ready", "bridge", cfg.Bridge, "subnet4", cfg.Subnet4, "subnet6", cfg.Subnet6,
		"mtu", m.mtu, "attached", len(attached))
	return m, nil
}

// bigBuffers gives a netlink socket send and receive buffers of 64 MiB,
// past net.core.[rw]mem_max (SO_*BUFFORCE, for root); memory is used only
// while a batch or its acknowledgements are in them.
func bigBuffers(c *mdnetlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("netlink buffers: %w", err)
	}
	return nil
}

// Config returns the configuration in effect, defaults filled in.
func (m *Manager) Config() Config { c := m.cfg; c.MTU = m.mtu; return c }

// Close releases the Manager's handles and leaves the network as it is, so
// that sandboxes keep working while the daemon restarts; see Teardown.
func (m *Manager) Close() error {
	m.closeListeners()
	m.ctMu.Lock()
	if m.ct != nil {
		m.ct.Close()
		m.ct = nil
	}
	m.ctMu.Unlock()
	if m.nft != nil {
		m.nft.CloseLasting()
	}
	if m.nl != nil {
		m.nl.Close()
	}
	if m.hostNS >= 0 {
		unix.Close(m.hostNS)
		m.hostNS = -1
	}
	return nil
}

// Teardown removes everything the Manager made: every attached slot, the
// nftables table and the bridge. Pools must be stopped first.
func (m *Manager) Teardown(ctx context.Context) error {
	err := m.Sweep(ctx, nil)
	m.nftMu.Lock()
	m.nft.DelTable(m.rs.table)
	if ferr := m.nft.Flush(); ferr != nil && !errors.Is(ferr, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("deleting nftables table: %w", ferr))
	}
	m.nftMu.Unlock()
	port, _ := m.cfg.carrierNames()
	if l, lerr := m.nl.LinkByName(port); lerr == nil {
		if derr := m.nl.LinkDel(l); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting carrier port: %w", derr))
		}
	}
	if br, lerr := m.nl.LinkByName(m.cfg.Bridge); lerr == nil {
		if derr := m.nl.LinkDel(br); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting bridge: %w", derr))
		}
	}
	return err
}

// inHost runs fn in the host namespace.
func (m *Manager) inHost(fn func() error) error {
	if m.hostNS < 0 {
		return fn()
	}
	return netns.RunFd(m.hostNS, fn)
}

// uplinkMTU is the MTU of the IPv4 default route's interface, or 1500.
func (m *Manager) uplinkMTU() int {
	routes, err := m.nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 1500
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		ix := r.LinkIndex
		if ix == 0 && len(r.MultiPath) > 0 {
			ix = r.MultiPath[0].LinkIndex
		}
		if l, err := m.nl.LinkByIndex(ix); err == nil && l.Attrs().MTU >= 1280 {
			return l.Attrs().MTU
		}
	}
	return 1500
}

func (m *Manager) setupBridge() error {
	name := m.cfg.Bridge
	link, err := m.nl.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		link = nil
	case err != nil:
		return fmt.Errorf("looking up bridge %s: %w", name, err)
	case link.Type() != "bridge":
		return fmt.Errorf("%w: %s exists and is a %s, not a bridge", errdefs.ErrConflict, name, link.Type())
	default:
		m.bridgeIx = link.Attrs().Index
	}
	if err := m.checkSubnets(); err != nil {
		return err
	}
	if link == nil {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU, attrs.HardwareAddr = name, m.mtu, bridgeMAC(name)
		if err := m.nl.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("creating bridge %s: %w", name, err)
		}
		if link, err = m.nl.LinkByName(name); err != nil {
			return fmt.Errorf("looking up bridge %s: %w", name, err)
		}
		m.bridgeIx = link.Attrs().Index
	}
	if link.Attrs().MTU != m.mtu {
		if err := m.nl.LinkSetMTU(link, m.mtu); err != nil {
			return fmt.Errorf("setting bridge MTU: %w", err)
		}
	}
	if mac := bridgeMAC(name); link.Attrs().HardwareAddr.String() != mac.String() {
		if err := m.nl.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("setting bridge address: %w", err)
		}
	}
	// The host must not take router advertisements or redirects from
	// sandboxes, nor tell them about each other.
	err = m.inHost(func() error {
		for _, kv := range [][2]string{
			{"net.ipv6.conf." + name + ".disable_ipv6", "0"},
			{"net.ipv6.conf." + name + ".accept_ra", "0"},
			{"net.ipv6.conf." + name + ".accept_redirects", "0"},
			{"net.ipv4.conf." + name + ".accept_redirects", "0"},
			{"net.ipv4.conf." + name + ".send_redirects", "0"},
		} {
			if err := writeSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, a := range []netip.Prefix{
		netip.PrefixFrom(m.cfg.gateway4(), m.cfg.Subnet4.Bits()),
		netip.PrefixFrom(m.cfg.gateway6(), m.cfg.Subnet6.Bits()),
	} {
		// No duplicate address detection: the address is ours by
		// construction, and DAD would hold it tentative for a second.
		if err := m.nl.AddrReplace(link, &netlink.Addr{IPNet: ipNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("adding gateway address %s: %w", a, err)
		}
	}
	if err := m.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing bridge up: %w", err)
	}
	return m.setupCarrier()
}

// setupCarrier makes or adopts the carrier port: a veth whose both ends
// stay up in the host namespace, one of them an isolated port of the
// bridge. A bridge has a carrier only while one of its ports is up; without
// this port the bridge would lose it whenever no sandbox runs, and the
// first sandbox after would find the host's side not ready: the bridge's
// queue drops packets until the kernel's link watch work runs (up to a
// second later, for a bridge), and its IPv6 addresses start over, so the
// first connection to or from that sandbox waits for a retransmission.
func (m *Manager) setupCarrier() error {
	port, peer := m.cfg.carrierNames()
	link, err := m.nl.LinkByName(port)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		// The two ends of a veth come and go together: a link with the
		// peer's name but no port is someone else's.
		if _, err := m.nl.LinkByName(peer); err == nil {
			return fmt.Errorf("%w: %s exists without %s", errdefs.ErrConflict, peer, port)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = port, m.mtu
		if err := m.nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: peer}); err != nil {
			return fmt.Errorf("creating carrier port: %w", err)
		}
		if link, err = m.nl.LinkByName(port); err != nil {
			return fmt.Errorf("looking up carrier port: %w", err)
		}
	case err != nil:
		return fmt.Errorf("looking up carrier port: %w", err)
	case link.Type() != "veth":
		return fmt.Errorf("%w: %s exists and is a %s, not a veth", errdefs.ErrConflict, port, link.Type())
	}
	err = m.inHost(func() error {
		// Nothing is to be sent from either end.
		for _, name := range []string{port, peer} {
			if err := writeSysctl("net.ipv6.conf."+name+".disable_ipv6", "1"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if link.Attrs().MasterIndex != m.bridgeIx {
		if err := m.nl.LinkSetMasterByIndex(link, m.bridgeIx); err != nil {
			return fmt.Errorf("adding carrier port to bridge: %w", err)
		}
	}
	if err := m.nl.LinkSetIsolated(link, true); err != nil {
		return fmt.Errorf("isolating carrier port: %w", err)
	}
	for _, name := range []string{peer, port} {
		l, err := m.nl.LinkByName(name)
		if err == nil {
			err = m.nl.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("bringing up carrier port %s: %w", name, err)
		}
	}
	return waitOperUp(m.nl, m.bridgeIx)
}

// checkSubnets refuses subnets that overlap a route the host already has
// through another interface: sandboxes would shadow that network.
func (m *Manager) checkSubnets() error {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := m.nl.RouteList(nil, fam)
		if err != nil {
			return fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || m.bridgeIx != 0 && r.LinkIndex == m.bridgeIx {
				continue
			}
			p, ok := prefixOf(r.Dst)
			if !ok || p.Bits() == 0 || p.Addr().IsLinkLocalUnicast() || p.Addr().IsMulticast() {
				continue
			}
			for _, s := range []netip.Prefix{m.cfg.Subnet4, m.cfg.Subnet6} {
				if s.Overlaps(p) {
					return fmt.Errorf("%w: sandbox subnet %s overlaps the host's route to %s", errdefs.ErrConflict, s, p)
				}
			}
		}
	}
	return nil
}

// enableForwarding turns the host into a router for both families. With
// IPv6 forwarding on, the kernel ignores router advertisements on
// interfaces with accept_ra=1, so those that take them now are set to 2
// first, which keeps them taking them.
func enableForwarding() error {
	if v, err := readSysctl("net.ipv6.conf.all.forwarding"); err != nil {
		return fmt.Errorf("reading IPv6 forwarding (is IPv6 disabled?): %w", err)
	} else if v != "1" {
		ents, err := os.ReadDir("/proc/sys/net/ipv6/conf")
		if err != nil {
			return err
		}
		for _, e := range ents {
			switch e.Name() {
			case "all", "default", "lo":
				continue
			}
			key := "net.ipv6.conf." + e.Name() + ".accept_ra"
			if v, err := readSysctl(key); err == nil && v == "1" {
				if err := writeSysctl(key, "2"); err != nil {
					return err
				}
			}
		}
	}
	if err := writeSysctl("net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	return writeSysctl("net.ipv6.conf.all.forwarding", "1")
}

// attachedSlots lists the slots whose host veths exist.
func (m *Manager) attachedSlots() ([]int, error) {
	links, err := m.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var slots []int
	for _, l := range links {
		if slot, ok := m.cfg.parseSlotName(l.Attrs().Name); ok {
			slots = append(slots, slot)
		}
	}
	slices.Sort(slots)
	return slots, nil
}

func (m *Manager) attachment(slot int) *Attachment {
	a4, a6 := m.cfg.slotAddrs(slot)
	name := m.cfg.slotName(slot)
	return &Attachment{
		Slot: slot, Netns: filepath.Join(m.cfg.NetnsDir, name),
		HostLink: name, Link: sandboxLink,
		Addr4: a4, Addr6: a6,
		Gateway4: m.cfg.gateway4(), Gateway6: m.cfg.gateway6(),
		Resolvers: []netip.Addr{m.cfg.gateway4(), m.cfg.gateway6()},
		MTU:       m.mtu,
	}
}

// Addrs are slot's addresses, whether attached or not.
func (m *Manager) Addrs(slot int) (netip.Addr, netip.Addr) {
	a4, a6 := m.cfg.slotAddrs(slot)
	return a4.Addr(), a6.Addr()
}

// Lookup returns slot's attachment if its namespace exists, as after a
// daemon restart; ErrNotFound otherwise.
func (m *Manager) Lookup(slot int) (*Attachment, error) {
	if err := m.cfg.checkSlot(slot); err != nil {
		return nil, err
	}
	a := m.attachment(slot)
	if !netns.Mounted(a.Netns) {
		return nil, fmt.Errorf("%w: network of slot %d", errdefs.ErrNotFound, slot)
	}
	return a, nil
}

// entry is a namespace with its veth, before or while it is given a slot.
type entry struct {
	name   string
	nsPath string
	ns     *netlink.Handle // inside the namespace
	eth0   int             // index of the sandbox's link, inside
	host   int             // index of the host's link
}

func (e *entry) close() {
	if e.ns != nil {
		e.ns.Close()
		e.ns = nil
	}
}

// Attach makes slot's namespace and veth and opens the firewall for its
// addresses as pol allows. A Pool does the same faster. Attaching a slot
// that is attached is ErrConflict.
func (m *Manager) Attach(ctx context.Context, slot int, pol egress.Policy) (*Attachment, error) {
	if err := m.cfg.checkSlot(slot); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	start := time.Now()
	e, err := m.create(m.cfg.slotName(slot))
	if err != nil {
		return nil, err
	}
	a, err := m.assign(e, slot, pol)
	if err != nil {
		return nil, err
	}
	m.log.Debug("network attached", "slot", slot, "op", "attach", "ms", msSince(start))
	return a, nil
}

// create makes a namespace and a veth named name, the host end a down
// isolated port of the bridge, the sandbox end up as eth0 inside.
func (m *Manager) create(name string) (_ *entry, err error) {
	// e is not the named result: a return of nil must not hide it from the
	// clean-up below.
	e := &entry{name: name, nsPath: filepath.Join(m.cfg.NetnsDir, name)}
	if _, err := os.Lstat(e.nsPath); err == nil {
		return nil, fmt.Errorf("%w: network namespace %s exists", errdefs.ErrConflict, name)
	}
	ours := false // whether the namespace file is this call's to remove
	defer func() {
		if err != nil {
			e.close()
			if ours {
				m.destroy(e)
			}
		}
	}()
	err = netns.Create(e.nsPath, func() error {
		for _, kv := range [][2]string{
			// Static addresses: no router advertisements, no DAD delay.
			{"net.ipv6.conf.all.accept_ra", "0"},
			{"net.ipv6.conf.default.accept_ra", "0"},
			{"net.ipv6.conf.all.accept_dad", "0"},
			{"net.ipv6.conf.default.accept_dad", "0"},
			// The sandbox's root is not root of this namespace's
			// owner: let it bind low ports and ping all the same.
			{"net.ipv4.ip_unprivileged_port_start", "0"},
			{"net.ipv4.ping_group_range", "0 2147483647"},
		} {
			if err := writeSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		e.ns = h
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		return err
	})
	// newNetns makes the file exclusively: of two creates of one name, the
	// loser stops here and removes nothing.
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%w: network namespace %s exists", errdefs.ErrConflict, name)
	}
	ours = true
	if err != nil {
		return nil, fmt.Errorf("creating network namespace: %w", err)
	}
	nsfd, err := unix.Open(e.nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace: %w", err)
	}
	defer unix.Close(nsfd)
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = name, m.mtu
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: sandboxLink, PeerNamespace: netlink.NsFd(nsfd)}
	err = m.nl.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// This call made the namespace file, so a link of that name is
		// left from a crash between the two: replace it.
		if old, lerr := m.nl.LinkByName(name); lerr == nil && m.nl.LinkDel(old) == nil {
			err = m.nl.LinkAdd(veth)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("creating veth: %w", err)
	}
	e.host = veth.Index
	if err := m.nl.LinkSetMasterByIndex(veth, m.bridgeIx); err != nil {
		return nil, fmt.Errorf("adding veth to bridge: %w", err)
	}
	if err := m.nl.LinkSetIsolated(veth, true); err != nil {
		return nil, fmt.Errorf("isolating bridge port: %w", err)
	}
	// The port's MAC is given (pinMAC), never learnt, and frames for
	// other MACs are not flooded to it (a VM's guest could listen).
	if err := m.nl.LinkSetLearning(veth, false); err != nil {
		return nil, fmt.Errorf("turning off learning on bridge port: %w", err)
	}
	if err := m.nl.LinkSetFlood(veth, false); err != nil {
		return nil, fmt.Errorf("turning off flooding to bridge port: %w", err)
	}
	eth0, err := e.ns.LinkByName(sandboxLink)
	if err == nil {
		e.eth0 = eth0.Attrs().Index
		err = e.ns.LinkSetUp(eth0)
	}
	if err != nil {
		return nil, fmt.Errorf("bringing up sandbox link: %w", err)
	}
	return e, nil
}

// assign gives e to slot: names, its MAC, addresses, routes, the host end
// up, firewall elements; it returns once the link is ready to carry
// traffic both ways. On error e is destroyed.
func (m *Manager) assign(e *entry, slot int, pol egress.Policy) (a *Attachment, err error) {
	added := false
	defer func() {
		if err != nil {
			m.destroy(e)
			if added {
				m.deleteElements(slot)
			}
		}
		e.close()
	}()
	name := m.cfg.slotName(slot)
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: e.host, Name: e.name}}
	if e.name != name {
		newPath := filepath.Join(m.cfg.NetnsDir, name)
		if err := netns.Rename(e.nsPath, newPath); err != nil {
			if errors.Is(err, os.ErrExist) {
				err = fmt.Errorf("%w: network slot %d is attached", errdefs.ErrConflict, slot)
			}
			return nil, err
		}
		e.nsPath = newPath
		if err := m.nl.LinkSetName(host, name); err != nil {
			return nil, fmt.Errorf("renaming veth: %w", err)
		}
		e.name = name
	}
	a = m.attachment(slot)
	eth0 := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: e.eth0, Name: sandboxLink}}
	// Before the carrier comes on, so that the sandbox's link-local IPv6
	// address, made then, is the slot MAC's too.
	mac := slotMAC(m.cfg.Bridge, slot)
	if err := e.ns.LinkSetHardwareAddr(eth0, mac); err != nil {
		return nil, fmt.Errorf("setting the slot's MAC: %w", err)
	}
	if err := m.pinMAC(e.host, mac); err != nil {
		return nil, err
	}
	if err := e.ns.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(a.Addr4)}); err != nil {
		return nil, fmt.Errorf("adding address %s: %w", a.Addr4, err)
	}
	if err := e.ns.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(a.Addr6), Flags: unix.IFA_F_NODAD}); err != nil {
		return nil, fmt.Errorf("adding address %s: %w", a.Addr6, err)
	}
	for _, gw := range []netip.Addr{a.Gateway4, a.Gateway6} {
		r := &netlink.Route{LinkIndex: e.eth0, Gw: net.IP(gw.AsSlice())}
		if err := e.ns.RouteAdd(r); err != nil {
			return nil, fmt.Errorf("adding default route via %s: %w", gw, err)
		}
	}
	// The host end goes up before the firewall's elements are added, not
	// last: the kernel readies both ends and the sandbox's IPv6 from work
	// queues (see waitReady), which then run meanwhile. Nothing runs in the
	// namespace yet to send anything. (The addresses come first: the
	// sandbox's IPv6 readiness, as waitReady sees it, then covers them.)
	if err := m.nl.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("bringing up veth: %w", err)
	}
	if err := m.addElements(slot, pol); err != nil {
		return nil, err
	}
	added = true
	if r := ratesOf(pol); r != (rates{}) {
		if err := m.shape(slot, e.ns, r); err != nil {
			return nil, err
		}
	}
	// An entry a crash left, or one the host made trying to reach the
	// slot's previous sandbox after it went (a closed connection's last
	// retransmissions), would be believed until probes of its MAC failed.
	if err := m.forgetNeighbours(a.Addr4.Addr(), a.Addr6.Addr()); err != nil {
		return nil, err
	}
	if err := m.waitReady(e); err != nil {
		return nil, err
	}
	return a, nil
}

// pinMAC gives the bridge a static forwarding entry for mac, the slot's,
// on the host end of the sandbox's veth, a port that learns nothing (see
// create). The bridge would otherwise learn which port a MAC is behind
// from the frames it gets: a sandbox sending from another sandbox's MAC (a
// VM's guest is root of its own kernel) would draw the host's packets for
// that sandbox, the port proxy's requests included, to itself.
func (m *Manager) pinMAC(host int, mac net.HardwareAddr) error {
	fdb := &netlink.Neigh{LinkIndex: host, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER,
		State: netlink.NUD_NOARP, HardwareAddr: mac}
	if err := m.nl.NeighSet(fdb); err != nil {
		return fmt.Errorf("pinning the sandbox's MAC: %w", err)
	}
	return nil
}

// waitReady waits for both ends of e's veth, the sandbox's up without a
// carrier until its host end came up, to be operationally up, and for the
// sandbox's IPv6 to be ready.
func (m *Manager) waitReady(e *entry) error {
	if err := waitOperUp(m.nl, e.host); err != nil {
		return err
	}
	if err := waitOperUp(e.ns, e.eth0); err != nil {
		return err
	}
	return waitIPv6Ready(e.ns, e.eth0)
}

// waitIPv6Ready waits for the sandbox's IPv6 to take its link's carrier
// into account, which it does from the same work queue, after the link is
// up: until then it neither answers nor sends. Its link-local address
// leaving the tentative state (at once, without duplicate address
// detection) is the sign.
func waitIPv6Ready(h *netlink.Handle, ix int) error {
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ix}}
	deadline := time.Now().Add(2 * time.Second)
	for {
		addrs, err := h.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("reading sandbox addresses: %w", err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("the sandbox's IPv6 is not ready 2s after its link came up")
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// waitOperUp waits for a link (a veth end, the bridge) whose carrier just
// came on to be operationally up. The kernel turns the carrier on at once, but makes
// the link up (and gives it a queue that sends, and the bridge port
// forwarding) from a work queue, which on a loaded host runs
// milliseconds later: a first packet sent before, the port proxy's ARP
// request or the sandbox's reply, is dropped and sent again a second
// later. A getlink request makes current kernels run that work for the
// link at once.
func waitOperUp(h *netlink.Handle, ix int) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := h.LinkByIndex(ix)
		if err != nil {
			return fmt.Errorf("reading link state: %w", err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still %s 2s after its carrier came on", l.Attrs().Name, l.Attrs().OperState)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// forgetNeighbours deletes the host's neighbour entries (ARP for IPv4, NDP
// for IPv6) for addrs on the bridge. The kernel keeps an entry, stale or
// reachable, after the link it was learnt from is gone, and trusts it
// until probes of the old MAC fail: 5 to 30 s in which a new sandbox with
// the address is unreachable from the host (the port proxy), though its
// own connections work. Missing entries are not an error.
func (m *Manager) forgetNeighbours(addrs ...netip.Addr) error {
	var errs []error
	for _, a := range addrs {
		err := m.nl.NeighDel(&netlink.Neigh{LinkIndex: m.bridgeIx, Family: family(a), IP: net.IP(a.AsSlice())})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting neighbour entry %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

// destroy removes e's veth and namespace.
func (m *Manager) destroy(e *entry) error {
	e.close()
	var err error
	if l, lerr := m.nl.LinkByName(e.name); lerr == nil {
		if derr := m.nl.LinkDel(l); derr != nil {
			err = fmt.Errorf("deleting veth %s: %w", e.name, derr)
		}
	}
	return errors.Join(err, netns.Remove(e.nsPath))
}

func (m *Manager) addElements(slot int, pol egress.Policy) error {
	m.slotsMu.Lock()
	defer m.slotsMu.Unlock()
	if m.slots[slot] != nil {
		return fmt.Errorf("%w: network slot %d is attached", errdefs.ErrConflict, slot)
	}
	k := kernelOf(pol, nil)
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if err := m.rs.addSlot(m.nft, m.cfg, slot, &k); err != nil {
		return err
	}
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("adding firewall elements: %w", err)
	}
	m.slots[slot] = &slotState{pol: pol, known: true, kernel: k, rates: ratesOf(pol),
		resolved: map[netip.Addr]*resolvedAddr{}, conns: map[*proxyConn]struct{}{}}
	return nil
}

// deleteElements removes slot's firewall objects and state; missing ones
// are not an error.
func (m *Manager) deleteElements(slot int) error {
	m.slotsMu.Lock()
	st := m.slots[slot]
	delete(m.slots, slot)
	m.slotsMu.Unlock()
	if st != nil {
		st.closeConns()
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	had := &slotKernel{open: true, proxied: true}
	if st != nil {
		had = &st.kernel
	}
	// One batch in the common case; one per object when some are missing,
	// since a missing object fails its whole batch.
	if err := m.rs.delSlot(m.nft, m.cfg, slot, had); err != nil {
		return err
	}
	err := m.nft.Flush()
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting firewall elements: %w", err)
	}
	return m.deleteSlotPiecewise(slot)
}

// deleteSlotPiecewise removes whatever exists of slot's firewall objects,
// one batch each. The caller holds nftMu.
func (m *Manager) deleteSlotPiecewise(slot int) error {
	a4, a6 := m.cfg.slotAddrs(slot)
	try := func(queue func() error) error {
		if err := queue(); err != nil {
			return err
		}
		if err := m.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("deleting firewall objects of slot %d: %w", slot, err)
		}
		return nil
	}
	var errs []error
	for _, s := range []*nftables.Set{m.rs.sandbox4, m.rs.open4, m.rs.proxied4} {
		errs = append(errs, try(func() error { return m.nft.SetDeleteElements(s, addrElems(a4.Addr())) }))
	}
	for _, s := range []*nftables.Set{m.rs.sandbox6, m.rs.open6, m.rs.proxied6} {
		errs = append(errs, try(func() error { return m.nft.SetDeleteElements(s, addrElems(a6.Addr())) }))
	}
	errs = append(errs, try(func() error {
		m.nft.DelChain(&nftables.Chain{Name: slotChain(slot), Table: m.rs.table})
		return nil
	}))
	for kind := range slotSetKinds {
		errs = append(errs, try(func() error { m.nft.DelSet(m.rs.slotSet(slot, kind)); return nil }))
	}
	return errors.Join(errs...)
}

// deleteAddrElements removes stale verdict map, open and proxied elements
// of addrs; missing ones are not an error. The caller holds nftMu.
func (m *Manager) deleteAddrElements(addrs []netip.Addr) error {
	var errs []error
	for _, a := range addrs {
		sets := []*nftables.Set{m.rs.sandbox6, m.rs.open6, m.rs.proxied6}
		if a.Is4() {
			sets = []*nftables.Set{m.rs.sandbox4, m.rs.open4, m.rs.proxied4}
		}
		for _, s := range sets {
			if err := m.nft.SetDeleteElements(s, addrElems(a)); err != nil {
				return err
			}
			if err := m.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting firewall element %s: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Release removes slot's network: firewall elements first (no new traffic),
// then the veth, the conntrack entries of its addresses, and the namespace.
// Releasing a slot that is not attached is not an error.
func (m *Manager) Release(ctx context.Context, slot int) error {
	if err := m.cfg.checkSlot(slot); err != nil {
		return err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	start := time.Now()
	a4, a6 := m.cfg.slotAddrs(slot)
	err := m.deleteElements(slot)
	name := m.cfg.slotName(slot)
	if derr := m.destroy(&entry{name: name, nsPath: filepath.Join(m.cfg.NetnsDir, name)}); derr != nil {
		err = errors.Join(err, derr)
	}
	if _, cerr := m.flushConntrack(anyAddr(func(a netip.Addr) bool { return a == a4.Addr() || a == a6.Addr() })); cerr != nil {
		err = errors.Join(err, cerr)
	}
	// After the veth: nothing can teach the host the addresses again.
	if nerr := m.forgetNeighbours(a4.Addr(), a6.Addr()); nerr != nil {
		err = errors.Join(err, nerr)
	}
	if err != nil {
		return fmt.Errorf("releasing network slot %d: %w", slot, err)
	}
	m.log.Debug("network released", "slot", slot, "op", "release", "ms", msSince(start))
	return nil
}

func (m *Manager) dialConntrack() (*conntrack.Conn, error) {
	var cfg *mdnetlink.Config
	if m.hostNS >= 0 {
		cfg = &mdnetlink.Config{NetNS: m.hostNS}
	}
	c, err := conntrack.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("opening conntrack: %w", err)
	}
	return c, nil
}

// flushConntrack deletes the host's conntrack entries for which match is
// true, and says how many.
func (m *Manager) flushConntrack(match func(conntrack.Flow) bool) (n int, err error) {
	m.ctMu.Lock()
	defer m.ctMu.Unlock()
	if m.ct == nil {
		if m.ct, err = m.dialConntrack(); err != nil {
			return 0, err
		}
	}
	defer func() {
		if err != nil {
			m.ct.Close()
			m.ct = nil
		}
	}()
	flows, err := m.ct.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("listing conntrack entries: %w", err)
	}
	for _, f := range flows {
		if !match(f) {
			continue
		}
		if err := m.ct.Delete(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return n, fmt.Errorf("deleting conntrack entry: %w", err)
		}
		n++
	}
	return n, nil
}

// anyAddr matches flows with an address for which match is true in either
// direction.
func anyAddr(match func(netip.Addr) bool) func(conntrack.Flow) bool {
	return func(f conntrack.Flow) bool { return flowMatches(f, match) }
}

func flowMatches(f conntrack.Flow, match func(netip.Addr) bool) bool {
	for _, a := range []netip.Addr{
		f.TupleOrig.IP.SourceAddress, f.TupleOrig.IP.DestinationAddress,
		f.TupleReply.IP.SourceAddress, f.TupleReply.IP.DestinationAddress,
	} {
		if a.IsValid() && match(a.Unmap()) {
			return true
		}
	}
	return false
}

// Sweep removes every namespace, veth, firewall element and conntrack entry
// of this Manager's that belongs to a slot not in inUse, and every warm
// entry that no live Pool of this Manager owns: what a crash left behind.
// Run it at start-up with the slots the store says have a network.
func (m *Manager) Sweep(ctx context.Context, inUse []int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := map[int]bool{}
	for _, s := range inUse {
		keep[s] = true
	}
	m.warmMu.Lock()
	owned := maps.Clone(m.warm)
	m.warmMu.Unlock()
	stale := func(name string) bool {
		if slot, ok := m.cfg.parseSlotName(name); ok {
			return !keep[slot]
		}
		return m.cfg.isWarmName(name) && !owned[name]
	}

	var sw sweep
	if err := m.sweepLinks(&sw, stale); err != nil {
		return err
	}
	m.sweepNetns(&sw, stale)
	m.nftMu.Lock()
	m.sweepAddrElements(&sw, keep)
	m.sweepSlotObjects(&sw, keep)
	m.nftMu.Unlock()
	m.sweepSlotStates(keep)
	m.sweepNeighbours(&sw, keep)
	// Only sandbox addresses: the host's own traffic from the gateway
	// (IGMP reports, say) is not ours to cut.
	n, err := m.flushConntrack(anyAddr(func(a netip.Addr) bool {
		slot, ok := m.cfg.slotOf(a)
		return ok && !keep[slot]
	}))
	sw.fail(err)
	sw.removed += n
	if sw.removed > 0 {
		m.log.Info("network swept", "op", "sweep", "removed", sw.removed, "kept", len(keep))
	}
	return errors.Join(sw.errs...)
}

// sweep counts what Sweep's steps removed and gathers what they failed at:
// a step that fails goes on with the next.
type sweep struct {
	removed int
	errs    []error
}

func (sw *sweep) fail(err error) {
	if err != nil {
		sw.errs = append(sw.errs, err)
	}
}

// sweepLinks deletes the stale veths. Not listing the links at all stops
// the Sweep.
func (m *Manager) sweepLinks(sw *sweep, stale func(string) bool) error {
	links, err := m.nl.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if name := l.Attrs().Name; stale(name) {
			if err := m.nl.LinkDel(l); err != nil {
				sw.fail(fmt.Errorf("deleting veth %s: %w", name, err))
			}
			sw.removed++
		}
	}
	return nil
}

// sweepNetns removes the stale named network namespaces.
func (m *Manager) sweepNetns(sw *sweep, stale func(string) bool) {
	ents, err := os.ReadDir(m.cfg.NetnsDir)
	sw.fail(err)
	for _, e := range ents {
		if stale(e.Name()) {
			sw.fail(netns.Remove(filepath.Join(m.cfg.NetnsDir, e.Name())))
			sw.removed++
		}
	}
}

// sweepAddrElements deletes the per-address set elements (verdict map, open,
// proxied) of addresses outside the kept slots. The caller holds nftMu.
func (m *Manager) sweepAddrElements(sw *sweep, keep map[int]bool) {
	var addrs []netip.Addr
	for _, s := range []*nftables.Set{m.rs.sandbox4, m.rs.sandbox6, m.rs.open4, m.rs.open6, m.rs.proxied4, m.rs.proxied6} {
		elems, err := m.nft.GetSetElements(s)
		if err != nil {
			sw.fail(fmt.Errorf("listing firewall elements: %w", err))
			continue
		}
		for _, el := range elems {
			a, ok := netip.AddrFromSlice(el.Key)
			if !ok {
				continue
			}
			if slot, ok := m.cfg.slotOf(a); (!ok || !keep[slot]) && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) > 0 {
		sw.fail(m.deleteAddrElements(addrs))
		sw.removed += len(addrs)
	}
}

// sweepSlotObjects deletes the slot chains and sets of slots not kept. The
// caller holds nftMu.
func (m *Manager) sweepSlotObjects(sw *sweep, keep map[int]bool) {
	staleSlots := map[int]bool{}
	if chains, err := m.nft.ListChainsOfTableFamily(nftables.TableFamilyINet); err != nil {
		sw.fail(fmt.Errorf("listing chains: %w", err))
	} else {
		for _, c := range chains {
			if slot, ok := parseSlotObject(c.Name); ok && c.Table.Name == m.rs.table.Name && !keep[slot] {
				staleSlots[slot] = true
			}
		}
	}
	if sets, err := m.nft.GetSets(m.rs.table); err != nil {
		sw.fail(fmt.Errorf("listing sets: %w", err))
	} else {
		for _, s := range sets {
			if slot, ok := parseSlotObject(s.Name); ok && !keep[slot] {
				staleSlots[slot] = true
			}
		}
	}
	for slot := range staleSlots {
		sw.fail(m.deleteSlotPiecewise(slot))
		sw.removed++
	}
}

// sweepSlotStates forgets the in-memory state of slots not kept and closes
// their connections.
func (m *Manager) sweepSlotStates(keep map[int]bool) {
	m.slotsMu.Lock()
	var gone []*slotState
	for slot, st := range m.slots {
		if !keep[slot] {
			gone = append(gone, st)
			delete(m.slots, slot)
		}
	}
	m.slotsMu.Unlock()
	for _, st := range gone {
		st.closeConns()
	}
}

// sweepNeighbours forgets the bridge's neighbour entries of addresses in
// slots not kept.
func (m *Manager) sweepNeighbours(sw *sweep, keep map[int]bool) {
	neighs, err := m.nl.NeighList(m.bridgeIx, netlink.FAMILY_ALL)
	if err != nil {
		sw.fail(fmt.Errorf("listing neighbour entries: %w", err))
		return
	}
	var gone []netip.Addr
	for _, n := range neighs {
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		if slot, ok := m.cfg.slotOf(a); ok && !keep[slot] {
			gone = append(gone, a.Unmap())
		}
	}
	sw.fail(m.forgetNeighbours(gone...))
	sw.removed += len(gone)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	a = a.Unmap()
	return netip.PrefixFrom(a, ones), true
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
