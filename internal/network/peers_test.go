package network

import (
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestPeerSubnets lists, in a namespace of its own, the subnets of the
// addresses a server could listen on.
func TestPeerSubnets(t *testing.T) {
	testenv.RequireRoot(t)
	if err := netns.PrepareDir(testNetnsIn); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(testNetnsIn, "atollt-"+uniqueID(t)+"-peers")
	// Two links with a node network each, and one standing for the
	// sandboxes' bridge.
	links := map[string][]string{
		"eth0": {"203.0.113.7/24", "2001:db8:1::7/64"},
		"eth1": {"10.250.0.11/16"},
		"br9":  {"10.213.0.1/16"},
	}
	err := netns.Create(p, func() error {
		for name, addrs := range links {
			attrs := netlink.NewLinkAttrs()
			attrs.Name = name
			// A veth: this kernel may lack the dummy driver.
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "p"}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				pf := netip.MustParsePrefix(a)
				ipn := &net.IPNet{IP: pf.Addr().AsSlice(), Mask: net.CIDRMask(pf.Bits(), pf.Addr().BitLen())}
				// No duplicate address detection: the address is usable at once.
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: 0x80}); err != nil {
					return err
				}
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(p) })

	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	prefixes := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, a := range s {
			out = append(out, netip.MustParsePrefix(a))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		listen []netip.Addr
		want   []netip.Prefix
	}{
		{"loopback only: nothing", addrs("127.0.0.1", "::1"), nil},
		{"one address: its subnet", addrs("10.250.0.11"), prefixes("10.250.0.0/16")},
		{"IPv6", addrs("2001:db8:1::7"), prefixes("2001:db8:1::/64")},
		{"the same twice", addrs("203.0.113.7", "203.0.113.7"), prefixes("203.0.113.0/24")},
		{"an address no link holds: alone", addrs("192.0.2.9"), prefixes("192.0.2.9/32")},
		{"unspecified: every link but the bridge", addrs("::"), prefixes("10.250.0.0/16", "203.0.113.0/24", "2001:db8:1::/64")},
		{"the bridge's own: alone", addrs("10.213.0.1"), prefixes("10.213.0.1/32")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []netip.Prefix
			if err := netns.Run(p, func() (err error) {
				got, err = PeerSubnets(tc.listen, "br9")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			sortPrefixes := cmp.Transformer("sort", func(in []netip.Prefix) map[netip.Prefix]bool {
				m := map[netip.Prefix]bool{}
				for _, p := range in {
					m[p] = true
				}
				return m
			})
			if diff := cmp.Diff(tc.want, got, sortPrefixes); diff != "" {
				t.Errorf("PeerSubnets(%v) (-want +got):\n%s", tc.listen, diff)
			}
		})
	}
}
