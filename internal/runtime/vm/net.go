package vm

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// A sandbox's network is the namespace package network made for it, with
// eth0 (a veth whose host end the firewall and the egress policy watch) and
// eth0's addresses and routes. The VM joins it through a tap device in that
// namespace whose traffic and eth0's are redirected into each other by tc
// (mirred), as Kata Containers does: the guest's virtio-net, with eth0's MAC
// address (its slot's: see package network), takes eth0's addresses and
// routes, and the host sees the same sandbox on the same veth as under the
// ns runtime. QEMU runs in the namespace, so that it opens the tap there.
const (
	sandboxLink = "eth0"
	tapName     = "tap0"
)

// netnsName holds, in the run directory, the namespace the tap was made in,
// for Cleanup.
const netnsName = "netns"

// plumb makes the tap and the redirects in n's namespace and returns what
// the guest needs to configure its eth0, eth0's MAC (its slot's) included:
// a booting guest's device is made with it, a restored guest takes it
// (vminit's readdressNet) in place of the one it was saved with.
func plumb(n *runtime.Network, hostname string) (*vminit.Net, error) {
	var out vminit.Net
	err := netns.Run(n.Netns, func() error {
		eth0, err := netlink.LinkByName(sandboxLink)
		if err != nil {
			return fmt.Errorf("the namespace has no %s: %w", sandboxLink, err)
		}
		out.MAC = eth0.Attrs().HardwareAddr.String()
		out.MTU = eth0.Attrs().MTU
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				continue
			}
			out.Addrs = append(out.Addrs, a.IPNet.String())
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Gw != nil && (r.Dst == nil || isDefault(r.Dst)) {
				out.Gateways = append(out.Gateways, r.Gw.String())
			}
		}
		unplumbHere()
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = tapName, out.MTU
		tap := &netlink.Tuntap{LinkAttrs: la, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("making %s: %w", tapName, err)
		}
		tl, err := netlink.LinkByName(tapName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(tl); err != nil {
			return err
		}
		for _, pair := range [][2]netlink.Link{{eth0, tl}, {tl, eth0}} {
			if err := redirect(pair[0], pair[1]); err != nil {
				return fmt.Errorf("redirecting %s to %s: %w", pair[0].Attrs().Name, pair[1].Attrs().Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("joining the sandbox's network: %w", err)
	}
	if len(out.Addrs) == 0 {
		return nil, errors.New("joining the sandbox's network: eth0 has no addresses")
	}
	out.Hostname, out.ResolvConf, out.Hosts = hostname, n.ResolvConf(), n.Hosts(hostname)
	return &out, nil
}

func isDefault(d *net.IPNet) bool {
	ones, _ := d.Mask.Size()
	return ones == 0
}

// redirect sends every frame arriving on from out of to.
func redirect(from, to netlink.Link) error {
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS,
	}}
	if err := netlink.QdiscAdd(q); err != nil {
		return err
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index, Parent: netlink.MakeHandle(0xffff, 0),
			Priority: 1, Protocol: unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to.Attrs().Index,
		}},
	}
	return netlink.FilterAdd(f)
}

// unplumbHere removes the tap and eth0's redirect from the current
// namespace, if there.
func unplumbHere() {
	if l, err := netlink.LinkByName(tapName); err == nil {
		_ = netlink.LinkDel(l)
	}
	if l, err := netlink.LinkByName(sandboxLink); err == nil {
		_ = netlink.QdiscDel(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS,
		}})
	}
}

// unplumb undoes plumb in the namespace at path, if it still exists.
func unplumb(path string) error {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return netns.Run(path, func() error {
		unplumbHere()
		return nil
	})
}
