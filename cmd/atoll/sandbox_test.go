package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/server"
)

// policySandboxes records what create and timeout send through the real server.
type policySandboxes struct {
	noSandboxes
	create  *api.CreateSandboxRequest
	timeout *api.TimeoutRequest
	network *api.NetworkPolicy
}

func (p policySandboxes) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	return api.SandboxNetwork{IPv4: "10.213.0.3", IPv6: "fd00::3", Policy: api.NetworkPolicy{Egress: "allow-all"}}, nil
}

func (p policySandboxes) SetNetwork(ctx context.Context, id string, req api.NetworkPolicy) (api.SandboxNetwork, error) {
	*p.network = req
	return api.SandboxNetwork{IPv4: "10.213.0.3", IPv6: "fd00::3", Policy: req}, nil
}

func (p policySandboxes) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	*p.create = req
	return api.Sandbox{ID: "3k9x2m7q1w8e5r4t6y0u", State: api.StateRunning}, nil
}

func (p policySandboxes) SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error) {
	*p.timeout = req
	return api.Sandbox{ID: id, State: api.StateRunning}, nil
}

func TestLifecycleFlags(t *testing.T) {
	var create api.CreateSandboxRequest
	var timeout api.TimeoutRequest
	var network api.NetworkPolicy
	cli := cliAgainst(t, server.Config{Sandboxes: policySandboxes{create: &create, timeout: &timeout, network: &network}})
	run := func(args ...string) (string, error) {
		stdout, _, err := cli("", args...)
		return stdout, err
	}

	for _, tc := range []struct {
		args []string
		want api.CreateSandboxRequest
	}{
		{nil, api.CreateSandboxRequest{}},
		{[]string{"--timeout", "30m", "--ephemeral", "--auto-delete", "24h"}, api.CreateSandboxRequest{TimeoutSec: 1800, Ephemeral: true, AutoDeleteSec: 86400}},
		{[]string{"--timeout", "1500ms"}, api.CreateSandboxRequest{TimeoutSec: 2}}, // never rounded to 0, "none"
		{[]string{"--egress", "deny-all", "--allow", "example.com", "--allow", "10.0.0.0/8", "--deny", "10.1.0.0/16"},
			api.CreateSandboxRequest{Network: &api.NetworkPolicy{Egress: "deny-all", Allow: []string{"example.com", "10.0.0.0/8"}, Deny: []string{"10.1.0.0/16"}}}},
		{[]string{"--allow", "*.pypi.org"}, api.CreateSandboxRequest{Network: &api.NetworkPolicy{Allow: []string{"*.pypi.org"}}}},
	} {
		create = api.CreateSandboxRequest{}
		if out, err := run(append([]string{"create"}, tc.args...)...); err != nil || out != "3k9x2m7q1w8e5r4t6y0u\n" {
			t.Errorf("create %v: %q, %v", tc.args, out, err)
		}
		if diff := cmp.Diff(tc.want, create); diff != "" {
			t.Errorf("create %v sent (-want +got):\n%s", tc.args, diff)
		}
	}
	for _, args := range [][]string{
		{"create", "--timeout", "-1s"},
		{"create", "--auto-delete", "-5m"},
		{"create", "--timeout", "9000h"}, // over a year: the server says no
		{"create", "--timeout", "5"},     // no unit
		{"timeout", "3k9x2m7q1w8e5r4t6y0u", "-1m"},
		{"timeout", "3k9x2m7q1w8e5r4t6y0u", "soon"},
		{"timeout", "3k9x2m7q1w8e5r4t6y0u", "9000h"},
	} {
		if _, err := run(args...); err == nil {
			t.Errorf("%s: no error", strings.Join(args, " "))
		}
	}

	for in, want := range map[string]int64{"90m": 5400, "0": 0, "1h30m": 5400} {
		timeout = api.TimeoutRequest{TimeoutSec: -1}
		if out, err := run("timeout", "3k9x2m7q1w8e5r4t6y0u", in); err != nil || out != "3k9x2m7q1w8e5r4t6y0u\n" {
			t.Errorf("timeout %s: %q, %v", in, out, err)
		}
		if timeout.TimeoutSec != want {
			t.Errorf("timeout %s sent %d seconds, want %d", in, timeout.TimeoutSec, want)
		}
	}

	// atoll network shows, or with flags replaces, the policy.
	if out, err := run("network", "3k9x2m7q1w8e5r4t6y0u"); err != nil || !strings.Contains(out, "Egress: allow-all") || !strings.Contains(out, "10.213.0.3") {
		t.Errorf("network: %q, %v", out, err)
	}
	out, err := run("network", "3k9x2m7q1w8e5r4t6y0u", "--allow", "example.com", "--deny", "192.0.2.0/24")
	if err != nil || !strings.Contains(out, "Allow:  example.com") {
		t.Errorf("network --allow: %q, %v", out, err)
	}
	if diff := cmp.Diff(api.NetworkPolicy{Allow: []string{"example.com"}, Deny: []string{"192.0.2.0/24"}}, network); diff != "" {
		t.Errorf("network --allow sent (-want +got):\n%s", diff)
	}
	if _, err := run("network", "3k9x2m7q1w8e5r4t6y0u", "--allow", "a.*.example"); err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Errorf("network with a bad wildcard: %v", err)
	}
	if _, err := run("create", "--egress", "allow-all", "--allow", "example.com"); err == nil {
		t.Error("create --egress allow-all --allow: no error")
	}
}

func TestFormatSeconds(t *testing.T) {
	for sec, want := range map[int64]string{1: "1s", 90: "1m30s", 3600: "1h", 5400: "1h30m", 86400: "24h", 86401: "24h0m1s"} {
		if got := formatSeconds(sec); got != want {
			t.Errorf("formatSeconds(%d) = %q, want %q", sec, got, want)
		}
	}
}
