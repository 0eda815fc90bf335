package network

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
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
	setSandbox4  = "sandbox4" // vmap: sandbox IPv4 address -> jump egress
	setSandbox6  = "sandbox6" // vmap: sandbox IPv6 address -> jump egress
	setBlocked4  = "blocked4" // interval set of BlockedPrefixes
	setBlocked6  = "blocked6" //
	setAllow4    = "allow4"   // interval set of Config.Allow
	setAllow6    = "allow6"   //
	setTCPPorts  = "gw_tcp"   // gateway ports sandboxes may reach
	setUDPPorts  = "gw_udp"   //
	chainEgress  = "egress"   // destinations for a known sandbox
	chainFromSB  = "from_sandbox"
	chainToSB    = "to_sandbox"
	chainInputSB = "input_sandbox"
)

// ruleset holds the table's objects as the Manager builds and later edits them.
type ruleset struct {
	table              *nftables.Table
	sandbox4, sandbox6 *nftables.Set
	allow4, allow6     *nftables.Set
	blocked4, blocked6 *nftables.Set
	tcpPorts, udpPorts *nftables.Set
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
	}
}

// sandboxElems is the verdict map element that lets a sandbox's address
// through to the egress checks.
func sandboxElems(a netip.Addr) []nftables.SetElement {
	return []nftables.SetElement{{Key: a.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chainEgress}}}
}

// install queues, on c, the whole table: created if missing, then deleted and
// made anew in the same batch, so that the swap is atomic. sandboxes are the
// slots whose elements go in from the start.
func (rs *ruleset) install(c *nftables.Conn, cfg Config, sandboxes []int) error {
	c.AddTable(rs.table)
	c.DelTable(rs.table)
	c.AddTable(rs.table)

	// Chains come first: rules and verdict map elements jump to them.
	br := cfg.Bridge
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
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})

	var sb4, sb6 []nftables.SetElement
	for _, slot := range sandboxes {
		a4, a6 := cfg.slotAddrs(slot)
		sb4 = append(sb4, sandboxElems(a4.Addr())...)
		sb6 = append(sb6, sandboxElems(a6.Addr())...)
	}
	var allow4, allow6 []netip.Prefix
	for _, p := range cfg.Allow {
		switch {
		case p.Addr().Is4():
			allow4 = append(allow4, p)
		case p.Addr().Is4In6() && p.Bits() >= 96:
			allow4 = append(allow4, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96))
		default:
			allow6 = append(allow6, p)
		}
	}
	var blocked4, blocked6 []netip.Prefix
	for _, p := range BlockedPrefixes {
		if p.Addr().Is4() {
			blocked4 = append(blocked4, p)
		} else {
			blocked6 = append(blocked6, p)
		}
	}
	for _, s := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{
		{rs.sandbox4, sb4},
		{rs.sandbox6, sb6},
		{rs.allow4, intervalElems(allow4)},
		{rs.allow6, intervalElems(allow6)},
		{rs.blocked4, intervalElems(blocked4)},
		{rs.blocked6, intervalElems(blocked6)},
		{rs.tcpPorts, portElems(cfg.GatewayTCPPorts)},
		{rs.udpPorts, portElems(cfg.GatewayUDPPorts)},
	} {
		if err := c.AddSet(s.set, s.elems); err != nil {
			return fmt.Errorf("adding set %s: %w", s.set.Name, err)
		}
	}

	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	cat := func(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }
	// Refused connections fail at once instead of hanging until a timeout:
	// TCP gets a reset, anything else ICMP "administratively prohibited".
	addReject := func(ch *nftables.Chain, match ...expr.Any) {
		add(ch, cat(match, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})...)
		add(ch, cat(match, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})...)
	}

	// The base chains only look at traffic to or from the bridge; the host's
	// other traffic passes untouched (policy accept).
	add(forward, cat(ifname(expr.MetaKeyIIFNAME, br), jump(chainFromSB))...)
	add(forward, cat(ifname(expr.MetaKeyOIFNAME, br), jump(chainToSB))...)
	add(input, cat(ifname(expr.MetaKeyIIFNAME, br), jump(chainInputSB))...)

	// Sandbox to anywhere but the host. First sandbox to sandbox, routed
	// through the gateway or, with br_netfilter, bridged; the bridge's
	// isolated ports already stop the latter at layer 2.
	addReject(fromSB, ifname(expr.MetaKeyOIFNAME, br)...)
	add(fromSB, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	// Only a known sandbox address goes on, to egress; anything else (a
	// released sandbox, a spoofed source) is dropped.
	add(fromSB, cat(nfproto(unix.NFPROTO_IPV4), ip4Saddr(), vmap(rs.sandbox4))...)
	add(fromSB, cat(nfproto(unix.NFPROTO_IPV6), ip6Saddr(), vmap(rs.sandbox6))...)
	add(fromSB, verdict(expr.VerdictDrop)...)

	add(egress, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), lookup(rs.allow4), verdict(expr.VerdictAccept))...)
	add(egress, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), lookup(rs.allow6), verdict(expr.VerdictAccept))...)
	addReject(egress, cat(nfproto(unix.NFPROTO_IPV4), ip4Daddr(), lookup(rs.blocked4))...)
	addReject(egress, cat(nfproto(unix.NFPROTO_IPV6), ip6Daddr(), lookup(rs.blocked6))...)
	add(egress, verdict(expr.VerdictAccept)...)

	// Into sandboxes from other interfaces: replies only. The host itself
	// reaches sandboxes through the output hook, which this table leaves be.
	add(toSB, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	add(toSB, verdict(expr.VerdictDrop)...)

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
	}
	// Broadcast and multicast (MLD reports, say) are dropped quietly.
	add(inputSB, &expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.PACKET_HOST}}, &expr.Verdict{Kind: expr.VerdictDrop})
	addReject(inputSB)

	// Sandboxes leave through any other interface with the host's address.
	add(post, cat(nfproto(unix.NFPROTO_IPV4), ip4Saddr(), prefixMatch(cfg.Subnet4), ifnameNot(expr.MetaKeyOIFNAME, br), []expr.Any{&expr.Masq{}})...)
	add(post, cat(nfproto(unix.NFPROTO_IPV6), ip6Saddr(), prefixMatch(cfg.Subnet6), ifnameNot(expr.MetaKeyOIFNAME, br), []expr.Any{&expr.Masq{}})...)
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

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

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

// intervalElems turns prefixes of one family into interval set elements:
// overlapping and adjacent prefixes are merged (the kernel refuses
// overlaps), each range is a start element and an end element one past its
// last address, left out where the range reaches the top of the space.
func intervalElems(ps []netip.Prefix) []nftables.SetElement {
	if len(ps) == 0 {
		return nil
	}
	type span struct{ lo, hi *big.Int } // hi is exclusive
	size := ps[0].Addr().BitLen()
	top := new(big.Int).Lsh(big.NewInt(1), uint(size))
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
	key := func(x *big.Int) []byte { return x.FillBytes(make([]byte, size/8)) }
	var out []nftables.SetElement
	for _, s := range merged {
		out = append(out, nftables.SetElement{Key: key(s.lo)})
		if s.hi.Cmp(top) < 0 {
			out = append(out, nftables.SetElement{Key: key(s.hi), IntervalEnd: true})
		}
	}
	return out
}
