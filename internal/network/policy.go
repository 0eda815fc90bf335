package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// slotState is what the Manager knows of an attached slot.
type slotState struct {
	pol egress.Policy
	// known is false for a slot found attached at start-up until its
	// policy is set again: the kernel keeps enforcing what it held, but the
	// resolver and the proxy do not know the policy's names.
	known  bool
	kernel slotKernel
	// resolved are the addresses the resolver gave out for allowed names,
	// which the resolved sets hold until the answers expire.
	resolved map[netip.Addr]*resolvedAddr
	// conns are the egress proxy's connections from this slot.
	conns map[*proxyConn]struct{}
	// rates are the bandwidth caps the veth holds, if known.
	rates rates
}

type resolvedAddr struct {
	names map[string]bool // canonical names that resolved to it
	until time.Time
}

// resolvedGrace is how long past its TTL an answer's addresses stay
// allowed, and the shortest time they are allowed at all: a client
// connects some time after it resolves.
const (
	resolvedGrace = 30 * time.Second
	minResolved   = 60 * time.Second
	maxResolved   = 24 * time.Hour
)

// retained lists the resolved addresses that pol still allows, with what
// is left of their time.
func (st *slotState) retained(pol egress.Policy, now time.Time) []resolvedElem {
	var out []resolvedElem
	if !pol.HasNames() {
		return nil
	}
	for a, r := range st.resolved {
		left := r.until.Sub(now)
		if left <= 0 || pol.Denied(a) {
			continue
		}
		ok := len(r.names) == 0 // carried over a restart: name unknown
		for n := range r.names {
			ok = ok || pol.AllowsName(n)
		}
		if ok {
			out = append(out, resolvedElem{addr: a, timeout: left})
		}
	}
	return out
}

// allows reports whether traffic from the slot to dst may go on under its
// current policy, as the slot chain decides (the operator's blocked
// prefixes aside).
func (st *slotState) allows(dst netip.Addr, now time.Time) bool {
	dst = dst.Unmap()
	if st.pol.AllowsAddr(dst) {
		return true
	}
	if !st.pol.HasNames() || st.pol.Denied(dst) {
		return false
	}
	r := st.resolved[dst]
	return r != nil && r.until.After(now)
}

func (st *slotState) closeConns() {
	for c := range st.conns {
		c.close()
	}
}

// SetPolicy changes slot's egress policy. The change is atomic for new
// connections; existing ones that pol forbids are cut: their conntrack
// entries are deleted, so that their next packet is judged anew and
// refused, and the egress proxy closes its own.
func (m *Manager) SetPolicy(ctx context.Context, slot int, pol egress.Policy) error {
	if err := m.cfg.checkSlot(slot); err != nil {
		return err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	start := time.Now()
	m.slotsMu.Lock()
	st := m.slots[slot]
	if st == nil {
		m.slotsMu.Unlock()
		return fmt.Errorf("%w: network slot %d is not attached", errdefs.ErrNotFound, slot)
	}
	// Cutting connections means walking the host's whole conntrack table
	// (~15 ms with its default 262144 buckets), so it is skipped when the
	// new policy forbids nothing the old one allowed: the same policy given
	// again (a start over a prestarted process's network), or allow-all
	// after a policy without names (nothing went through the proxy).
	needCut := !st.known || !(pol.Equal(st.pol) || pol.IsAllowAll() && !st.pol.HasNames())
	// The caps first: a failure leaves the rest as it was.
	if r := ratesOf(pol); !st.known || r != st.rates {
		if err := m.shape(slot, nil, r); err != nil {
			st.rates = rates{^uint64(0), ^uint64(0)} // half set, maybe: set both next time
			m.slotsMu.Unlock()
			return err
		}
		st.rates = r
	}
	now := time.Now()
	k := kernelOf(pol, st.retained(pol, now))
	m.nftMu.Lock()
	err := m.rs.refillSlot(m.nft, m.cfg, slot, &st.kernel, &k)
	if err == nil {
		err = m.nft.Flush()
	}
	m.nftMu.Unlock()
	if err != nil {
		m.slotsMu.Unlock()
		return fmt.Errorf("setting egress policy of slot %d: %w", slot, err)
	}
	st.pol, st.known, st.kernel = pol, true, k
	kept := map[netip.Addr]bool{}
	for _, r := range k.resolved {
		kept[r.addr] = true
	}
	for a := range st.resolved {
		if !kept[a] {
			delete(st.resolved, a)
		}
	}
	var cut []*proxyConn
	for c := range st.conns {
		if !pol.HasNames() || !c.allowedBy(st, now) {
			cut = append(cut, c)
		}
	}
	// A snapshot of what the cut below judges by.
	judge := &slotState{pol: pol, resolved: map[netip.Addr]*resolvedAddr{}}
	for a, r := range st.resolved {
		judge.resolved[a] = r
	}
	m.slotsMu.Unlock()
	for _, c := range cut {
		c.close()
	}
	if !needCut {
		m.log.Debug("egress policy set", "slot", slot, "op", "policy", "cut", len(cut), "ms", msSince(start))
		return nil
	}
	n, err := m.flushConntrack(m.forbidden(slot, judge, k.proxied, now))
	if err != nil {
		return fmt.Errorf("cutting connections of slot %d: %w", slot, err)
	}
	m.log.Debug("egress policy set", "slot", slot, "op", "policy", "cut", n+len(cut), "ms", msSince(start))
	return nil
}

// forbidden matches the flows from slot's addresses that judge's policy does
// not allow: to the gateway (the resolver) they always are; those sent to
// the egress proxy are the proxy's to judge while the slot is proxied.
func (m *Manager) forbidden(slot int, judge *slotState, proxied bool, now time.Time) func(conntrack.Flow) bool {
	a4, a6 := m.cfg.slotAddrs(slot)
	gw4, gw6 := m.cfg.gateway4(), m.cfg.gateway6()
	return func(f conntrack.Flow) bool {
		src := f.TupleOrig.IP.SourceAddress.Unmap()
		if src != a4.Addr() && src != a6.Addr() {
			return false
		}
		dst := f.TupleOrig.IP.DestinationAddress.Unmap()
		if dst == gw4 || dst == gw6 {
			return false
		}
		if f.TupleReply.IP.SourceAddress.Unmap() != dst {
			// Redirected to the egress proxy.
			return !proxied
		}
		return !judge.allows(dst, now)
	}
}

// Policy returns slot's egress policy and whether the Manager knows it (it
// does not for a slot found attached at start-up until SetPolicy).
func (m *Manager) Policy(slot int) (egress.Policy, bool, error) {
	m.slotsMu.Lock()
	defer m.slotsMu.Unlock()
	st := m.slots[slot]
	if st == nil {
		return egress.Policy{}, false, fmt.Errorf("%w: network slot %d is not attached", errdefs.ErrNotFound, slot)
	}
	return st.pol, st.known, nil
}

// addResolved lets slot reach addrs, which its resolver just gave it for
// name, for ttl (bounded by minResolved and maxResolved) plus a grace
// period, and returns the TTL to give the sandbox: no longer than that, so
// that it asks again before the firewall forgets. Addresses the policy
// denies are left out; ok is false if the policy no longer allows name.
func (m *Manager) addResolved(slot int, name string, addrs []netip.Addr, ttl time.Duration) (answerTTL time.Duration, ok bool, err error) {
	ttl = min(max(ttl, 0), maxResolved)
	keep := max(ttl, minResolved) + resolvedGrace
	m.slotsMu.Lock()
	defer m.slotsMu.Unlock()
	st := m.slots[slot]
	if st == nil || !st.known || !st.pol.AllowsName(name) {
		return 0, false, nil
	}
	if !st.pol.HasNames() {
		// Allow-all: nothing to add.
		return ttl, true, nil
	}
	now := time.Now()
	until := now.Add(keep)
	set4, set6 := m.rs.slotSet(slot, kindResolved4), m.rs.slotSet(slot, kindResolved6)
	var fresh, refresh []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if st.pol.Denied(a) {
			continue
		}
		if r := st.resolved[a]; r != nil && r.until.After(now.Add(time.Second)) {
			if r.until.Before(until) {
				refresh = append(refresh, a)
			}
			continue
		}
		fresh = append(fresh, a)
	}
	queue := func(del bool, as []netip.Addr) error {
		for _, a := range as {
			s := set6
			if a.Is4() {
				s = set4
			}
			var err error
			if del {
				err = m.nft.SetDeleteElements(s, addrElems(a))
			} else {
				err = m.nft.SetAddElements(s, []nftables.SetElement{{Key: a.AsSlice(), Timeout: keep}})
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if len(fresh)+len(refresh) > 0 {
		m.nftMu.Lock()
		// Refreshing an element's timeout is deleting and adding it again.
		err = errors.Join(queue(true, refresh), queue(false, refresh), queue(false, fresh))
		if err == nil {
			err = m.nft.Flush()
		}
		if errors.Is(err, unix.ENOENT) {
			// An element the kernel expired a moment ago: add them all.
			if err = queue(false, append(fresh, refresh...)); err == nil {
				err = m.nft.Flush()
			}
		}
		m.nftMu.Unlock()
		if err != nil {
			return 0, false, fmt.Errorf("adding resolved addresses of slot %d: %w", slot, err)
		}
	}
	for _, a := range addrs {
		a = a.Unmap()
		if st.pol.Denied(a) {
			continue
		}
		r := st.resolved[a]
		if r == nil || !r.until.After(now) {
			r = &resolvedAddr{names: map[string]bool{}}
			st.resolved[a] = r
		}
		r.names[egress.Canonical(name)] = true
		if r.until.Before(until) {
			r.until = until
		}
	}
	// Forget what has expired.
	for a, r := range st.resolved {
		if !r.until.After(now) {
			delete(st.resolved, a)
		}
	}
	return min(ttl, keep-resolvedGrace), true, nil
}

// readSlotKernels reads what the table, as a previous Manager left it, holds
// for slots; a slot it holds nothing for gets an empty state, which refuses
// everything until its policy is set.
func (m *Manager) readSlotKernels(slots []int) map[int]*slotKernel {
	out := map[int]*slotKernel{}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	member := func(s *nftables.Set) map[netip.Addr]bool {
		set := map[netip.Addr]bool{}
		elems, err := m.nft.GetSetElements(s)
		if err != nil {
			return set
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				set[a] = true
			}
		}
		return set
	}
	open4, proxied4 := member(m.rs.open4), member(m.rs.proxied4)
	for _, slot := range slots {
		k := &slotKernel{}
		out[slot] = k
		if _, err := m.nft.ListChain(m.rs.table, slotChain(slot)); err != nil {
			continue
		}
		a4, _ := m.cfg.slotAddrs(slot)
		k.open, k.proxied = open4[a4.Addr()], proxied4[a4.Addr()]
		for kind := range slotSetKinds {
			elems, err := m.nft.GetSetElements(m.rs.slotSet(slot, kind))
			if err != nil {
				continue
			}
			switch kind {
			case kindResolved4, kindResolved6:
				for _, e := range elems {
					if a, ok := netip.AddrFromSlice(e.Key); ok && e.Expires > 0 {
						k.resolved = append(k.resolved, resolvedElem{addr: a, timeout: e.Expires})
					}
				}
			case kindDeny4, kindAllow4:
				k.spans[kind] = elemSpans(elems, 32)
			default:
				k.spans[kind] = elemSpans(elems, 128)
			}
		}
	}
	return out
}
