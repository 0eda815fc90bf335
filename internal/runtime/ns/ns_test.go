package ns_test

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

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

// newRuntime is an ns runtime with its run directory in a test directory,
// and what its sandboxes start from.
func newRuntime(t *testing.T) (rt *ns.Runtime, runRoot string, env runtimetest.Env) {
	return newRuntimeWith(t, ns.Config{})
}

// newRuntimeWith is newRuntime with cfg, less its run directory.
func newRuntimeWith(t *testing.T, cfg ns.Config) (rt *ns.Runtime, runRoot string, env runtimetest.Env) {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.Dir(t)
	runRoot = filepath.Join(dir, "run")
	cfg.RunRoot = runRoot
	rt, err := ns.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(runRoot) })
	return rt, runRoot, runtimetest.Env{Layers: testenv.Layers(t, dir), AgentPath: testenv.AgentBinary(t)}
}

// TestAgentProcs: the agent runs on as many Ps as its sandbox has cores
// (rounded up, at least two), a prepared process taking its create's
// limit.
func TestAgentProcs(t *testing.T) {
	rt, _, env := newRuntime(t)
	procs := func(sb *runtimetest.Sandbox) string {
		h, err := runtimetest.Client(sb.Inst).Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(h.Procs)
	}
	for _, c := range []struct {
		cpu  float64
		want string
	}{{1, "2"}, {0.5, "2"}, {2.5, "3"}, {4, "4"}} {
		sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: c.cpu, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
		if got := procs(sb); got != c.want {
			t.Errorf("%g cores: the agent runs on %s Ps, want %s", c.cpu, got, c.want)
		}
	}
	sb := runtimetest.New(t, rt, env, runtime.Limits{CPU: 3, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	prep := sb.Spec
	prep.Limits.CPU = 1 // 2 Ps
	if err := rt.Prepare(context.Background(), prep); err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Start(context.Background(), sb.Spec)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst = inst
	if got := procs(sb); got != "3" {
		t.Errorf("prepared at 1 core, started at 3: the agent runs on %s Ps", got)
	}
}

// TestStagingLeavesNoMountPoints: once a sandbox has started, its staging
// directory holds nothing. The layers' mount points were the staging
// tmpfs's own directories, gone with it, not directories of the run
// directory that another sandbox's mount namespace, cloned meanwhile, may
// still mount on, so that removing each at the sandbox's end would wait for
// an RCU grace period.
func TestStagingLeavesNoMountPoints(t *testing.T) {
	rt, runRoot, env := newRuntime(t)
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	mnt := filepath.Join(runRoot, sb.ID, "mnt")
	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("the started sandbox's staging directory %s holds %v, want nothing", mnt, entries)
	}
}

// TestRootOverlayVolatile: a sandbox's root overlay is volatile unless the
// runtime was told to honour fsync in sandboxes (the conformance suite's
// restart mounts a volatile one again).
func TestRootOverlayVolatile(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		rt, _, env := newRuntimeWith(t, ns.Config{SandboxFsync: fsync})
		sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
		root := sb.MustSh(t, "grep ' / / ' /proc/self/mountinfo")
		if volatile := testenv.MountedVolatile(root); volatile == fsync {
			t.Errorf("SandboxFsync %v: the root is mounted %s", fsync, root)
		}
	}
}

// TestAliveAfterInitDies: a sandbox whose init is killed from the host is
// not alive to the runtime that started it (which asks its pidfd) nor to
// another (which reads /proc), and Stop after that still cleans up.
func TestAliveAfterInitDies(t *testing.T) {
	rt, runRoot, env := newRuntime(t)
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	if !rt.Alive(sb.Inst) {
		t.Fatal("not alive after start")
	}
	other, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		t.Fatal(err)
	}
	if !other.Alive(sb.Inst) {
		t.Fatal("not alive to another runtime after start")
	}
	if err := syscall.Kill(sb.Inst.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rt.Alive(sb.Inst) {
		if time.Now().After(deadline) {
			t.Fatal("still alive 5 s after its init was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if other.Alive(sb.Inst) {
		t.Error("alive to another runtime after its init was killed")
	}
	if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(runRoot, sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the run directory after stop: %v", err)
	}
}
