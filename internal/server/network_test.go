package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// TestNetworkPolicyInput sends policies a hostile or careless client might
// and expects a clear 400 for every bad one, on create and on PUT .../network.
func TestNetworkPolicyInput(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{})
	id := decode[api.Sandbox](t, body).ID

	many := make([]string, 257)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	long := strings.Repeat("a", 64) + ".example"
	bad := []struct {
		name string
		pol  api.NetworkPolicy
	}{
		{"unknown egress", api.NetworkPolicy{Egress: "allow-some"}},
		{"allow under allow-all", api.NetworkPolicy{Egress: "allow-all", Allow: []string{"example.com"}}},
		{"CIDR too long", api.NetworkPolicy{Allow: []string{"10.0.0.0/33"}}},
		{"IPv6 CIDR too long", api.NetworkPolicy{Allow: []string{"2001:db8::/129"}}},
		{"negative length", api.NetworkPolicy{Allow: []string{"10.0.0.0/-1"}}},
		{"not an address", api.NetworkPolicy{Allow: []string{"1.2.3"}}},
		{"octet too big", api.NetworkPolicy{Allow: []string{"256.1.1.1"}}},
		{"leading zeros", api.NetworkPolicy{Allow: []string{"010.1.1.1"}}},
		{"zone", api.NetworkPolicy{Allow: []string{"fe80::1%eth0"}}},
		{"bare wildcard", api.NetworkPolicy{Allow: []string{"*"}}},
		{"wildcard in the middle", api.NetworkPolicy{Allow: []string{"a.*.example.com"}}},
		{"wildcard suffix", api.NetworkPolicy{Allow: []string{"example.*"}}},
		{"double wildcard", api.NetworkPolicy{Allow: []string{"*.*.example.com"}}},
		{"partial wildcard", api.NetworkPolicy{Allow: []string{"*foo.example.com"}}},
		{"empty entry", api.NetworkPolicy{Allow: []string{""}}},
		{"empty label", api.NetworkPolicy{Allow: []string{"a..example"}}},
		{"label too long", api.NetworkPolicy{Allow: []string{long}}},
		{"name too long", api.NetworkPolicy{Allow: []string{strings.Repeat("abcdefghi.", 26) + "com"}}},
		{"bad characters", api.NetworkPolicy{Allow: []string{"exa mple.com"}}},
		{"NUL", api.NetworkPolicy{Allow: []string{"example.com\x00evil"}}},
		{"URL", api.NetworkPolicy{Allow: []string{"https://example.com/"}}},
		{"hyphen label", api.NetworkPolicy{Allow: []string{"-example.com"}}},
		{"numeric TLD", api.NetworkPolicy{Allow: []string{"example.123"}}},
		{"entry too long", api.NetworkPolicy{Allow: []string{strings.Repeat("a", 300)}}},
		{"deny a name", api.NetworkPolicy{Deny: []string{"example.com"}}},
		{"deny bad CIDR", api.NetworkPolicy{Deny: []string{"10.0.0.0/99"}}},
		{"too many rules", api.NetworkPolicy{Egress: "deny-all", Allow: many}},
		{"too many rules together", api.NetworkPolicy{Allow: many[:200], Deny: many[200:]}},
		{"negative bandwidth", api.NetworkPolicy{Bandwidth: &api.Bandwidth{EgressMbit: -8}}},
		{"bandwidth too small", api.NetworkPolicy{Bandwidth: &api.Bandwidth{IngressMbit: 0.001}}},
		{"bandwidth too big", api.NetworkPolicy{Bandwidth: &api.Bandwidth{IngressMbit: 1e9}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			g := f.with(t)
			resp, body := g.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Network: &tc.pol})
			wantError(t, resp, body, http.StatusBadRequest, "invalid")
			resp, body = g.do("PUT", "/v1/sandboxes/"+id+"/network", tc.pol)
			wantError(t, resp, body, http.StatusBadRequest, "invalid")
		})
	}
	// Malformed bodies.
	for name, raw := range map[string]string{
		"not JSON":       "{",
		"unknown field":  `{"egress":"deny-all","allow_all":true}`,
		"wrong type":     `{"allow":"example.com"}`,
		"empty body":     ``,
		"two values":     `{} {}`,
		"number entries": `{"allow":[1,2]}`,
		"string rate":    `{"bandwidth":{"egress_mbit":"10M"}}`,
		"unknown rate":   `{"bandwidth":{"mbit":10}}`,
		"huge rate":      `{"bandwidth":{"egress_mbit":1e999}}`,
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := f.with(t).do("PUT", "/v1/sandboxes/"+id+"/network", raw, "Content-Type", "application/json")
			wantError(t, resp, body, http.StatusBadRequest, "invalid")
		})
	}
	t.Run("other tenants' and malformed IDs", func(t *testing.T) {
		g := f.with(t)
		resp, body := g.do("GET", "/v1/sandboxes/zzzzzzzzzzzzzzzzzzzz/network", nil)
		wantError(t, resp, body, http.StatusNotFound, "not_found")
		resp, body = g.do("PUT", "/v1/sandboxes/zzzzzzzzzzzzzzzzzzzz/network", api.NetworkPolicy{Egress: "deny-all"})
		wantError(t, resp, body, http.StatusNotFound, "not_found")
		resp, body = g.do("PUT", "/v1/sandboxes/..%2F..%2Fetc/network", api.NetworkPolicy{Egress: "deny-all"})
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusNotFound {
			t.Errorf("malformed ID: %d %s", resp.StatusCode, body)
		}
		resp, body = g.do("GET", "/v1/sandboxes/"+id+"/network", nil, "X-API-Key", "wrong")
		wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
	})
	t.Run("good policies", func(t *testing.T) {
		g := f.with(t)
		pol := api.NetworkPolicy{Egress: "deny-all", Allow: []string{"Example.COM.", "*.pypi.org", "10.0.0.0/8", "2001:db8::1", "::ffff:1.2.3.4"},
			Deny: []string{"10.1.0.0/16"}}
		resp, body := g.do("PUT", "/v1/sandboxes/"+id+"/network", pol)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT: %d %s", resp.StatusCode, body)
		}
		resp, body = g.do("GET", "/v1/sandboxes/"+id+"/network", nil)
		if n := decode[api.SandboxNetwork](t, body); resp.StatusCode != 200 || n.IPv4 == "" || n.Policy.Egress != "deny-all" {
			t.Errorf("GET: %d %+v", resp.StatusCode, n)
		}
		resp, body = g.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Network: &pol})
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("create with a policy: %d %s", resp.StatusCode, body)
		}
		resp, body = g.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Network: &api.NetworkPolicy{Allow: many[:256]}})
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("create with 256 rules: %d %s", resp.StatusCode, body)
		}
	})
	t.Run("no networking", func(t *testing.T) {
		g := f.with(t)
		_, body := g.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Labels: map[string]string{"nonet": "1"}})
		nonet := decode[api.Sandbox](t, body).ID
		resp, body := g.do("GET", "/v1/sandboxes/"+nonet+"/network", nil)
		wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
	})
}
