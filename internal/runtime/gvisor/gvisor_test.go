package gvisor_test

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/gvisor"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestConformance(t *testing.T) {
	rt, env := newRuntime(t)
	t.Logf("runsc platform %s", rt.Platform())
	env.Network = runtimetest.Networks(t)
	runtimetest.Run(t, rt, env)
}

// newRuntime makes a gvisor runtime over a fresh layer store, or skips (in
// strict mode fails) where runsc is missing.
func newRuntime(t testing.TB) (*gvisor.Runtime, runtimetest.Env) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "runsc")
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	runRoot := filepath.Join(dir, "run")
	open := func(t testing.TB) *gvisor.Runtime {
		rt, err := gvisor.New(gvisor.Config{RunRoot: runRoot})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	rt := open(t)
	t.Cleanup(func() { _ = osexec.Command("umount", "-l", runRoot).Run() })
	return rt, runtimetest.Env{
		Layers:    ls,
		AgentPath: testenv.AgentBinary(t),
		Leftovers: func(id string) []string { return leftovers(runRoot, id) },
		Processes: processes,
		Reopen:    func(t testing.TB) runtime.Runtime { return open(t) },
	}
}

// leftovers lists what a stopped sandbox might have left on the host.
func leftovers(runRoot, id string) []string {
	out := runtimetest.Mounts(id)
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/atoll-gvisor/" + id)
	if c := "/sys/fs/cgroup/atoll-gvisor/" + id; exists(c) {
		cgs = append(cgs, c)
	}
	for _, c := range cgs {
		out = append(out, "cgroup: "+c)
	}
	for _, p := range []string{filepath.Join(runRoot, id), filepath.Join(runRoot, "state", id)} {
		if exists(p) {
			out = append(out, "dir: "+p)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(runRoot, "state", id+"_*")); len(m) > 0 {
		out = append(out, "runsc state: "+strings.Join(m, " "))
	}
	for _, pid := range processes(id) {
		out = append(out, "process: "+strconv.Itoa(pid))
	}
	return out
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// processes lists the PIDs in sandbox id's host cgroup: sentry, gofer and
// ptrace stubs.
func processes(id string) []int { return runtimetest.CgroupPIDs("atoll-gvisor/" + id) }

// TestCheckpointRefused checks that a sandbox holding a unix socket bound on
// its file system, which runsc cannot save, is refused a checkpoint and goes
// on running, rather than lost in a failed one.
func TestCheckpointRefused(t *testing.T) {
	rt, env := newRuntime(t)
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	sb.MustSh(t, `nohup python3 -c 'import socket, time; s = socket.socket(socket.AF_UNIX); s.bind("/tmp/held.sock"); s.listen(1); time.sleep(600)' >/dev/null 2>&1 &
for i in $(seq 100); do [ -S /tmp/held.sock ] && break; sleep 0.05; done`)
	err := rt.Checkpoint(context.Background(), sb.ID, sb.Inst, filepath.Join(t.TempDir(), "image"))
	if err == nil {
		t.Fatal("checkpoint of a sandbox holding a bound socket succeeded")
	}
	if !strings.Contains(err.Error(), "held.sock") {
		t.Errorf("error does not name the socket: %v", err)
	}
	if !rt.Alive(sb.Inst) {
		t.Fatal("the sandbox died")
	}
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("after a refused checkpoint: %q", got)
	}
}

// TestAgentSocketHeld checks that no process in the sandbox can take the
// agent's socket away or put its own in its place: after a start, and after
// the agent let go of its socket and took it up again in the same sandbox, as
// after a node crash in the middle of a checkpoint.
func TestAgentSocketHeld(t *testing.T) {
	rt, env := newRuntime(t)
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	attack := func(when string) {
		t.Helper()
		// A socket bound in the sealed directory may live in the sentry
		// alone; on the host, where the node connects, nothing changes.
		out, _, _ := sb.Sh(t, `rm -f /dev/.atoll/sock/agent.sock 2>/dev/null && echo removed
mv /dev/.atoll/sock/agent.sock /dev/.atoll/sock/old 2>/dev/null && echo moved
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/dev/.atoll/sock/x.sock")' 2>/dev/null
echo x > /dev/.atoll/sock/f 2>/dev/null && echo wrote
mkdir /dev/.atoll/sock/d 2>/dev/null && echo made
echo x > /dev/.atoll/atoll-agent 2>/dev/null && echo agent written
echo done`)
		if out != "done\n" {
			t.Errorf("%s, inside the sandbox: %q", when, out)
		}
		ents, err := os.ReadDir(filepath.Dir(rt.SocketPath(sb.ID)))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if len(names) != 1 || names[0] != filepath.Base(rt.SocketPath(sb.ID)) {
			t.Errorf("%s, the host's socket directory holds %v", when, names)
		}
		if got := sb.MustSh(t, "echo up"); got != "up\n" {
			t.Errorf("%s, the agent after the attempts: %q", when, got)
		}
	}
	attack("after the start")

	ctx := context.Background()
	if err := rt.ReleaseForTest(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatal(err)
	}
	if err := rt.Settle(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatalf("the agent taking up its socket again: %v", err)
	}
	attack("after a release and listen")
}
