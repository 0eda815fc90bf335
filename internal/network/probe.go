package network

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/netns"
)

// Probe reports whether the kernel has what enforcing the network model
// needs: nf_tables with the inet family, connection tracking and its netlink
// interface, NAT (masquerade) for IPv4 and IPv6, sets and verdict maps,
// reject, and bridges with isolated ports. It tries each in a throwaway
// network namespace, so it touches nothing of the host's, and returns an
// error wrapping errdefs.ErrUnavailable that names what is missing. New
// refuses to start without them: the network fails closed.
func Probe() error {
	fd, err := netns.Temp()
	if err != nil {
		return fmt.Errorf("%w: network namespaces: %v", errdefs.ErrUnavailable, err)
	}
	defer unix.Close(fd)

	var missing []string
	nft := func(what string, build func(c *nftables.Conn, t *nftables.Table)) {
		c, err := nftables.New(nftables.WithNetNSFd(fd))
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", what, err))
			return
		}
		t := &nftables.Table{Name: "probe", Family: nftables.TableFamilyINet}
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
		build(c, t)
		if err := c.Flush(); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", what, err))
		}
	}
	nft("nf_tables with the inet family", func(c *nftables.Conn, t *nftables.Table) {})
	nft("connection tracking (nf_conntrack, nft_ct)", func(c *nftables.Conn, t *nftables.Table) {
		ch := c.AddChain(&nftables.Chain{Name: "f", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(ctState(expr.CtStateBitESTABLISHED), verdict(expr.VerdictAccept)...)})
	})
	nft("NAT (nft_chain_nat, nft_masq)", func(c *nftables.Conn, t *nftables.Table) {
		ch := c.AddChain(&nftables.Chain{Name: "n", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(nfproto(unix.NFPROTO_IPV4), &expr.Masq{})})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(nfproto(unix.NFPROTO_IPV6), &expr.Masq{})})
	})
	nft("reject (nft_reject_inet)", func(c *nftables.Conn, t *nftables.Table) {
		ch := c.AddChain(&nftables.Chain{Name: "r", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}})
	})
	if len(missing) == 0 {
		// Everything together, as the Manager installs it: sets, verdict
		// maps, intervals and all.
		nft("nftables sets, verdict maps, element timeouts and destination NAT (nft_set_hash, nft_set_rbtree, nft_nat)", func(c *nftables.Conn, t *nftables.Table) {
			cfg, _ := Config{Table: "probe"}.withDefaults()
			slot := &slotKernel{
				spans:    [4][]span{kindDeny4: spansOf([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})},
				resolved: []resolvedElem{{addr: netip.MustParseAddr("192.0.2.1"), timeout: time.Minute}},
				open:     true, proxied: true,
			}
			if err := newRuleset("probe").install(c, cfg, map[int]*slotKernel{0: slot}); err != nil {
				missing = append(missing, err.Error())
			}
		})
	}
	if c, err := conntrack.Dial(&mdnetlink.Config{NetNS: fd}); err != nil {
		missing = append(missing, fmt.Sprintf("conntrack netlink (nf_conntrack_netlink) (%v)", err))
	} else {
		if _, err := c.Dump(nil); err != nil {
			missing = append(missing, fmt.Sprintf("conntrack netlink (nf_conntrack_netlink) (%v)", err))
		}
		c.Close()
	}
	if err := probeBridge(fd); err != nil {
		missing = append(missing, fmt.Sprintf("bridges with isolated veth ports (%v)", err))
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the kernel lacks what sandbox network enforcement needs: %s",
			errdefs.ErrUnavailable, strings.Join(missing, "; "))
	}
	return nil
}

func probeBridge(fd int) error {
	h, err := netlink.NewHandleAt(vnetns.NsHandle(fd))
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.NewLinkAttrs()}
	br.Name = "probe0"
	if err := h.LinkAdd(br); err != nil {
		return err
	}
	v := &netlink.Veth{LinkAttrs: netlink.NewLinkAttrs(), PeerName: "probe2"}
	v.Name = "probe1"
	if err := h.LinkAdd(v); err != nil {
		return err
	}
	if err := h.LinkSetMaster(v, br); err != nil {
		return err
	}
	return h.LinkSetIsolated(v, true)
}
