package vm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/runtime/vm"
	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestConformance(t *testing.T) {
	rt, env := newRuntime(t)
	t.Logf("accelerator %s", rt.Accel())
	if e := rt.Capabilities().Emulated; e != (rt.Accel() == "tcg") {
		t.Errorf("emulated is %v under %s", e, rt.Accel())
	}
	env.Network = runtimetest.Networks(t)
	runtimetest.Run(t, rt, env)
}

// cacheDir keeps the images every run builds the same (the guest kernel,
// the initramfs, the host template's /usr as erofs) across test runs:
// building /usr's takes a minute.
func cacheDir(t testing.TB) string {
	if d := os.Getenv("ATOLL_TEST_VM_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d, "atoll-test", "vm")
}

// newRuntime makes a vm runtime over a fresh layer store, or skips (in
// strict mode fails) where QEMU or a guest kernel is missing.
func newRuntime(t testing.TB) (*vm.Runtime, runtimetest.Env) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "qemu-system-x86_64")
	testenv.RequireCommand(t, "mkfs.erofs")
	testenv.RequireCommand(t, "rsync")
	if m, _ := filepath.Glob("/boot/vmlinuz-*"); len(m) == 0 {
		testenv.Skip(t, "no guest kernel in /boot (install linux-image-amd64)")
	}
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	runRoot := filepath.Join(dir, "run")
	cache := cacheDir(t)
	if err := os.MkdirAll(cache, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(runRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	// The run root's cache/ is the shared one.
	if err := os.Symlink(cache, filepath.Join(runRoot, "cache")); err != nil {
		t.Fatal(err)
	}
	open := func(t testing.TB) *vm.Runtime {
		rt, err := vm.New(vm.Config{RunRoot: runRoot, Accel: os.Getenv("ATOLL_TEST_VM_ACCEL")})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	rt := open(t)
	return rt, runtimetest.Env{
		Layers:    ls,
		AgentPath: testenv.AgentBinary(t),
		Leftovers: func(id string) []string { return leftovers(runRoot, id) },
		Processes: processes,
		Reopen:    func(t testing.TB) runtime.Runtime { return open(t) },
		OwnDisk:   true,
	}
}

// leftovers lists what a stopped sandbox might have left on the host.
func leftovers(runRoot, id string) []string {
	out := runtimetest.Mounts(id)
	if _, err := os.Stat(filepath.Join(runRoot, "sandboxes", id)); err == nil {
		out = append(out, "dir: "+filepath.Join(runRoot, "sandboxes", id))
	}
	for _, pid := range processes(id) {
		out = append(out, "process: "+strconv.Itoa(pid))
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/atoll-vm/" + id); len(m) > 0 {
		out = append(out, m...)
	}
	if _, err := os.Stat("/sys/fs/cgroup/atoll-vm/" + id); err == nil {
		out = append(out, "cgroup: /sys/fs/cgroup/atoll-vm/"+id)
	}
	if b, err := os.ReadFile("/proc/partitions"); err == nil {
		_ = b // loop devices are checked by their backing files below
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, err := os.ReadFile(l); err == nil && bytes.Contains(b, []byte(id)) {
			out = append(out, "loop: "+l)
		}
	}
	return out
}

// processes lists the host PIDs of sandbox id's QEMU and proxy: the
// processes whose command line names its run directory.
func processes(id string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(b, []byte("/sandboxes/"+id+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestCheckpointAcrossNodes pauses a sandbox to disk with a process
// counting, restores it with a new Runtime value (as a restarted node
// would), and checks the process counts on from where it was, its files
// kept, and that a second stop and start still has them.
func TestCheckpointAcrossNodes(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	sb.MustSh(t, `echo kept > /root/f; nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done' >/dev/null 2>&1 &`)
	c0 := waitFile(t, sb, 3)
	img := filepath.Join(t.TempDir(), "image")
	if err := rt.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if rt.Alive(sb.Inst) {
		t.Fatal("alive after checkpoint")
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after checkpoint: %v", left)
	}
	if b, err := os.ReadFile(filepath.Join(sb.Spec.Rootfs.Writable, "upper/root/f")); err != nil || string(b) != "kept\n" {
		t.Errorf("writable layer after checkpoint: %q, %v", b, err)
	}
	// The guest's clock stands still while it is saved: restore sets it.
	time.Sleep(5 * time.Second)
	rt2 := env.Reopen(t).(*vm.Runtime)
	inst, err := rt2.Restore(ctx, sb.Spec, img)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	sb.Inst = inst
	sb.Client = runtimetest.Client(inst)
	c1 := waitFile(t, sb, c0)
	checkClock(t, sb)
	// The same shell, still counting: its PID and its count go on.
	if got := sb.MustSh(t, "cat /root/f"); got != "kept\n" {
		t.Errorf("after restore: %q", got)
	}
	if c1 < c0 {
		t.Errorf("counter went back from %d to %d", c0, c1)
	}
	if err := rt2.Stop(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatal(err)
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after stop: %v", left)
	}
}

// checkClock checks the guest's clock is within 2 s of the host's.
func checkClock(t *testing.T, sb *runtimetest.Sandbox) {
	t.Helper()
	out := sb.MustSh(t, "date +%s.%N")
	var guest float64
	fmt.Sscan(out, &guest)
	host := float64(time.Now().UnixNano()) / 1e9
	if d := host - guest; d > 2 || d < -2 {
		t.Errorf("the guest's clock is %.1f s off the host's", d)
	}
}

// waitFile waits until the counter in /tmp/n passes n.
func waitFile(t *testing.T, sb *runtimetest.Sandbox, n int) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _, code := sb.Sh(t, "cat /tmp/n 2>/dev/null")
		var c int
		fmt.Sscan(out, &c)
		if code == 0 && c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not pass %d (%q)", n, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCrash kills a running sandbox's QEMU and proxy as a host crash
// would: the runtime sees it gone, Cleanup leaves nothing behind and copies
// what the guest had written back into the writable layer, and the sandbox
// starts again with it.
func TestCrash(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	sb.MustSh(t, "echo before > /root/f && sync")
	for _, pid := range env.Processes(sb.ID) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); rt.Alive(sb.Inst) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if rt.Alive(sb.Inst) {
		t.Fatal("alive after its QEMU was killed")
	}
	if err := rt.Cleanup(ctx, sb.ID); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after cleanup: %v", left)
	}
	if b, err := os.ReadFile(filepath.Join(sb.Spec.Rootfs.Writable, "upper/root/f")); err != nil || string(b) != "before\n" {
		t.Errorf("writable layer after the crash: %q, %v", b, err)
	}
	inst, err := rt.Start(ctx, sb.Spec)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst, sb.Client = inst, runtimetest.Client(inst)
	if got := sb.MustSh(t, "cat /root/f"); got != "before\n" {
		t.Errorf("after restart: %q", got)
	}
}

// TestHostileInput checks what a caller or a tampered checkpoint could
// hand the runtime: IDs that are paths, an empty or forged checkpoint.
func TestHostileInput(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a/b", "a,b", strings.Repeat("a", 65)} {
		if err := rt.Cleanup(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("cleanup of %q: %v", id, err)
		}
		spec := runtime.Spec{ID: id, AgentPath: env.AgentPath}
		if _, err := rt.Start(ctx, spec); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("start of %q: %v", id, err)
		}
	}
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	if err := rt.Update(ctx, sb.ID, runtime.Limits{MemoryBytes: 64 << 30}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("growing a vm's memory past its start: %v", err)
	}
	img := filepath.Join(t.TempDir(), "image")
	if _, err := rt.Restore(ctx, sb.Spec, img); err == nil {
		t.Error("restore from nothing succeeded")
	}
	if err := rt.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
		t.Fatal(err)
	}
	// A checkpoint that names a host file as a disk is refused, and the
	// refusal leaves the checkpoint as it was.
	mf := filepath.Join(img, "machine.json")
	b, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	forged := bytes.Replace(b, []byte(`"read_only":true`), []byte(`"read_only":true},{"serial":"x","path":"/etc/shadow","read_only":true`), 1)
	if err := os.WriteFile(mf, forged, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Restore(ctx, sb.Spec, img); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("restore of a forged checkpoint: %v", err)
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after a refused restore: %v", left)
	}
	if err := os.WriteFile(mf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Restore(ctx, sb.Spec, img)
	if err != nil {
		t.Fatalf("restore after the refusal: %v", err)
	}
	sb.Inst, sb.Client = inst, runtimetest.Client(inst)
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("restored: %q", got)
	}
}

// TestNoRawDisks checks that nothing in the sandbox can make a device node
// of the VM's disks: root there has no CAP_MKNOD.
func TestNoRawDisks(t *testing.T) {
	rt, env := newRuntime(t)
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	out, _, _ := sb.Sh(t, `for d in /sys/block/vd*; do n=$(cat $d/dev); mknod /tmp/raw b ${n%:*} ${n#*:} 2>/dev/null && echo made $d; rm -f /tmp/raw; done
grep CapBnd /proc/self/status | awk '{print $2}'`)
	if strings.Contains(out, "made") {
		t.Errorf("made a node of a VM disk: %q", out)
	}
	// Docker's default set less CAP_MKNOD.
	if !strings.Contains(out, "00000000a00425fb") {
		t.Errorf("capability bounding set: %q", out)
	}
}

// TestPauseWritesBack checks that a paused sandbox's files are in its
// writable layer, where a snapshot or fork of the frozen sandbox reads them.
func TestPauseWritesBack(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	sb.MustSh(t, "mkdir -p /root/d && echo one > /root/d/f && rm -f /etc/motd")
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(sb.Spec.Rootfs.Writable, "upper")
	if b, err := os.ReadFile(filepath.Join(upper, "root/d/f")); err != nil || string(b) != "one\n" {
		t.Errorf("paused sandbox's file in the writable layer: %q, %v", b, err)
	}
	time.Sleep(3 * time.Second)
	if err := rt.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkClock(t, sb)
	sb.MustSh(t, "rm -r /root/d")
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(upper, "root/d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a directory removed in the sandbox is still in the writable layer: %v", err)
	}
	// A paused sandbox checkpoints, restores running, and stops, without
	// waiting on a guest that cannot answer.
	img := filepath.Join(t.TempDir(), "image")
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
		t.Fatalf("checkpoint of a paused sandbox: %v", err)
	}
	inst, err := rt.Restore(ctx, sb.Spec, img)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst, sb.Client = inst, runtimetest.Client(inst)
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("after restore: %q", got)
	}
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 25*time.Second {
		t.Errorf("checkpoint, restore and stop of a paused sandbox took %v", d)
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after stop: %v", left)
	}
}

// TestHostCgroup checks that a VM's QEMU runs in a host cgroup of its own
// whose CPU share is the sandbox's cpu_weight, changed by Update.
func TestHostCgroup(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64, CPUWeight: 50}, 1<<30)
	shares := func() string {
		t.Helper()
		for _, f := range []string{"/sys/fs/cgroup/cpu/atoll-vm/" + sb.ID + "/cpu.shares", "/sys/fs/cgroup/atoll-vm/" + sb.ID + "/cpu.weight"} {
			if b, err := os.ReadFile(f); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		t.Fatal("no cpu share file in the VM's host cgroup")
		return ""
	}
	in := false
	for _, f := range []string{"/sys/fs/cgroup/cpu/atoll-vm/" + sb.ID + "/cgroup.procs", "/sys/fs/cgroup/atoll-vm/" + sb.ID + "/cgroup.procs"} {
		if b, err := os.ReadFile(f); err == nil && slices.Contains(strings.Fields(string(b)), strconv.Itoa(sb.Inst.PID)) {
			in = true
		}
	}
	if !in {
		t.Errorf("QEMU (%d) is not in its host cgroup", sb.Inst.PID)
	}
	// v1 shares are weight*1024/100; v2's weight is converted from them.
	before := shares()
	if err := rt.Update(ctx, sb.ID, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64, CPUWeight: 400}); err != nil {
		t.Fatal(err)
	}
	after := shares()
	t.Logf("cpu share: %s at weight 50, %s at 400", before, after)
	if b, a := atoi(before), atoi(after); b <= 0 || a <= b*4 {
		t.Errorf("cpu share %s at weight 50, %s at 400", before, after)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestSettle checks that a sandbox a crashed checkpoint left stopped (here:
// paused, as the checkpoint's first step leaves it) goes on after Settle.
func TestSettle(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	sb := runtimetest.Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := env.Reopen(t).(*vm.Runtime).Settle(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("after settle: %q", got)
	}
	if err := rt.Settle(ctx, sb.ID, sb.Inst); err != nil {
		t.Errorf("settling a running sandbox: %v", err)
	}
}
