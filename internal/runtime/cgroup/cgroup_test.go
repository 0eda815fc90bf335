package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// TestDeleteBusy deletes a cgroup holding a process (refused, the cgroup
// kept), then after the process ended (gone from every hierarchy), as a
// sandbox's delete does.
func TestDeleteBusy(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("ATOLL_TEST_STRICT") == "1" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	path := fmt.Sprintf("/atoll-test-delete-%d", os.Getpid())
	cg, err := New(path, &specs.LinuxResources{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cg.Start(cmd, ""); err != nil {
		cg.Delete()
		t.Fatal(err)
	}
	if err := cg.Delete(); err == nil {
		t.Error("Delete of a cgroup holding a process succeeded")
	}
	if pids, err := cg.PIDs(); err != nil || len(pids) != 1 {
		t.Errorf("after the refused Delete: pids %v, %v", pids, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := cg.Delete(); err != nil {
		t.Fatalf("Delete after the process ended: %v", err)
	}
	dirs := []string{filepath.Join("/sys/fs/cgroup", path)}
	if !Unified() {
		dirs = nil
		for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer"} {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", c, path))
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s after Delete: %v", d, err)
		}
	}
}
