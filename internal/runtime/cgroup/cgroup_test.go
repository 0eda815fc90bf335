package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

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

// TestKillAllBelow: PIDs lists the processes of a cgroup and of one below
// it, KillAll ends them all, and a frozen cgroup thaws (a thawed one is
// left as it is), as a delete of a paused sandbox does.
func TestKillAllBelow(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("ATOLL_TEST_STRICT") == "1" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	path := fmt.Sprintf("/atoll-test-killall-%d", os.Getpid())
	cg, err := New(path, &specs.LinuxResources{})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Delete()
	child, err := New(path+"/below", &specs.LinuxResources{})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Delete()
	var cmds []*exec.Cmd
	for _, c := range []*Cgroup{cg, child} {
		cmd := exec.Command("sleep", "60")
		if err := c.Start(cmd, ""); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		cmds = append(cmds, cmd)
	}
	pids, err := cg.PIDs()
	if err != nil || len(pids) != 2 || !slices.Contains(pids, cmds[0].Process.Pid) || !slices.Contains(pids, cmds[1].Process.Pid) {
		t.Fatalf("PIDs: %v, %v; want %d and %d", pids, err, cmds[0].Process.Pid, cmds[1].Process.Pid)
	}
	if err := cg.Freeze(); err != nil {
		t.Fatal(err)
	}
	if !Unified() {
		if frozen, err := cg.v1Frozen(); err != nil || !frozen {
			t.Fatalf("after Freeze: frozen %v, %v", frozen, err)
		}
	}
	for range 2 {
		if err := cg.Thaw(); err != nil {
			t.Fatal(err)
		}
	}
	if !Unified() {
		if frozen, err := cg.v1Frozen(); err != nil || frozen {
			t.Fatalf("after Thaw: frozen %v, %v", frozen, err)
		}
	}
	done := make(chan error, 2)
	for _, cmd := range cmds {
		go func() { done <- cmd.Wait() }()
	}
	if err := cg.KillAll(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for range cmds {
		if err := <-done; err == nil {
			t.Error("a process ended without being killed")
		}
	}
	if pids, err := cg.PIDs(); err != nil || len(pids) != 0 {
		t.Errorf("after KillAll: %v, %v", pids, err)
	}
}
