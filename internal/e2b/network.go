package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// E2B's egress model and atoll's differ in one way that matters: in E2B,
// allowOut wins over denyOut; in atoll, deny wins over allow. The mapping:
//
//   - allow_internet_access false, or denyOut holding all traffic
//     (0.0.0.0/0, or ::/0), is atoll's deny-all with allowOut as its allow
//     list; the rest of denyOut says nothing more.
//   - otherwise it is allow-all with denyOut as deny, less every allowOut
//     address or prefix (a denied prefix is split around an allowed one),
//     so that what E2B would let through, atoll lets through. Names in
//     allowOut are reachable under allow-all already.
//   - nothing set is no policy at all: allow-all, which a server without
//     networking can serve too.

// allTraffic is E2B's ALL_TRAFFIC, and its IPv6 twin.
var allTraffic = []string{"0.0.0.0/0", "::/0"}

// egressPolicy maps E2B's egress fields onto an atoll policy; nil is none.
func egressPolicy(allowInternet *bool, allowOut, denyOut []string) (*api.NetworkPolicy, error) {
	if n := len(allowOut) + len(denyOut); n > egress.MaxRules {
		return nil, bad("network: %d allowOut and denyOut entries; at most %d", n, egress.MaxRules)
	}
	// Check every entry as atoll would, whatever becomes of it.
	allow, err := egress.Parse(&api.NetworkPolicy{Egress: egress.DenyAll, Allow: allowOut})
	if err != nil {
		return nil, fmt.Errorf("%w (in allowOut)", err)
	}
	deny, err := egress.Parse(&api.NetworkPolicy{Deny: denyOut})
	if err != nil {
		return nil, fmt.Errorf("%w (in denyOut: E2B denies addresses and prefixes only)", err)
	}
	denyAll := allowInternet != nil && !*allowInternet
	for _, d := range denyOut {
		if slices.Contains(allTraffic, strings.TrimSpace(d)) {
			denyAll = true
		}
	}
	if denyAll {
		p := allow.API()
		return &p, nil
	}
	if len(deny.Deny) == 0 {
		return nil, nil
	}
	var out []netip.Prefix
	for _, d := range deny.Deny {
		rest := []netip.Prefix{d}
		for _, a := range allow.Allow {
			var next []netip.Prefix
			for _, r := range rest {
				next = append(next, subtract(r, a)...)
			}
			rest = next
		}
		out = append(out, rest...)
	}
	if len(out) == 0 {
		return nil, nil
	}
	if len(out) > egress.MaxRules {
		return nil, bad("network: denyOut less allowOut is %d prefixes; at most %d", len(out), egress.MaxRules)
	}
	p := egress.Policy{Deny: out}.API()
	return &p, nil
}

// subtract returns the prefixes that cover d but not a.
func subtract(d, a netip.Prefix) []netip.Prefix {
	if !d.Overlaps(a) {
		return []netip.Prefix{d}
	}
	if a.Bits() <= d.Bits() { // a covers d
		return nil
	}
	// d covers a: split d (masked, as egress.Parse leaves it) in halves
	// and keep what is not a. The upper half has bit d.Bits() set.
	d = d.Masked()
	b := d.Addr().AsSlice()
	b[d.Bits()/8] |= 0x80 >> (d.Bits() % 8)
	upper, _ := netip.AddrFromSlice(b)
	lo := netip.PrefixFrom(d.Addr(), d.Bits()+1)
	hi := netip.PrefixFrom(upper, d.Bits()+1)
	return append(subtract(lo, a), subtract(hi, a)...)
}

// e2bNetwork is how an atoll sandbox's network shows in E2B's GET
// /sandboxes/{id}: the policy mapped back, and whether its ports are public.
func e2bNetwork(sb api.Sandbox) (allowInternet bool, n *networkInfo) {
	n = &networkInfo{AllowPublicTraffic: sb.Ports.Public, AllowOut: []string{}, DenyOut: []string{}}
	if sb.Network == nil { // a server without networking: loopback only
		n.DenyOut = []string{allTraffic[0]}
		return false, n
	}
	p := sb.Network.Policy
	if p.Egress == egress.DenyAll {
		n.DenyOut = []string{allTraffic[0]}
		n.AllowOut = append(n.AllowOut, p.Allow...)
		return false, n
	}
	n.DenyOut = append(n.DenyOut, p.Deny...)
	return true, n
}

// networkInfo is E2B's SandboxNetworkConfig as GET /sandboxes/{id} shows it.
type networkInfo struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

// networkUpdate is the body of PUT /sandboxes/{id}/network. E2B's SDKs
// send allow_internet_access; its docs also name allowInternetAccess.
type networkUpdate struct {
	AllowInternetAccess      *bool           `json:"allow_internet_access"`
	AllowInternetAccessCamel *bool           `json:"allowInternetAccess"`
	AllowOut                 []string        `json:"allowOut"`
	DenyOut                  []string        `json:"denyOut"`
	EgressProxy              json.RawMessage `json:"egressProxy"`
	Rules                    json.RawMessage `json:"rules"`
}

// updateNetwork replaces a sandbox's egress policy: fields left out are
// cleared, as in E2B.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	id, body, ok := sandboxBody[networkUpdate](s, w, r, false)
	if !ok {
		return
	}
	if err := unsupportedEgress(body.EgressProxy, body.Rules); err != nil {
		s.writeErr(w, r, err)
		return
	}
	allowInternet := body.AllowInternetAccess
	if allowInternet == nil {
		allowInternet = body.AllowInternetAccessCamel
	}
	p, err := egressPolicy(allowInternet, body.AllowOut, body.DenyOut)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if p == nil {
		p = &api.NetworkPolicy{Egress: egress.AllowAll}
	}
	// E2B changes the network of running sandboxes only.
	if _, ok := s.running(w, r, id); !ok {
		return
	}
	if _, err := s.cfg.Sandboxes.SetNetwork(r.Context(), id, *p); err != nil {
		if errors.Is(err, errdefs.ErrUnavailable) {
			s.writeErr(w, r, fmt.Errorf("%w: this atoll server runs sandboxes without networking, so it cannot change their egress", errdefs.ErrUnavailable))
			return
		}
		s.sandboxErr(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// unsupportedEgress refuses E2B's egress proxies and transform rules.
func unsupportedEgress(proxy, rules json.RawMessage) error {
	switch {
	case !isNull(proxy):
		return bad("network.egressProxy: egress through a proxy of your own is not supported by atoll")
	case !isNull(rules) && string(rules) != "{}":
		return bad("network.rules: transforming outbound requests is not supported by atoll")
	}
	return nil
}
