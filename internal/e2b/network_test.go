package e2b

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestEgressPolicy(t *testing.T) {
	no, yes := false, true
	for _, c := range []struct {
		name              string
		internet          *bool
		allowOut, denyOut []string
		want              *api.NetworkPolicy
		bad               bool
	}{
		{name: "nothing set", want: nil},
		{name: "internet on", internet: &yes, want: nil},
		{name: "internet off", internet: &no, want: &api.NetworkPolicy{Egress: "deny-all"}},
		{name: "deny all traffic", denyOut: []string{"0.0.0.0/0"}, want: &api.NetworkPolicy{Egress: "deny-all"}},
		{name: "deny all IPv6 traffic", denyOut: []string{"::/0"}, want: &api.NetworkPolicy{Egress: "deny-all"}},
		{name: "allow list", denyOut: []string{"0.0.0.0/0", "8.8.8.8"}, allowOut: []string{"1.1.1.1", "*.pypi.org", "10.0.0.0/8"},
			want: &api.NetworkPolicy{Egress: "deny-all", Allow: []string{"1.1.1.1", "10.0.0.0/8", "*.pypi.org"}}},
		{name: "internet off with an allow list", internet: &no, allowOut: []string{"example.com"},
			want: &api.NetworkPolicy{Egress: "deny-all", Allow: []string{"example.com"}}},
		{name: "deny list", denyOut: []string{"8.8.8.8", "203.0.113.0/24"},
			want: &api.NetworkPolicy{Egress: "allow-all", Deny: []string{"8.8.8.8", "203.0.113.0/24"}}},
		// E2B's allowOut wins over its denyOut; atoll's deny would win, so
		// the allowed part is cut out of the denied prefix.
		{name: "allowed inside denied", denyOut: []string{"203.0.113.0/24"}, allowOut: []string{"203.0.113.128/25", "203.0.113.7"},
			want: &api.NetworkPolicy{Egress: "allow-all", Deny: []string{
				"203.0.113.0/30", "203.0.113.4/31", "203.0.113.6", "203.0.113.8/29", "203.0.113.16/28", "203.0.113.32/27", "203.0.113.64/26"}}},
		{name: "allowed covers denied", denyOut: []string{"203.0.113.7"}, allowOut: []string{"203.0.113.0/24"}, want: nil},
		{name: "names allowed under allow-all", allowOut: []string{"example.com"}, want: nil},
		{name: "IPv6 deny less IPv4 allow", denyOut: []string{"2001:db8::/32"}, allowOut: []string{"1.2.3.4"},
			want: &api.NetworkPolicy{Egress: "allow-all", Deny: []string{"2001:db8::/32"}}},
		{name: "name in denyOut", denyOut: []string{"example.com"}, bad: true},
		{name: "bad allowOut", allowOut: []string{"300.1.1.1"}, bad: true},
		{name: "bad prefix", denyOut: []string{"1.2.3.4/40"}, bad: true},
		{name: "wildcard in the middle", allowOut: []string{"a.*.com"}, denyOut: []string{"0.0.0.0/0"}, bad: true},
		{name: "too many", denyOut: make([]string, 300), bad: true},
	} {
		got, err := egressPolicy(c.internet, c.allowOut, c.denyOut)
		if c.bad {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v, %v; want an invalid-input error", c.name, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: policy (-want +got):\n%s", c.name, diff)
		}
	}
}
