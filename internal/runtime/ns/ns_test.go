package ns_test

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"

	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	runRoot := filepath.Join(dir, "run")
	rt, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(runRoot) })
	runtimetest.Run(t, rt, runtimetest.Env{
		Layers:    ls,
		AgentPath: testenv.AgentBinary(t),
		Leftovers: func(id string) []string { return leftovers(runRoot, id) },
		Processes: processes,
		Reopen: func(t testing.TB) runtime.Runtime {
			rt, err := ns.New(ns.Config{RunRoot: runRoot})
			if err != nil {
				t.Fatal(err)
			}
			return rt
		},
		Network: runtimetest.Networks(t),
	})
}

// TestCleanupHalfMadeCgroup: a crash while a sandbox's v1 cgroup is being
// made leaves it in some controllers only (the freezer comes first); Cleanup
// removes it all the same.
func TestCleanupHalfMadeCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/freezer"); err != nil {
		t.Skip("no v1 freezer hierarchy: cgroups are made whole on v2")
	}
	runRoot := filepath.Join(testenv.Dir(t), "run")
	rt, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(runRoot) })
	const id = "halfmadecgroup000000"
	dir := "/sys/fs/cgroup/freezer/atoll/" + id
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	if err := rt.Cleanup(context.Background(), id); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-made cgroup left: %v", err)
	}
}

// leftovers lists what a stopped sandbox might have left on the host.
func leftovers(runRoot, id string) []string {
	out := runtimetest.Mounts(id)
	for _, c := range []string{"/sys/fs/cgroup/memory/atoll/" + id, "/sys/fs/cgroup/pids/atoll/" + id, "/sys/fs/cgroup/atoll/" + id} {
		if _, err := os.Stat(c); err == nil {
			out = append(out, "cgroup: "+c)
		}
	}
	if _, err := os.Stat(filepath.Join(runRoot, id)); err == nil {
		out = append(out, "dir: "+filepath.Join(runRoot, id))
	}
	return out
}

// processes lists the PIDs in sandbox id's cgroup.
func processes(id string) []int { return runtimetest.CgroupPIDs("atoll/" + id) }

func unmountAll(dir string) {
	_ = exec("umount", "-l", dir)
}

func exec(name string, args ...string) error {
	return osexec.Command(name, args...).Run()
}
