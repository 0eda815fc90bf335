package main

import "testing"

// TestRuntimeCgroups checks what --cgroup-parent makes of a name, and that
// it takes nothing that could leave the cgroup root or name another
// server's cgroups in part.
func TestRuntimeCgroups(t *testing.T) {
	got, err := runtimeCgroups("atoll")
	if want := (cgroupParents{ns: "/atoll", gvisor: "/atoll-gvisor", vm: "/atoll-vm"}); err != nil || got != want {
		t.Errorf("default: %+v, %v; want %+v (the single-machine layout)", got, err, want)
	}
	if got, err := runtimeCgroups("atoll-c1a2b3-n2"); err != nil || got.vm != "/atoll-c1a2b3-n2-vm" {
		t.Errorf("a node's: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "..", "../atoll", "a/b", "/atoll", "Atoll", "1atoll", "atoll\n", "atoll x", string(make([]byte, 65))} {
		if _, err := runtimeCgroups(bad); err == nil {
			t.Errorf("--cgroup-parent %q accepted", bad)
		}
	}
}
