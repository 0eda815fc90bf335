package egress

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   *api.NetworkPolicy
		want api.NetworkPolicy
	}{
		{nil, api.NetworkPolicy{Egress: AllowAll}},
		{&api.NetworkPolicy{}, api.NetworkPolicy{Egress: AllowAll}},
		{&api.NetworkPolicy{Egress: DenyAll}, api.NetworkPolicy{Egress: DenyAll}},
		// Allow entries imply deny-all; names are canonical, prefixes
		// masked, mapped addresses IPv4, duplicates gone, order stable.
		{&api.NetworkPolicy{Allow: []string{"Example.COM.", "*.PyPI.org", "10.1.2.3/8", "::ffff:1.2.3.4", "example.com", "2001:DB8::1"}},
			api.NetworkPolicy{Egress: DenyAll, Allow: []string{"1.2.3.4", "10.0.0.0/8", "2001:db8::1", "*.pypi.org", "example.com"}}},
		{&api.NetworkPolicy{Deny: []string{"192.0.2.1", "192.0.2.0/24"}},
			api.NetworkPolicy{Egress: AllowAll, Deny: []string{"192.0.2.0/24", "192.0.2.1"}}},
		// Bandwidth caps, either direction alone; an empty one is none.
		{&api.NetworkPolicy{Bandwidth: &api.Bandwidth{EgressMbit: 10, IngressMbit: 0.5}},
			api.NetworkPolicy{Egress: AllowAll, Bandwidth: &api.Bandwidth{EgressMbit: 10, IngressMbit: 0.5}}},
		{&api.NetworkPolicy{Egress: DenyAll, Bandwidth: &api.Bandwidth{IngressMbit: 100000}},
			api.NetworkPolicy{Egress: DenyAll, Bandwidth: &api.Bandwidth{IngressMbit: 100000}}},
		{&api.NetworkPolicy{Bandwidth: &api.Bandwidth{}}, api.NetworkPolicy{Egress: AllowAll}},
	} {
		p, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%+v): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, p.API()); diff != "" {
			t.Errorf("Parse(%+v) (-want +got):\n%s", tc.in, diff)
		}
		// What the API shows parses to the same policy.
		again := p.API()
		if q, err := Parse(&again); err != nil || !q.Equal(p) {
			t.Errorf("round trip of %+v: %+v, %v", again, q, err)
		}
	}
	for _, bad := range []api.NetworkPolicy{
		{Egress: "none"}, {Egress: AllowAll, Allow: []string{"a.com"}}, {Allow: []string{"*"}},
		{Allow: []string{"a.*.com"}}, {Allow: []string{"10.0.0.0/33"}}, {Deny: []string{"a.com"}},
		{Allow: []string{"1.2.3"}}, {Allow: []string{"a..com"}}, {Allow: []string{"exa_mple.com/x"}},
		{Bandwidth: &api.Bandwidth{EgressMbit: -1}}, {Bandwidth: &api.Bandwidth{IngressMbit: 0.01}},
		{Bandwidth: &api.Bandwidth{EgressMbit: 1e6}}, {Bandwidth: &api.Bandwidth{IngressMbit: 1e300}},
	} {
		if _, err := Parse(&bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Parse(%+v): %v, want ErrInvalid", bad, err)
		}
	}
}

func TestMatch(t *testing.T) {
	p, err := Parse(&api.NetworkPolicy{Allow: []string{"example.com", "*.pypi.org", "203.0.113.0/24"}, Deny: []string{"203.0.113.7"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"example.com": true, "EXAMPLE.com.": true, "www.example.com": false, "files.pypi.org": true,
		"a.b.pypi.org": true, "pypi.org": false, "evilpypi.org": false, "example.com.evil": false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("AllowsName(%q) = %v", name, got)
		}
	}
	for addr, want := range map[string]bool{
		"203.0.113.1": true, "203.0.113.7": false, "::ffff:203.0.113.1": true, "198.51.100.1": false,
	} {
		if got := p.AllowsAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("AllowsAddr(%s) = %v", addr, got)
		}
	}
	if !p.HasNames() || p.IsAllowAll() {
		t.Error("HasNames/IsAllowAll")
	}
	var all Policy
	if !all.AllowsName("anything.example") || !all.AllowsAddr(netip.MustParseAddr("192.0.2.1")) || !all.IsAllowAll() || all.HasNames() {
		t.Error("the zero policy does not allow all")
	}
}
