package network

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// PeerSubnets lists the subnets of this namespace's interfaces that hold
// addrs, for Config.Deny: the addresses a server listens on are where its
// peers reach it, and so where they are (the other nodes of a cluster, the
// PostgreSQL they share). An unspecified address stands for every address
// of the namespace. Loopback and link-local addresses are left out
// (BlockedPrefixes has them, and the firewall keeps sandboxes from the
// host's own addresses), and so are those of the link named skip, the
// sandboxes' bridge. An address no interface holds is taken alone, as a
// /32 or /128.
func PeerSubnets(addrs []netip.Addr, skip string) ([]netip.Prefix, error) {
	held, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	skipIndex := -1
	if l, err := netlink.LinkByName(skip); err == nil {
		skipIndex = l.Attrs().Index
	}
	var out []netip.Prefix
	add := func(p netip.Prefix) {
		for _, q := range out {
			if q == p {
				return
			}
		}
		out = append(out, p)
	}
	for _, a := range addrs {
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() {
			continue
		}
		found := false
		for _, h := range held {
			ha, ok := netip.AddrFromSlice(h.IP)
			if !ok || h.LinkIndex == skipIndex {
				continue
			}
			ha = ha.Unmap()
			if ha.IsLoopback() || ha.IsLinkLocalUnicast() || !(a.IsUnspecified() || a == ha) {
				continue
			}
			bits, _ := h.Mask.Size()
			add(netip.PrefixFrom(ha, bits).Masked())
			found = true
		}
		if !found && !a.IsUnspecified() {
			add(netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out, nil
}
