package control

import (
	"errors"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/node"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// internal/node's Node is the node the control plane runs on.
var _ Node = (*node.Node)(nil)

type nopRuntime struct{ runtime.Runtime }

func (nopRuntime) Name() string { return "ns" }

func TestValidate(t *testing.T) {
	s, err := New(Config{Node: node.New(node.Config{Runtimes: []runtime.Runtime{nopRuntime{}}})})
	if err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name string
		req  api.CreateSandboxRequest
	}{
		{"unknown runtime", api.CreateSandboxRequest{Runtime: "vm"}},
		{"negative cpu", api.CreateSandboxRequest{CPU: -1}},
		{"tiny cpu", api.CreateSandboxRequest{CPU: 0.001}},
		{"too many cpus", api.CreateSandboxRequest{CPU: 4096}},
		{"tiny memory", api.CreateSandboxRequest{MemoryMiB: 1}},
		{"huge memory", api.CreateSandboxRequest{MemoryMiB: 1 << 40}},
		{"negative disk", api.CreateSandboxRequest{DiskGiB: -5}},
		{"huge disk", api.CreateSandboxRequest{DiskGiB: 1 << 30}},
		{"few pids", api.CreateSandboxRequest{PIDs: 3}},
		{"env key with =", api.CreateSandboxRequest{Env: map[string]string{"A=B": "c"}}},
		{"empty env key", api.CreateSandboxRequest{Env: map[string]string{"": "c"}}},
		{"env value with NUL", api.CreateSandboxRequest{Env: map[string]string{"A": "\x00"}}},
		{"label key with space", api.CreateSandboxRequest{Labels: map[string]string{"a b": "c"}}},
		{"long label key", api.CreateSandboxRequest{Labels: map[string]string{strings.Repeat("k", 64): "c"}}},
		{"long label value", api.CreateSandboxRequest{Labels: map[string]string{"k": strings.Repeat("v", 257)}}},
		{"invalid utf-8 label", api.CreateSandboxRequest{Labels: map[string]string{"k": "\xff"}}},
		// A single machine's one node carries no labels.
		{"node selector on one machine", api.CreateSandboxRequest{NodeSelector: map[string]string{"zone": "a"}}},
		{"spread key with space", api.CreateSandboxRequest{Spread: "a b"}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.validate(&tc.req); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("validate: %v, want invalid", err)
			}
		})
	}
	// In a cluster, a selector must be one a node label could match.
	cs, err := New(Config{Node: node.New(node.Config{Runtimes: []runtime.Runtime{nopRuntime{}}}), Placer: &placer{}})
	if err != nil {
		t.Fatal(err)
	}
	for name, sel := range map[string]map[string]string{
		"empty key": {"": "a"}, "key with NUL": {"z\x00": "a"}, "long value": {"zone": strings.Repeat("v", 64)},
		"value not utf-8": {"zone": "\xff"}, "value with NUL": {"zone": "a\x00"},
	} {
		if err := cs.validate(&api.CreateSandboxRequest{NodeSelector: sel}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("cluster, node selector with %s: %v, want invalid", name, err)
		}
	}
	if err := cs.validate(&api.CreateSandboxRequest{NodeSelector: map[string]string{"zone": "a", "disk": "ssd"}, Spread: "zone"}); err != nil {
		t.Errorf("cluster, a good node selector: %v", err)
	}
	good := api.CreateSandboxRequest{Labels: map[string]string{"team/name": "x"}, Env: map[string]string{"A": "b"}, Spread: "zone"}
	if err := s.validate(&good); err != nil {
		t.Fatalf("validate defaults: %v", err)
	}
	if good.Template != "host" || good.Runtime != "ns" || good.CPU != 1 || good.MemoryMiB != 1024 || good.DiskGiB != 10 || good.PIDs != 1024 {
		t.Errorf("defaults not applied: %+v", good)
	}
}

// TestUnavailableRuntime checks that asking for a runtime the node knows
// but cannot offer (runsc missing) is a 503 saying why, not an unknown one.
func TestUnavailableRuntime(t *testing.T) {
	s, err := New(Config{Node: node.New(node.Config{Runtimes: []runtime.Runtime{nopRuntime{}}, Unavailable: map[string]string{"gvisor": "runsc is not installed"}})})
	if err != nil {
		t.Fatal(err)
	}
	err = s.validate(&api.CreateSandboxRequest{Runtime: "gvisor"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "runsc is not installed") {
		t.Errorf("validate: %v, want unavailable saying why", err)
	}
	if err := s.validate(&api.CreateSandboxRequest{Runtime: "qemu"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("validate of an unknown runtime: %v, want invalid", err)
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := newID()
		if !api.ValidSandboxID(id) || seen[id] || id[0] >= '0' && id[0] <= '9' {
			t.Fatalf("bad or repeated ID %q", id)
		}
		seen[id] = true
	}
	for _, id := range []string{"", "short", strings.Repeat("A", 20), strings.Repeat("a", 21), "../../etc/passwd/xxxx", "aaaaaaaaaaaaaaaaaaa\x00"} {
		if api.ValidSandboxID(id) {
			t.Errorf("api.ValidSandboxID(%q) = true", id)
		}
	}
}
