package cgroup

import (
	"fmt"
	"os"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// TestRaiseMemory raises a cgroup's memory limit with memory+swap equal to
// it (no swap), as a prestarted sandbox's limits are raised to its
// create's, then lowers it again.
func TestRaiseMemory(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("ATOLL_TEST_STRICT") == "1" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	mem := func(mib int64) *specs.LinuxResources {
		b := mib << 20
		return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &b, Swap: &b}}
	}
	cg, err := New(fmt.Sprintf("/atoll-test-raise-%d", os.Getpid()), mem(1024))
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Delete()
	for _, mib := range []int64{2048, 4096, 512, 1024} {
		if err := cg.Update(mem(mib)); err != nil {
			t.Fatalf("to %d MiB: %v", mib, err)
		}
	}
}
