package network

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Config configures a Manager. The zero value is the documented default for
// every field.
type Config struct {
	// Bridge is the host bridge's name, default "atoll0". It also names the
	// sandboxes' namespaces and host-side veths ("atoll0-17" for slot 17), so
	// it is at most 9 bytes of [a-z0-9], starting with a letter.
	Bridge string
	// Subnet4 is the sandboxes' IPv4 subnet, default 10.213.0.0/16. The
	// gateway is its first address, slot n gets the (n+2)th.
	Subnet4 netip.Prefix
	// Subnet6 is the sandboxes' IPv6 subnet, a /64 (or shorter). Default: a
	// unique local address /64 whose global ID is derived from Bridge, so
	// that it is the same across restarts and differs between bridges.
	Subnet6 netip.Prefix
	// MTU of the bridge and veths; default the MTU of the host's IPv4
	// default-route interface (the uplink), or 1500 without one.
	MTU int
	// GatewayTCPPorts and GatewayUDPPorts are the host ports on the gateway
	// addresses that sandboxes may connect to, under every egress policy:
	// the resolver's, and (atoll serve --vault-git-port) the listener that
	// serves vaults' git URLs. Default: 53 for each. Everything else on the host is refused, but for ProxyPort
	// to which the firewall itself sends connections.
	GatewayTCPPorts []uint16
	GatewayUDPPorts []uint16
	// ProxyPort is the egress proxy's port on the gateway addresses,
	// default 4380. Sandboxes whose policy allows names have their
	// connections to ports 80 and 443 sent there; connecting to it directly
	// is refused.
	ProxyPort uint16
	// Upstream are the DNS servers the sandboxes' resolver asks. Default:
	// the nameservers of /etc/resolv.conf, port 53, asked from the host
	// namespace (HostNetns).
	Upstream []netip.AddrPort
	// Allow lists destination prefixes that are blocked by default
	// (BlockedPrefixes: private, link-local, metadata, multicast...) that
	// the operator lets sandboxes reach, such as an internal package mirror.
	Allow []netip.Prefix
	// Deny lists destination prefixes that sandboxes never reach, whatever
	// Allow or their own policy say: the network of the server's peers
	// (other nodes of a cluster, its PostgreSQL), which an operator's
	// Allow for a mirror must not open by accident.
	Deny []netip.Prefix
	// NetnsDir is where sandbox namespaces are bind-mounted, default
	// /run/netns, so that `ip netns exec atoll0-17 ...` works.
	NetnsDir string
	// Table is the nftables table (family inet) that holds all of atoll's
	// rules, default "atoll" for the default bridge and "atoll-<bridge>"
	// for any other, so that servers sharing a namespace with bridges of
	// their own never rewrite each other's. The Manager owns it and
	// rewrites it whole at start.
	Table string
	// HostNetns, if set, is the path of the network namespace that plays
	// the host: the bridge, routes, sysctls, nftables table and conntrack
	// entries live there. Empty means the calling process's namespace.
	// Tests use it to leave the real host alone.
	HostNetns string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

const (
	maxBridgeName = 9
	// maxSlots bounds slot numbers: "<bridge>-<slot>" must fit IFNAMSIZ.
	maxSlots = 100000
	// sandboxLink is the sandbox's interface name inside its namespace.
	sandboxLink = "eth0"
)

func (c Config) withDefaults() (Config, error) {
	if c.Bridge == "" {
		c.Bridge = "atoll0"
	}
	if !validBridgeName(c.Bridge) {
		return c, fmt.Errorf("%w: bridge name %q: want 1 to %d bytes of [a-z0-9], starting with a letter",
			errdefs.ErrInvalid, c.Bridge, maxBridgeName)
	}
	if !c.Subnet4.IsValid() {
		c.Subnet4 = netip.MustParsePrefix("10.213.0.0/16")
	}
	if !c.Subnet4.Addr().Is4() || c.Subnet4.Bits() > 29 || c.Subnet4.Bits() < 8 {
		return c, fmt.Errorf("%w: IPv4 subnet %s: want an IPv4 prefix from /8 to /29", errdefs.ErrInvalid, c.Subnet4)
	}
	c.Subnet4 = c.Subnet4.Masked()
	if !c.Subnet6.IsValid() {
		c.Subnet6 = defaultSubnet6(c.Bridge)
	}
	if !c.Subnet6.Addr().Is6() || c.Subnet6.Addr().Is4In6() || c.Subnet6.Bits() > 64 || c.Subnet6.Bits() < 16 {
		return c, fmt.Errorf("%w: IPv6 subnet %s: want an IPv6 prefix from /16 to /64", errdefs.ErrInvalid, c.Subnet6)
	}
	c.Subnet6 = c.Subnet6.Masked()
	if c.MTU != 0 && (c.MTU < 1280 || c.MTU > 65535) {
		return c, fmt.Errorf("%w: MTU %d: want 1280 to 65535 (IPv6 needs 1280)", errdefs.ErrInvalid, c.MTU)
	}
	if c.GatewayTCPPorts == nil {
		c.GatewayTCPPorts = []uint16{53}
	}
	if c.GatewayUDPPorts == nil {
		c.GatewayUDPPorts = []uint16{53}
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = 4380
	}
	for _, p := range append(append([]uint16(nil), c.GatewayTCPPorts...), c.GatewayUDPPorts...) {
		if p == 0 {
			return c, fmt.Errorf("%w: gateway port 0", errdefs.ErrInvalid)
		}
	}
	if slices.Contains(c.GatewayTCPPorts, c.ProxyPort) {
		return c, fmt.Errorf("%w: proxy port %d is also a gateway TCP port", errdefs.ErrInvalid, c.ProxyPort)
	}
	for _, u := range c.Upstream {
		if !u.IsValid() || u.Port() == 0 {
			return c, fmt.Errorf("%w: upstream resolver %s", errdefs.ErrInvalid, u)
		}
	}
	for _, p := range c.Allow {
		if !p.IsValid() {
			return c, fmt.Errorf("%w: allowed prefix %s", errdefs.ErrInvalid, p)
		}
	}
	for i, p := range c.Deny {
		if !p.IsValid() {
			return c, fmt.Errorf("%w: denied prefix %s", errdefs.ErrInvalid, p)
		}
		c.Deny[i] = p.Masked()
	}
	if c.NetnsDir == "" {
		c.NetnsDir = "/run/netns"
	}
	if c.Table == "" {
		c.Table = "atoll"
		if c.Bridge != "atoll0" {
			c.Table = "atoll-" + c.Bridge
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func validBridgeName(s string) bool {
	if len(s) == 0 || len(s) > maxBridgeName || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// defaultSubnet6 is fdXX:XXXX:XXXX::/64 with the 40-bit global ID taken from
// a hash of the bridge name (RFC 4193 asks for a random one; a hash keeps it
// stable across restarts without storing it).
func defaultSubnet6(bridge string) netip.Prefix {
	h := sha256.Sum256([]byte("atoll network " + bridge))
	var a [16]byte
	a[0] = 0xfd
	copy(a[1:6], h[:5])
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// bridgeMAC is a fixed locally administered address for the bridge: left to
// itself, a bridge takes the lowest MAC of its ports, which changes as
// sandboxes come and go and would leave their neighbour caches stale.
func bridgeMAC(bridge string) net.HardwareAddr {
	h := sha256.Sum256([]byte("atoll bridge " + bridge))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// slotMAC is slot's sandbox MAC: a locally administered unicast address
// whose first three bytes come from the bridge's name and last three are
// the slot (maxSlots fits in 24 bits), so that no two slots of a bridge
// share one. A sandbox inherits it with its slot: the host's neighbour
// entries (ARP, NDP) for the slot's addresses, and the bridge's forwarding
// entry, stay true from one sandbox of the slot to the next instead of
// naming a link that is gone (see Manager.assign).
func slotMAC(bridge string, slot int) net.HardwareAddr {
	h := sha256.Sum256([]byte("atoll sandbox " + bridge))
	mac := net.HardwareAddr{h[0]&0xfc | 0x02, h[1], h[2], byte(slot >> 16), byte(slot >> 8), byte(slot)}
	if br := bridgeMAC(bridge); mac[0] == br[0] && mac[1] == br[1] && mac[2] == br[2] {
		mac[1] ^= 0x80 // never the bridge's own
	}
	return mac
}

// capacity is the number of slots the subnets can address.
func (c Config) capacity() int {
	n := maxSlots
	// Addresses: network, gateway, then slots; the last one is broadcast.
	if hosts := 1<<(32-c.Subnet4.Bits()) - 3; hosts < n {
		n = hosts
	}
	if bits := 128 - c.Subnet6.Bits(); bits < 20 {
		if hosts := 1<<bits - 3; hosts < n {
			n = hosts
		}
	}
	return n
}

func (c Config) checkSlot(slot int) error {
	if slot < 0 || slot >= c.capacity() {
		return fmt.Errorf("%w: network slot %d: want 0 to %d", errdefs.ErrInvalid, slot, c.capacity()-1)
	}
	return nil
}

// nthAddr is the address n places after p's first.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	b := p.Addr().As16()
	carry := uint64(n)
	for i := 15; i >= 0 && carry > 0; i-- {
		s := uint64(b[i]) + carry&0xff
		b[i] = byte(s)
		carry = carry>>8 + s>>8
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

func (c Config) gateway4() netip.Addr { return nthAddr(c.Subnet4, 1) }
func (c Config) gateway6() netip.Addr { return nthAddr(c.Subnet6, 1) }

// slotAddrs are slot's addresses, with the subnets' prefix lengths.
func (c Config) slotAddrs(slot int) (netip.Prefix, netip.Prefix) {
	return netip.PrefixFrom(nthAddr(c.Subnet4, slot+2), c.Subnet4.Bits()),
		netip.PrefixFrom(nthAddr(c.Subnet6, slot+2), c.Subnet6.Bits())
}

// slotOf is the inverse of slotAddrs for an IPv4 or IPv6 sandbox address.
func (c Config) slotOf(a netip.Addr) (int, bool) {
	a = a.Unmap()
	var p netip.Prefix
	switch {
	case c.Subnet4.Contains(a):
		p = c.Subnet4
	case c.Subnet6.Contains(a):
		p = c.Subnet6
	default:
		return 0, false
	}
	x, y := a.As16(), p.Addr().As16()
	var n uint64
	for i := 0; i < 16; i++ {
		if n > maxSlots<<8 {
			return 0, false
		}
		n = n<<8 + uint64(x[i]-y[i])
	}
	if n < 2 || n-2 >= uint64(c.capacity()) {
		return 0, false
	}
	return int(n - 2), true
}

// slotName names slot's namespace file and host veth.
func (c Config) slotName(slot int) string { return c.Bridge + "-" + strconv.Itoa(slot) }

// parseSlotName is the inverse of slotName.
func (c Config) parseSlotName(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, c.Bridge+"-")
	if !ok || rest == "" || len(rest) > 1 && rest[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= maxSlots {
		return 0, false
	}
	return n, true
}

// carrierNames name the carrier port of the bridge and its veth peer
// (Manager.setupCarrier); neither can be a slotName or a warmName.
func (c Config) carrierNames() (port, peer string) { return c.Bridge + "-c", c.Bridge + "-cp" }

// warmName names a warm pool entry's namespace file and host veth; it can
// never be a slotName.
func (c Config) warmName(n int) string { return fmt.Sprintf("%sw%d", c.Bridge, n) }

func (c Config) isWarmName(name string) bool {
	rest, ok := strings.CutPrefix(name, c.Bridge+"w")
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}
