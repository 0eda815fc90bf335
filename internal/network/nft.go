package network

import (
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
)

// BlockedPrefixes are the destinations a sandbox cannot reach unless the
// operator allows them (Config.Allow): this host's networks and other
// private, link-local, metadata, special-purpose and multicast ranges.
// Cloud metadata services live at 169.254.169.254, fd00:ec2::254 (in
// fc00::/7) and 100.100.100.200 (in 100.64.0.0/10); IPv4-mapped and NAT64
// forms of IPv4 addresses are blocked as IPv6 prefixes.
var BlockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/3"), // multicast, reserved, broadcast
	netip.MustParsePrefix("::/127"),      // unspecified, loopback
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Names of the objects in the table.
const (
	setSandbox4  = "sandbox4" // vmap: sandbox IPv4 address -> jump to its slot chain
	setSandbox6  = "sandbox6" // vmap: sandbox IPv6 address -> jump to its slot chain
	setBlocked4  = "blocked4" // interval set of BlockedPrefixes
	setBlocked6  = "blocked6" //
	setAllow4    = "allow4"   // interval set of Config.Allow
	setAllow6    = "allow6"   //
	setDeny4     = "deny4"    // interval set of Config.Deny
	setDeny6     = "deny6"    //
	setTCPPorts  = "gw_tcp"   // gateway ports sandboxes may reach
	setUDPPorts  = "gw_udp"   //
	setOpen4     = "open4"    // sandbox addresses whose policy is allow-all
	setOpen6     = "open6"    //
	setProxied4  = "proxied4" // sandbox addresses whose ports 80 and 443 go to the egress proxy
	setProxied6  = "proxied6" //
	chainEgress  = "egress"   // destinations for a sandbox its policy lets through
	chainFromSB  = "from_sandbox"
	chainToSB    = "to_sandbox"
	chainInputSB = "input_sandbox"
)

// Each attached slot has a chain of its own, "s<slot>", which the verdict
// maps send its traffic to, and six sets "s<slot>_<kind>" that its policy
// fills: denied, allowed and resolved destinations of each family.
var slotSetKinds = [...]string{"d4", "d6", "a4", "a6", "r4", "r6"}

const (
	kindDeny4 = iota
	kindDeny6
	kindAllow4
	kindAllow6
	kindResolved4
	kindResolved6
)

func slotChain(slot int) string { return "s" + strconv.Itoa(slot) }

func slotSetName(slot, kind int) string { return slotChain(slot) + "_" + slotSetKinds[kind] }

// parseSlotObject is the slot of a slot chain or set name.
func parseSlotObject(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "s")
	if !ok {
		return 0, false
	}
	rest, _, _ = strings.Cut(rest, "_")
	if rest == "" || len(rest) > 1 && rest[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= maxSlots {
		return 0, false
	}
	return n, true
}

// slotSet is the set of kind for slot, with a batch ID unique among all the
// sets a batch may make.
func (rs *ruleset) slotSet(slot, kind int) *nftables.Set {
	s := &nftables.Set{Table: rs.table, ID: uint32(1000 + slot*len(slotSetKinds) + kind), Name: slotSetName(slot, kind)}
	switch kind {
	case kindDeny4, kindAllow4:
		s.Interval, s.KeyType = true, nftables.TypeIPAddr
	case kindDeny6, kindAllow6:
		s.Interval, s.KeyType = true, nftables.TypeIP6Addr
	case kindResolved4:
		s.HasTimeout, s.KeyType = true, nftables.TypeIPAddr
	case kindResolved6:
		s.HasTimeout, s.KeyType = true, nftables.TypeIP6Addr
	}
	return s
}

// slotKernel is what the kernel holds of one slot's policy.
type slotKernel struct {
	// spans of the interval sets, by kind (deny and allow only).
	spans [4][]span
	// resolved are the elements of the resolved sets.
	resolved []resolvedElem
	// open (allow-all) and proxied (ports 80 and 443 to the egress proxy)
	// are the slot addresses' membership of the sets of those names.
	open, proxied bool
}

type resolvedElem struct {
	addr    netip.Addr
	timeout time.Duration
}

// kernelOf is what the kernel must hold for policy p and the resolved
// addresses res.
func kernelOf(p egress.Policy, res []resolvedElem) slotKernel {
	var k slotKernel
	split := func(ps []netip.Prefix, k4, k6 int) {
		v4, v6 := splitFamily(ps)
		k.spans[k4], k.spans[k6] = spansOf(v4), spansOf(v6)
	}
	split(p.Deny, kindDeny4, kindDeny6)
	if p.DenyByDefault {
		split(p.Allow, kindAllow4, kindAllow6)
		k.resolved = res
	}
	k.open = !p.DenyByDefault
	k.proxied = p.HasNames()
	return k
}

// ruleset holds the table's objects as the Manager builds and later edits them.
type ruleset struct {
	table              *nftables.Table
	sandbox4, sandbox6 *nftables.Set
	allow4, allow6     *nftables.Set
	deny4, deny6       *nftables.Set
	blocked4, blocked6 *nftables.Set
	tcpPorts, udpPorts *nftables.Set
	open4, open6       *nftables.Set
	proxied4, proxied6 *nftables.Set
}

func newRuleset(table string) *ruleset {
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	// Set IDs are per batch; giving them here keeps the library's global
	// counter out of it (it is not safe for concurrent connections).
	return &ruleset{
		table:    t,
		sandbox4: &nftables.Set{Table: t, ID: 1, Name: setSandbox4, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict},
		sandbox6: &nftables.Set{Table: t, ID: 2, Name: setSandbox6, IsMap: true, KeyType: nftables.TypeIP6Addr, DataType: nftables.TypeVerdict},
		allow4:   &nftables.Set{Table: t, ID: 3, Name: setAllow4, Interval: true, KeyType: nftables.TypeIPAddr},
		allow6:   &nftables.Set{Table: t, ID: 4, Name: setAllow6, Interval: true, KeyType: nftables.TypeIP6Addr},
		blocked4: &nftables.Set{Table: t, ID: 5, Name: setBlocked4, Interval: true, KeyType: nftables.TypeIPAddr},
		blocked6: &nftables.Set{Table: t, ID: 6, Name: setBlocked6, Interval: true, KeyType: nftables.TypeIP6Addr},
		tcpPorts: &nftables.Set{Table: t, ID: 7, Name: setTCPPorts, KeyType: nftables.TypeInetService},
		udpPorts: &nftables.Set{Table: t, ID: 8, Name: setUDPPorts, KeyType: nftables.TypeInetService},
		open4:    &nftables.Set{Table: t, ID: 9, Name: setOpen4, KeyType: nftables.TypeIPAddr},
		open6:    &nftables.Set{Table: t, ID: 10, Name: setOpen6, KeyType: nftables.TypeIP6Addr},
		proxied4: &nftables.Set{Table: t, ID: 11, Name: setProxied4, KeyType: nftables.TypeIPAddr},
		proxied6: &nftables.Set{Table: t, ID: 12, Name: setProxied6, KeyType: nftables.TypeIP6Addr},
		deny4:    &nftables.Set{Table: t, ID: 13, Name: setDeny4, Interval: true, KeyType: nftables.TypeIPAddr},
		deny6:    &nftables.Set{Table: t, ID: 14, Name: setDeny6, Interval: true, KeyType: nftables.TypeIP6Addr},
	}
}

// sandboxElems is the verdict map element that sends a sandbox's traffic to
// its slot's chain.
func sandboxElems(a netip.Addr, slot int) []nftables.SetElement {
	return []nftables.SetElement{{Key: a.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: slotChain(slot)}}}
}

func addrElems(a netip.Addr) []nftables.SetElement {
	return []nftables.SetElement{{Key: a.AsSlice()}}
}

// install queues, on c, the whole table: created if missing, then deleted and
// made anew in the same batch, so that the swap is atomic. slots are the
// attached slots, with what their chains and sets hold from the start.
func (rs *ruleset) install(c *nftables.Conn, cfg Config, slots map[int]*slotKernel) error {
	c.AddTable(rs.table)
	c.DelTable(rs.table)
	c.AddTable(rs.table)

	// Chains come first: rules and verdict map elements jump to them.
	chs := rs.addChains(c)
	if err := rs.addSets(c, cfg); err != nil {
		return err
	}
	rs.addForwardRules(c, cfg, chs)
	rs.addInputRules(c, cfg, chs)
	rs.addNATRules(c, cfg, chs)
	for _, slot := range slices.Sorted(maps.Keys(slots)) {
		if err := rs.addSlot(c, cfg, slot, slots[slot]); err != nil {
			return err
		}
	}
	return nil
}

// chains are the table's chains that install's rules go into.
type chains struct {
	egress, fromSB, toSB, inputSB *nftables.Chain // regular, jumped to
	forward, input, pre, post     *nftables.Chain // base, on the hooks
}

// addChains queues the table's regular chains and its base chains.
func (rs *ruleset) addChains(c *nftables.Conn) chains {
	t := rs.table
	regular := func(name string) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t})
	}
	egress := regular(chainEgress)
	fromSB := regular(chainFromSB)
	toSB := regular(chainToSB)
	inputSB := regular(chainInputSB)
	accept := nftables.ChainPolicyAccept
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	return chains{egress: egress, fromSB: fromSB, toSB: toSB, inputSB: inputSB,
		forward: forward, input: input, pre: pre, post: post}
}

// addSets queues the table's sets: the operator's allowed and blocked
// prefixes and the gateway ports filled from cfg, the per-sandbox ones empty.
func (rs *ruleset) addSets(c *nftables.Conn, cfg Config) error {
	allow4, allow6 := byFamily(cfg.Allow)
	deny4, deny6 := byFamily(cfg.Deny)
	blocked4, blocked6 := splitFamily(BlockedPrefixes)
	tcpPorts := cfg.GatewayTCPPorts
	for _, s := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{
		{rs.sandbox4, nil},
		{rs.sandbox6, nil},
		{rs.allow4, intervalElems(allow4)},
		{rs.allow6, intervalElems(allow6)},
		{rs.deny4, intervalElems(deny4)},
		{rs.deny6, intervalElems(deny6)},
		{rs.blocked4, intervalElems(blocked4)},
		{rs.blocked6, intervalElems(blocked6)},
		{rs.tcpPorts, portElems(tcpPorts)},
		{rs.udpPorts, portElems(cfg.GatewayUDPPorts)},
		{rs.open4, nil},
		{rs.open6, nil},
		{rs.proxied4, nil},
		{rs.proxied6, nil},
	} {
		if err := c.AddSet(s.set, s.elems); err != nil {
			return fmt.Errorf("adding set %s: %w", s.set.Name, err)
		}
	}

	return nil
}

// byFamily splits prefixes into IPv4 ones (IPv4-mapped IPv6 prefixes
// among them, unmapped) and IPv6 ones.
func byFamily(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		switch {
		case p.Addr().Is4():
			v4 = append(v4, p)
		case p.Addr().Is4In6() && p.Bits() >= 96:
			v4 = append(v4, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96))
		default:
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// splitFamily splits ps by the family they are written in: unlike
// byFamily, it leaves an IPv4-mapped IPv6 prefix (BlockedPrefixes'
// ::ffff:0:0/96) IPv6.
func splitFamily(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// cat joins expression lists into one rule's expressions.
func cat(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

// addForwardRules queues the base filter chains' jumps for bridge traffic and
// what is routed through the bridge: from sandboxes (to their slot's chain,
// then egress), and into them.
func (rs *ruleset) addForwardRules(c *nftables.Conn, cfg Config, chs chains) {
	br := cfg.Bridge
	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch, Exprs: exprs})
	}
	forward, input, fromSB, egress, toSB := chs.forward, chs.input, chs.fromSB, chs.egress, chs.toSB

	// The base chains only look at traffic to or from the bridge; the host's
	// other traffic passes untouched (policy accept).
	add(forward, cat(ifname(expr.MetaKeyIIFNAME, br), jump(chainFromSB))...)
	add(forward, cat(ifname(expr.MetaKeyOIFNAME, br), jump(chainToSB))...)
	add(input, cat(ifname(expr.MetaKeyIIFNAME, br), jump(chainInputSB))...)

	// Sandbox to anywhere but the host. First sandbox to sandbox, routed
	// through the gateway or, with br_netfilter, bridged; the bridge's
	// isolated ports already stop the latter at layer 2.
	addReject(c, fromSB, ifname(expr.MetaKeyOIFNAME, br)...)
	add(fromSB, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	// Only a known sandbox address goes on, to its slot's chain; anything
	// else (a released sandbox, a spoofed source) is dropped.
	add(fromSB, cat(nfproto(unix.NFPROTO_IPV4), ip4Saddr(), vmap(rs.sandbox4))...)
	add(fromSB, cat(nfproto(unix.NFPROTO_IPV6), ip6Saddr(), vmap(rs.sandbox6))...)
	add(fromSB, verdict(expr.VerdictDrop)...)

	// What every sandbox's policy lets through still passes here: the
	// denied prefixes are refused, whatever else is allowed, and the
	// operator's blocked prefixes are refused unless the operator allowed
	// them.
	addReject(c, egress, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), lookup(rs.deny4))...)
	addReject(c, egress, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), lookup(rs.deny6))...)
	add(egress, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), lookup(rs.allow4), verdict(expr.VerdictAccept))...)
	add(egress, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), lookup(rs.allow6), verdict(expr.VerdictAccept))...)
	addReject(c, egress, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), lookup(rs.blocked4))...)
	addReject(c, egress, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), lookup(rs.blocked6))...)
	add(egress, verdict(expr.VerdictAccept)...)

	// Into sandboxes from other interfaces: replies only. The host itself
	// reaches sandboxes through the output hook, which this table leaves be.
	add(toSB, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	add(toSB, verdict(expr.VerdictDrop)...)
}

// addInputRules queues what sandboxes may send to the host itself.
func (rs *ruleset) addInputRules(c *nftables.Conn, cfg Config, chs chains) {
	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch, Exprs: exprs})
	}
	inputSB := chs.inputSB

	// Sandbox to the host: replies, neighbour discovery, ping and the
	// gateway ports, on the gateway addresses only. Router solicitations and
	// advertisements and redirects are dropped first.
	for _, typ := range []byte{133, 134, 137} {
		add(inputSB, cat(l4proto(unix.IPPROTO_ICMPV6), icmpType(typ), verdict(expr.VerdictDrop))...)
	}
	add(inputSB, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	for _, typ := range []byte{135, 136} { // neighbour solicitation, advertisement
		add(inputSB, cat(l4proto(unix.IPPROTO_ICMPV6), icmpType(typ), verdict(expr.VerdictAccept))...)
	}
	gw4, gw6 := cfg.gateway4().AsSlice(), cfg.gateway6().AsSlice()
	add(inputSB, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), cmpEq(gw4), l4proto(unix.IPPROTO_ICMP), icmpType(8), verdict(expr.VerdictAccept))...)
	add(inputSB, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), cmpEq(gw6), l4proto(unix.IPPROTO_ICMPV6), icmpType(128), verdict(expr.VerdictAccept))...)
	for _, gw := range []struct {
		proto byte
		daddr []expr.Any
	}{
		{unix.NFPROTO_IPV4, cat(ip4Daddr(), cmpEq(gw4))},
		{unix.NFPROTO_IPV6, cat(ip6Daddr(), cmpEq(gw6))},
	} {
		add(inputSB, cat(nfproto(gw.proto), gw.daddr, l4proto(unix.IPPROTO_TCP), dport(), lookup(rs.tcpPorts), verdict(expr.VerdictAccept))...)
		add(inputSB, cat(nfproto(gw.proto), gw.daddr, l4proto(unix.IPPROTO_UDP), dport(), lookup(rs.udpPorts), verdict(expr.VerdictAccept))...)
		// The egress proxy takes only what prerouting sent it.
		add(inputSB, cat(nfproto(gw.proto), gw.daddr, l4proto(unix.IPPROTO_TCP), dport(), cmpEq(port(cfg.ProxyPort)),
			ctStatus(ipsDstNAT), verdict(expr.VerdictAccept))...)
	}
	// Broadcast and multicast (MLD reports, say) are dropped quietly.
	add(inputSB, &expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.PACKET_HOST}}, &expr.Verdict{Kind: expr.VerdictDrop})
	addReject(c, inputSB)
}

// addNATRules queues the address translations: web traffic of sandboxes
// whose policy names hosts to the egress proxy, and masquerade on the way out.
func (rs *ruleset) addNATRules(c *nftables.Conn, cfg Config, chs chains) {
	br := cfg.Bridge
	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch, Exprs: exprs})
	}
	pre, post := chs.pre, chs.post
	gw4, gw6 := cfg.gateway4().AsSlice(), cfg.gateway6().AsSlice()

	// Ports 80 and 443 of sandboxes whose policy allows names go to the
	// egress proxy on the gateway, which checks Host and SNI.
	for _, fam := range []struct {
		proto byte
		saddr []expr.Any
		set   *nftables.Set
		gw    []byte
	}{
		{unix.NFPROTO_IPV4, ip4Saddr(), rs.proxied4, gw4},
		{unix.NFPROTO_IPV6, ip6Saddr(), rs.proxied6, gw6},
	} {
		for _, p := range []uint16{80, 443} {
			add(pre, cat(ifname(expr.MetaKeyIIFNAME, br), nfproto(fam.proto), fam.saddr, lookup(fam.set),
				l4proto(unix.IPPROTO_TCP), dport(), cmpEq(port(p)),
				[]expr.Any{
					&expr.Immediate{Register: 1, Data: fam.gw},
					&expr.Immediate{Register: 2, Data: port(cfg.ProxyPort)},
					&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam.proto), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
				})...)
		}
	}

	// Sandboxes leave through any other interface with the host's address.
	add(post, cat(nfproto(unix.NFPROTO_IPV4), ip4Saddr(), prefixMatch(cfg.Subnet4), ifnameNot(expr.MetaKeyOIFNAME, br), []expr.Any{&expr.Masq{}})...)
	add(post, cat(nfproto(unix.NFPROTO_IPV6), ip6Saddr(), prefixMatch(cfg.Subnet6), ifnameNot(expr.MetaKeyOIFNAME, br), []expr.Any{&expr.Masq{}})...)
}

// addReject queues rules that refuse what match matches, at once instead of
// letting it hang until a timeout: TCP gets a reset, anything else ICMP
// "administratively prohibited".
func addReject(c *nftables.Conn, ch *nftables.Chain, match ...expr.Any) {
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: slices.Concat(match, l4proto(unix.IPPROTO_TCP),
		[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})})
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: slices.Concat(match,
		[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})})
}

// addSlot queues slot's chain and sets, filled as k says, and the verdict map
// elements that send its addresses' traffic there.
func (rs *ruleset) addSlot(c *nftables.Conn, cfg Config, slot int, k *slotKernel) error {
	t := rs.table
	ch := c.AddChain(&nftables.Chain{Name: slotChain(slot), Table: t})
	var sets [len(slotSetKinds)]*nftables.Set
	for kind := range sets {
		sets[kind] = rs.slotSet(slot, kind)
		if err := c.AddSet(sets[kind], nil); err != nil {
			return fmt.Errorf("adding set %s: %w", sets[kind].Name, err)
		}
	}
	if err := rs.fillSlot(c, cfg, slot, sets, k); err != nil {
		return err
	}
	add := func(exprs ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs}) }
	v4, v6 := nfproto(unix.NFPROTO_IPV4), nfproto(unix.NFPROTO_IPV6)
	addReject(c, ch, cat(v4, ip4Daddr(), lookup(sets[kindDeny4]))...)
	addReject(c, ch, cat(v6, ip6Daddr(), lookup(sets[kindDeny6]))...)
	add(cat(v4, ip4Saddr(), lookup(rs.open4), jump(chainEgress))...)
	add(cat(v6, ip6Saddr(), lookup(rs.open6), jump(chainEgress))...)
	add(cat(v4, ip4Daddr(), lookup(sets[kindAllow4]), jump(chainEgress))...)
	add(cat(v6, ip6Daddr(), lookup(sets[kindAllow6]), jump(chainEgress))...)
	add(cat(v4, ip4Daddr(), lookup(sets[kindResolved4]), jump(chainEgress))...)
	add(cat(v6, ip6Daddr(), lookup(sets[kindResolved6]), jump(chainEgress))...)
	addReject(c, ch)
	a4, a6 := cfg.slotAddrs(slot)
	if err := c.SetAddElements(rs.sandbox4, sandboxElems(a4.Addr(), slot)); err != nil {
		return err
	}
	return c.SetAddElements(rs.sandbox6, sandboxElems(a6.Addr(), slot))
}

// fillSlot queues the elements of k into slot's sets, which must be empty,
// and the membership of its addresses in the open and proxied sets, which
// must be absent.
func (rs *ruleset) fillSlot(c *nftables.Conn, cfg Config, slot int, sets [len(slotSetKinds)]*nftables.Set, k *slotKernel) error {
	for kind, sp := range k.spans {
		size := 32
		if kind == kindDeny6 || kind == kindAllow6 {
			size = 128
		}
		if el := spanElems(sp, size); len(el) > 0 {
			if err := c.SetAddElements(sets[kind], el); err != nil {
				return err
			}
		}
	}
	var r4, r6 []nftables.SetElement
	for _, r := range k.resolved {
		el := nftables.SetElement{Key: r.addr.AsSlice(), Timeout: max(r.timeout, time.Second)}
		if r.addr.Is4() {
			r4 = append(r4, el)
		} else {
			r6 = append(r6, el)
		}
	}
	if len(r4) > 0 {
		if err := c.SetAddElements(sets[kindResolved4], r4); err != nil {
			return err
		}
	}
	if len(r6) > 0 {
		if err := c.SetAddElements(sets[kindResolved6], r6); err != nil {
			return err
		}
	}
	return rs.members(cfg, slot, k, c.SetAddElements)
}

// members applies op (adding or deleting elements) to slot's addresses in
// the open and proxied sets k says they are members of.
func (rs *ruleset) members(cfg Config, slot int, k *slotKernel, op func(*nftables.Set, []nftables.SetElement) error) error {
	a4, a6 := cfg.slotAddrs(slot)
	for _, m := range []struct {
		in     bool
		s4, s6 *nftables.Set
	}{{k.open, rs.open4, rs.open6}, {k.proxied, rs.proxied4, rs.proxied6}} {
		if !m.in {
			continue
		}
		if err := op(m.s4, addrElems(a4.Addr())); err != nil {
			return err
		}
		if err := op(m.s6, addrElems(a6.Addr())); err != nil {
			return err
		}
	}
	return nil
}

// refillSlot queues the change of slot's kernel state from old to k, in one
// batch with nothing in between visible to packets.
func (rs *ruleset) refillSlot(c *nftables.Conn, cfg Config, slot int, old, k *slotKernel) error {
	var sets [len(slotSetKinds)]*nftables.Set
	for kind := range sets {
		sets[kind] = rs.slotSet(slot, kind)
		c.FlushSet(sets[kind])
	}
	if err := rs.members(cfg, slot, old, c.SetDeleteElements); err != nil {
		return err
	}
	return rs.fillSlot(c, cfg, slot, sets, k)
}

// delSlot queues the removal of slot's verdict map elements, membership,
// chain and sets, as far as had (nil: all of them) says they exist. A
// missing object fails the whole batch.
func (rs *ruleset) delSlot(c *nftables.Conn, cfg Config, slot int, had *slotKernel) error {
	a4, a6 := cfg.slotAddrs(slot)
	if err := c.SetDeleteElements(rs.sandbox4, addrElems(a4.Addr())); err != nil {
		return err
	}
	if err := c.SetDeleteElements(rs.sandbox6, addrElems(a6.Addr())); err != nil {
		return err
	}
	if err := rs.members(cfg, slot, had, c.SetDeleteElements); err != nil {
		return err
	}
	c.DelChain(&nftables.Chain{Name: slotChain(slot), Table: rs.table})
	for kind := range slotSetKinds {
		c.DelSet(rs.slotSet(slot, kind))
	}
	return nil
}

// Expression builders, each loading into register 1 or testing it.

func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)}}
}

func ifnameNot(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifnameBytes(name)}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func network(offset, n uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n}}
}

func ip4Saddr() []expr.Any { return network(12, 4) }
func ip4Daddr() []expr.Any { return network(16, 4) }
func ip6Saddr() []expr.Any { return network(8, 16) }
func ip6Daddr() []expr.Any { return network(24, 16) }

func dport() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

func icmpType(t byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{t}},
	}
}

func cmpEq(b []byte) []expr.Any { return []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}} }

func prefixMatch(p netip.Prefix) []expr.Any {
	n := p.Addr().BitLen() / 8
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(n), Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func ctState(bits uint32) []expr.Any { return ctAny(expr.CtKeySTATE, bits) }

// ctAny matches a connection whose conntrack key (a bit field) has any of
// bits set.
func ctAny(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func port(p uint16) []byte { return binaryutil.BigEndian.PutUint16(p) }

// ipsDstNAT is IPS_DST_NAT of the conntrack status bits.
const ipsDstNAT = 1 << 5

func ctStatus(bits uint32) []expr.Any { return ctAny(expr.CtKeySTATUS, bits) }

func lookup(s *nftables.Set) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

func vmap(s *nftables.Set) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, DestRegister: 0, IsDestRegSet: true}}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func portElems(ports []uint16) []nftables.SetElement {
	var out []nftables.SetElement
	seen := map[uint16]bool{}
	for _, p := range ports {
		if !seen[p] {
			seen[p] = true
			out = append(out, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
		}
	}
	return out
}

// A span is a range of addresses of one family, [lo, hi).
type span struct{ lo, hi *big.Int }

// spansOf merges prefixes of one family into sorted, disjoint spans
// (overlapping and adjacent ones merged: the kernel refuses overlaps).
func spansOf(ps []netip.Prefix) []span {
	if len(ps) == 0 {
		return nil
	}
	size := ps[0].Addr().BitLen()
	var spans []span
	for _, p := range ps {
		p = p.Masked()
		lo := new(big.Int).SetBytes(p.Addr().AsSlice())
		hi := new(big.Int).Add(lo, new(big.Int).Lsh(big.NewInt(1), uint(size-p.Bits())))
		spans = append(spans, span{lo, hi})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Cmp(b.lo) })
	merged := spans[:1]
	for _, s := range spans[1:] {
		last := &merged[len(merged)-1]
		if s.lo.Cmp(last.hi) <= 0 {
			if s.hi.Cmp(last.hi) > 0 {
				last.hi = s.hi
			}
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

// spanElems turns spans of size-bit addresses into interval set elements:
// each a start element and an end element one past its last address, left
// out where the span reaches the top of the space.
func spanElems(spans []span, size int) []nftables.SetElement {
	top := new(big.Int).Lsh(big.NewInt(1), uint(size))
	key := func(x *big.Int) []byte { return x.FillBytes(make([]byte, size/8)) }
	var out []nftables.SetElement
	for _, s := range spans {
		out = append(out, nftables.SetElement{Key: key(s.lo)})
		if s.hi.Cmp(top) < 0 {
			out = append(out, nftables.SetElement{Key: key(s.hi), IntervalEnd: true})
		}
	}
	return out
}

// elemSpans is the inverse of spanElems, for the elements of an interval set
// as the kernel lists them (in any order).
func elemSpans(elems []nftables.SetElement, size int) []span {
	type edge struct {
		at  *big.Int
		end bool
	}
	var edges []edge
	for _, e := range elems {
		edges = append(edges, edge{new(big.Int).SetBytes(e.Key), e.IntervalEnd})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Cmp(b.at); c != 0 {
			return c
		}
		// At one address an end comes before the next start.
		if a.end != b.end {
			if a.end {
				return -1
			}
			return 1
		}
		return 0
	})
	top := new(big.Int).Lsh(big.NewInt(1), uint(size))
	var out []span
	var open *big.Int
	for _, e := range edges {
		switch {
		case !e.end && open == nil:
			open = e.at
		case e.end && open != nil:
			out = append(out, span{open, e.at})
			open = nil
		}
	}
	if open != nil {
		out = append(out, span{open, top})
	}
	return out
}

// intervalElems turns prefixes of one family into interval set elements.
func intervalElems(ps []netip.Prefix) []nftables.SetElement {
	if len(ps) == 0 {
		return nil
	}
	return spanElems(spansOf(ps), ps[0].Addr().BitLen())
}
