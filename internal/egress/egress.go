// Package egress is a sandbox's egress policy: where it may connect. Parse
// checks and normalises the policy an API request carries; the firewall, the
// resolver and the egress proxy of package network ask the result which
// addresses and names it allows.
//
// A policy has a default, allow-all or deny-all. Under allow-all everything
// is allowed but the Deny prefixes. Under deny-all only the Allow prefixes and
// the addresses that Allow names resolve to are allowed, and the Deny
// prefixes never are. What the server's operator blocks for every sandbox
// (private ranges, metadata addresses) stays blocked whatever a policy says.
//
// A policy also carries the sandbox's bandwidth caps, which travel with it
// (set at create, changed while running, kept across restarts).
package egress

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Defaults of a policy, as the API spells them.
const (
	AllowAll = "allow-all"
	DenyAll  = "deny-all"
)

// MaxRules bounds the entries of Allow and Deny together, and MaxEntry the
// length of one.
const (
	MaxRules = 256
	MaxEntry = 256
)

// Policy is a checked, normalised egress policy. The zero value allows all.
type Policy struct {
	// DenyByDefault is true for deny-all.
	DenyByDefault bool
	// Allow and Deny are masked prefixes, IPv4 ones as IPv4 (never
	// IPv4-mapped IPv6), sorted and without duplicates.
	Allow, Deny []netip.Prefix
	// Names are the allowed domain names, sorted and without duplicates.
	Names []Name
	// EgressRate and IngressRate cap the traffic from and to the sandbox,
	// in bytes per second; 0 is no cap.
	EgressRate, IngressRate uint64
}

// Bounds of a bandwidth cap, in Mbit/s.
const (
	MinMbit = 0.1
	MaxMbit = 100000
)

// Name is an allowed domain name: Domain itself, or with Wildcard any name
// below it (not Domain itself). Domain is lower case, without a trailing dot.
type Name struct {
	Domain   string
	Wildcard bool
}

func (n Name) String() string {
	if n.Wildcard {
		return "*." + n.Domain
	}
	return n.Domain
}

// Matches reports whether name (any case, with or without a trailing dot)
// is n.
func (n Name) Matches(name string) bool {
	name = Canonical(name)
	if n.Wildcard {
		return strings.HasSuffix(name, "."+n.Domain)
	}
	return name == n.Domain
}

// Canonical is name in lower case without a trailing dot.
func Canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// Parse checks p and returns it normalised. A nil p is allow-all. Errors
// wrap errdefs.ErrInvalid and name the offending entry.
func Parse(p *api.NetworkPolicy) (Policy, error) {
	var out Policy
	if p == nil {
		return out, nil
	}
	bad := func(format string, args ...any) (Policy, error) {
		return Policy{}, fmt.Errorf("%w: network: "+format, append([]any{errdefs.ErrInvalid}, args...)...)
	}
	if n := len(p.Allow) + len(p.Deny); n > MaxRules {
		return bad("%d allow and deny entries; at most %d", n, MaxRules)
	}
	switch p.Egress {
	case "":
		out.DenyByDefault = len(p.Allow) > 0
	case AllowAll:
		if len(p.Allow) > 0 {
			return bad("allow entries need egress %q (under %q everything is allowed already)", DenyAll, AllowAll)
		}
	case DenyAll:
		out.DenyByDefault = true
	default:
		return bad("egress %q: want %q or %q", truncate(p.Egress), AllowAll, DenyAll)
	}
	for _, e := range p.Allow {
		if len(e) > MaxEntry {
			return bad("allow entry %q is longer than %d bytes", truncate(e), MaxEntry)
		}
		if pr, ok, err := parseAddress(e); err != nil {
			return bad("allow entry %q: %v", truncate(e), err)
		} else if ok {
			out.Allow = append(out.Allow, pr)
			continue
		}
		n, err := parseName(e)
		if err != nil {
			return bad("allow entry %q: %v", truncate(e), err)
		}
		out.Names = append(out.Names, n)
	}
	for _, e := range p.Deny {
		if len(e) > MaxEntry {
			return bad("deny entry %q is longer than %d bytes", truncate(e), MaxEntry)
		}
		pr, ok, err := parseAddress(e)
		if err != nil {
			return bad("deny entry %q: %v", truncate(e), err)
		}
		if !ok {
			return bad("deny entry %q: want an IP address or CIDR prefix (names cannot be denied: under deny-all, names not allowed do not resolve)", truncate(e))
		}
		out.Deny = append(out.Deny, pr)
	}
	if b := p.Bandwidth; b != nil {
		var err error
		if out.EgressRate, err = rateOf(b.EgressMbit); err != nil {
			return bad("bandwidth egress_mbit: %v", err)
		}
		if out.IngressRate, err = rateOf(b.IngressMbit); err != nil {
			return bad("bandwidth ingress_mbit: %v", err)
		}
	}
	out.Allow = sortPrefixes(out.Allow)
	out.Deny = sortPrefixes(out.Deny)
	slices.SortFunc(out.Names, func(a, b Name) int { return strings.Compare(a.String(), b.String()) })
	out.Names = slices.Compact(out.Names)
	return out, nil
}

// rateOf turns a cap in Mbit/s into bytes per second; 0 is no cap.
func rateOf(mbit float64) (uint64, error) {
	if mbit == 0 {
		return 0, nil
	}
	if math.IsNaN(mbit) || mbit < MinMbit || mbit > MaxMbit {
		return 0, fmt.Errorf("%v: want 0 (no cap) or %v to %v Mbit/s", mbit, MinMbit, MaxMbit)
	}
	return uint64(math.Round(mbit * 1e6 / 8)), nil
}

// parseAddress parses an IP address or CIDR prefix. ok is false, with no
// error, when s looks like neither, so that it may be a name.
func parseAddress(s string) (netip.Prefix, bool, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false, fmt.Errorf("not a CIDR prefix")
		}
		return normalPrefix(p), true, nil
	}
	if !strings.ContainsAny(s, ":") && !looksNumeric(s) {
		return netip.Prefix{}, false, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false, fmt.Errorf("not an IP address")
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true, nil
}

// looksNumeric reports whether s is digits and dots only: an attempt at an
// IPv4 address, never a name (a name's last label is not all digits).
func looksNumeric(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c == '.') {
			return false
		}
	}
	return true
}

// normalPrefix masks p and turns an IPv4-mapped prefix into IPv4.
func normalPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

func sortPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(ps)
}

// parseName parses a domain name, optionally with a leading "*.".
func parseName(s string) (Name, error) {
	var n Name
	s = Canonical(s)
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		n.Wildcard, s = true, rest
	}
	if strings.Contains(s, "*") {
		return n, fmt.Errorf("a wildcard is allowed only as a leading \"*.\"")
	}
	if s == "" || len(s) > 253 {
		return n, fmt.Errorf("want a domain name of 1 to 253 bytes")
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return n, fmt.Errorf("domain labels are 1 to 63 bytes")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return n, fmt.Errorf("a domain label cannot start or end with '-'")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return n, fmt.Errorf("domain names are letters, digits, '-' and '_'")
			}
		}
	}
	if looksNumeric(labels[len(labels)-1]) {
		return n, fmt.Errorf("not an IP address, and a domain name's last label is not all digits")
	}
	n.Domain = s
	return n, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// API is p as the API shows it.
func (p Policy) API() api.NetworkPolicy {
	out := api.NetworkPolicy{Egress: AllowAll}
	if p.DenyByDefault {
		out.Egress = DenyAll
	}
	for _, a := range p.Allow {
		out.Allow = append(out.Allow, prefixString(a))
	}
	for _, n := range p.Names {
		out.Allow = append(out.Allow, n.String())
	}
	for _, d := range p.Deny {
		out.Deny = append(out.Deny, prefixString(d))
	}
	if p.EgressRate != 0 || p.IngressRate != 0 {
		out.Bandwidth = &api.Bandwidth{EgressMbit: mbitOf(p.EgressRate), IngressMbit: mbitOf(p.IngressRate)}
	}
	return out
}

func mbitOf(rate uint64) float64 { return float64(rate) * 8 / 1e6 }

// prefixString writes single addresses without their length.
func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// IsAllowAll reports whether p allows everything: allow-all with no deny
// entries, the default.
func (p Policy) IsAllowAll() bool { return !p.DenyByDefault && len(p.Deny) == 0 }

// IsDefault reports whether p is the default policy: allow-all, no caps.
func (p Policy) IsDefault() bool { return p.IsAllowAll() && p.EgressRate == 0 && p.IngressRate == 0 }

// HasNames reports whether p allows some names, which the resolver and the
// egress proxy then enforce.
func (p Policy) HasNames() bool { return p.DenyByDefault && len(p.Names) > 0 }

// Denied reports whether a is in a Deny prefix.
func (p Policy) Denied(a netip.Addr) bool { return inAny(p.Deny, a) }

// AllowsAddr reports whether p lets a through on its address alone: not
// denied, and allow-all or in an Allow prefix. Addresses allowed through a
// name are the resolver's business.
func (p Policy) AllowsAddr(a netip.Addr) bool {
	a = a.Unmap()
	if p.Denied(a) {
		return false
	}
	return !p.DenyByDefault || inAny(p.Allow, a)
}

// AllowsName reports whether p lets the resolver answer for name. Under
// allow-all it answers for every name.
func (p Policy) AllowsName(name string) bool {
	if !p.DenyByDefault {
		return true
	}
	for _, n := range p.Names {
		if n.Matches(name) {
			return true
		}
	}
	return false
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Equal reports whether p and q are the same policy.
func (p Policy) Equal(q Policy) bool {
	return p.DenyByDefault == q.DenyByDefault && slices.Equal(p.Allow, q.Allow) &&
		slices.Equal(p.Deny, q.Deny) && slices.Equal(p.Names, q.Names) &&
		p.EgressRate == q.EgressRate && p.IngressRate == q.IngressRate
}
