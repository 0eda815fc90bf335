// Package runtimetest is the conformance suite every runtime backend passes:
// lifecycle, exec through the agent, persistence across stop and start,
// isolation from the host, limits, pause, re-adoption by a new node, memory
// checkpoints, and leaving nothing behind. What a backend's runtime.Caps do
// not claim is skipped, by name, never passed silently.
package runtimetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// Env is what the suite needs besides the runtime.
type Env struct {
	Layers    *layers.Store
	AgentPath string
	// Leftovers lists host resources (mounts, cgroups, directories, processes)
	// that belong to sandbox id; the suite checks it is empty after Stop.
	Leftovers func(id string) []string
	// Processes lists the host PIDs of sandbox id's processes.
	Processes func(id string) []int
	// Reopen, if set, returns a new Runtime over the same host state, as a
	// restarted node makes: the suite checks it re-adopts running sandboxes.
	Reopen func(t testing.TB) runtime.Runtime
	// Network, if set, gives the sandbox in slot a network (made by package
	// network) until t ends; the suite then checks sandboxes with one.
	Network func(t testing.TB, slot int) *runtime.Network
	// OwnDisk says a sandbox's writes reach its writable layer only once it
	// stops (vm: the guest writes to a disk of its own, copied back at stop
	// and checkpoint). The suite then reads a running sandbox's files
	// through its agent, and checks Pause by the rate a counter keeps
	// rather than by reading it while paused.
	OwnDisk bool
}

var seq atomic.Int64

// runID tells this test process's sandboxes from another's.
var runID = func() string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 6)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return string(b)
}()

// Sandbox is a sandbox started by the suite.
type Sandbox struct {
	ID     string
	Spec   runtime.Spec
	Inst   runtime.Instance
	Client *agent.Client
	slot   int
	// ownDisk is Env.OwnDisk.
	ownDisk bool
}

// Start starts a sandbox from the host template with limits l.
func Start(t testing.TB, rt runtime.Runtime, env Env, l runtime.Limits, diskBytes int64) *Sandbox {
	t.Helper()
	sb := newSandbox(t, rt, env, l, diskBytes)
	sb.start(t, rt)
	return sb
}

// New makes the writable layer and spec of a sandbox with limits l and
// arranges its removal, without starting it: a test may change the spec
// (give it a network for Slot) and start it itself.
func New(t testing.TB, rt runtime.Runtime, env Env, l runtime.Limits, diskBytes int64) *Sandbox {
	t.Helper()
	return newSandbox(t, rt, env, l, diskBytes)
}

// Slot is the sandbox's slot, which names its network.
func (sb *Sandbox) Slot() int { return sb.slot }

// newSandbox makes the writable layer and spec of a sandbox and arranges its
// removal, without starting it.
func newSandbox(t testing.TB, rt runtime.Runtime, env Env, l runtime.Limits, diskBytes int64) *Sandbox {
	t.Helper()
	n := int(seq.Add(1))
	// IDs name cgroups and run directories host-wide: unique per test
	// process, as packages' tests run side by side.
	id := fmt.Sprintf("rt%s%012d", runID, n)
	tmpl, err := env.Layers.Template(layers.HostTemplate)
	if err != nil {
		t.Fatal(err)
	}
	slot := 1000 + n + int(time.Now().UnixNano()%1000)*10
	w, err := env.Layers.CreateWritable(id, diskBytes)
	if err != nil {
		t.Fatal(err)
	}
	spec := runtime.Spec{
		ID: id, Hostname: id,
		Rootfs:    runtime.Rootfs{Layers: tmpl.Layers, Writable: w, Binds: tmpl.Binds},
		Limits:    l,
		IDMap:     runtime.IDMap{HostID: uint32(1<<27 + slot*65536), Size: 65536},
		Env:       map[string]string{"ATOLL_TEST": "1"},
		AgentPath: env.AgentPath,
	}
	sb := &Sandbox{ID: id, Spec: spec, slot: slot, ownDisk: env.OwnDisk}
	t.Cleanup(func() {
		_ = rt.Stop(context.Background(), id, sb.Inst)
		_ = env.Layers.RemoveWritable(id)
	})
	return sb
}

func (sb *Sandbox) start(t testing.TB, rt runtime.Runtime) {
	t.Helper()
	inst, err := rt.Start(context.Background(), sb.Spec)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	sb.connect(inst)
}

// connect records inst as sb's running instance and connects to its agent.
func (sb *Sandbox) connect(inst runtime.Instance) {
	sb.Inst = inst
	sb.Client = Client(inst)
}

// Client is a client of inst's agent.
func Client(inst runtime.Instance) *agent.Client {
	sock := inst.Socket
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// Sh runs a shell command as root and returns stdout, stderr and exit code.
func (sb *Sandbox) Sh(t testing.TB, cmd string) (string, string, int) {
	t.Helper()
	return sb.ShAs(t, "root", cmd)
}

// ShAs runs a shell command as user.
func (sb *Sandbox) ShAs(t testing.TB, user, cmd string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := sb.Client.Exec(ctx, api.ExecRequest{Shell: cmd, User: user})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return string(res.Stdout), string(res.Stderr), res.ExitCode
}

// MustSh runs cmd and fails t unless it exits 0.
func (sb *Sandbox) MustSh(t testing.TB, cmd string) string {
	t.Helper()
	out, errOut, code := sb.Sh(t, cmd)
	if code != 0 {
		t.Fatalf("%q exited %d: %s%s", cmd, code, out, errOut)
	}
	return out
}

// Run runs the suite against rt.
func Run(t *testing.T, rt runtime.Runtime, env Env) {
	caps := runtime.CapsOf(rt)
	t.Logf("%s claims %+v", rt.Name(), caps)
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, rt, env) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, rt, env, caps) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, rt, env, caps) })
	t.Run("Update", func(t *testing.T) { testUpdate(t, rt, env) })
	t.Run("DiskQuota", func(t *testing.T) { testDiskQuota(t, rt, env) })
	t.Run("Usage", func(t *testing.T) {
		m, ok := rt.(runtime.Meter)
		if !ok {
			t.Fatal("the runtime is not a runtime.Meter: sandboxes on it would have no metrics")
		}
		testUsage(t, rt, m, env)
	})
	t.Run("DistinctFiles", func(t *testing.T) { testDistinctFiles(t, rt, env) })
	t.Run("Escapes", func(t *testing.T) { testEscapes(t, rt, env) })
	t.Run("FileMetadata", func(t *testing.T) { testFileMetadata(t, rt, env) })
	t.Run("Pause", func(t *testing.T) {
		if !caps.Pause {
			t.Skip("the runtime does not claim Pause")
		}
		testPause(t, rt, env)
	})
	t.Run("Readopt", func(t *testing.T) {
		if env.Reopen == nil {
			t.Skip("Env.Reopen is not set")
		}
		testReadopt(t, rt, env)
	})
	t.Run("MemorySnapshot", func(t *testing.T) { testCheckpoint(t, rt, checkpointer(t, rt, caps), env) })
	t.Run("Prepare", func(t *testing.T) { testPrepare(t, rt, implements[runtime.Preparer](t, rt, "Preparer"), env) })
	t.Run("ManyLayers", func(t *testing.T) { testManyLayers(t, rt, env) })
	t.Run("Setuid", func(t *testing.T) { testSetuid(t, rt, env) })
	t.Run("PrepareLayers", func(t *testing.T) {
		testPrepareLayers(t, rt, implements[runtime.LayerPreparer](t, rt, "LayerPreparer"), env)
	})
	if env.Network != nil {
		t.Run("Network", func(t *testing.T) { testNetwork(t, rt, env) })
		t.Run("NetworkCheckpoint", func(t *testing.T) { testNetworkCheckpoint(t, rt, checkpointer(t, rt, caps), env) })
	}
}

// implements returns rt as a T (named what), and skips the test if it is
// not one.
func implements[T any](t *testing.T, rt runtime.Runtime, what string) T {
	v, ok := rt.(T)
	if !ok {
		t.Skip("the runtime is not a " + what)
	}
	return v
}

// checkpointer returns rt's runtime.Checkpointer, and skips the test if rt
// does not claim MemorySnapshot.
func checkpointer(t *testing.T, rt runtime.Runtime, caps runtime.Caps) runtime.Checkpointer {
	cp, ok := rt.(runtime.Checkpointer)
	if !caps.MemorySnapshot || !ok {
		t.Skip("the runtime does not claim MemorySnapshot")
	}
	return cp
}

// testNetwork checks a sandbox started in a network namespace made for it:
// it sees its interfaces and addresses, its resolv.conf and hosts, and can
// change none of them; a prepared one gets the same.
func testNetwork(t *testing.T, rt runtime.Runtime, env Env) {
	check := func(t *testing.T, sb *Sandbox) {
		n := sb.Spec.Network
		if got := sb.MustSh(t, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort"); got != "eth0\nlo\n" {
			t.Errorf("interfaces: %q, want eth0 and lo", got)
		}
		checkBinds(t, sb)
		rc := sb.MustSh(t, "cat /etc/resolv.conf")
		for _, ns := range n.Nameservers {
			if !strings.Contains(rc, "nameserver "+ns.String()+"\n") {
				t.Errorf("resolv.conf lacks %s: %q", ns, rc)
			}
		}
		if hosts := sb.MustSh(t, "cat /etc/hosts"); !strings.Contains(hosts, n.Addrs[0].String()+"\t"+sb.ID+"\n") ||
			!strings.Contains(hosts, "localhost") {
			t.Errorf("hosts: %q", hosts)
		}
		for _, f := range []string{"/etc/resolv.conf", "/etc/hosts"} {
			if out, _, _ := sb.Sh(t, "echo x >> "+f+" 2>/dev/null && echo wrote || echo denied"); out != "denied\n" {
				t.Errorf("writing %s: %q", f, out)
			}
		}
		if out, _, _ := sb.Sh(t, "touch /sys/x 2>&1 >/dev/null | grep -c 'Read-only'"); out != "1\n" {
			t.Errorf("/sys is not read-only: %q", out)
		}
		const ip = "/usr/sbin/ip"
		if _, err := os.Stat(ip); err == nil {
			for _, args := range []string{"link set dev lo down", "link set dev eth0 mtu 1280", "addr add 192.0.2.7/32 dev eth0", "route add 192.0.2.0/24 dev eth0"} {
				out, errOut, code := sb.Sh(t, ip+" "+args)
				if code == 0 || !strings.Contains(errOut, "Operation not permitted") {
					t.Errorf("ip %s as sandbox root: exit %d %q %q, want EPERM", args, code, out, errOut)
				}
			}
		}
	}
	sb := newSandbox(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	sb.Spec.Network = env.Network(t, sb.slot)
	sb.start(t, rt)
	check(t, sb)
	if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
		t.Fatal(err)
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after stop: %v", left)
	}
	if p, ok := rt.(runtime.Preparer); ok {
		pre := newSandbox(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
		pre.Spec.Network = env.Network(t, pre.slot)
		if err := p.Prepare(context.Background(), pre.Spec); err != nil {
			t.Fatalf("prepare: %v", err)
		}
		pre.start(t, rt)
		check(t, pre)
	}
}

// testPrepare checks that a prepared sandbox starts with the limits Start
// gives, that one never started leaves nothing behind, and that one whose
// process died is started afresh.
func testPrepare(t *testing.T, rt runtime.Runtime, p runtime.Preparer, env Env) {
	ctx := context.Background()
	sb := newSandbox(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 64}, 1<<30)
	prep := sb.Spec
	prep.Limits = runtime.Limits{CPU: 2, MemoryBytes: 1 << 30, PIDs: 1024, CPUWeight: 5}
	if err := p.Prepare(ctx, prep); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	sb.start(t, rt)
	if got := sb.MustSh(t, "hostname; echo $ATOLL_TEST"); got != sb.ID+"\n1\n" {
		t.Errorf("prepared sandbox: %q", got)
	}
	out, _, _ := sb.Sh(t, pidsScript)
	var n int
	fmt.Sscan(out, &n)
	if n == 0 || n >= 100 {
		t.Errorf("started %d sleeps: the pids limit Start gave (64) does not hold", n)
	}

	unused := newSandbox(t, rt, env, runtime.Limits{PIDs: 64}, 1<<30)
	if err := p.Prepare(ctx, unused.Spec); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if err := rt.Cleanup(ctx, unused.ID); err != nil {
		t.Fatalf("cleanup of a prepared sandbox: %v", err)
	}
	if env.Leftovers != nil {
		if left := env.Leftovers(unused.ID); len(left) > 0 {
			t.Errorf("left after cleanup of a prepared sandbox: %v", left)
		}
	}

	dead := newSandbox(t, rt, env, runtime.Limits{PIDs: 64}, 1<<30)
	if err := p.Prepare(ctx, dead.Spec); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	pids := env.Processes(dead.ID)
	if len(pids) == 0 {
		t.Fatal("a prepared sandbox has no process")
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(5 * time.Second); len(env.Processes(dead.ID)) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	dead.start(t, rt)
	if got := dead.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("sandbox whose prepared process died: %q", got)
	}
}

func testLifecycle(t *testing.T, rt runtime.Runtime, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	if !rt.Alive(sb.Inst) {
		t.Fatal("not alive after start")
	}
	if got := sb.MustSh(t, "python3 -c 'print(1)'"); got != "1\n" {
		t.Errorf("python3 printed %q", got)
	}
	if got := sb.MustSh(t, "id -u; hostname; echo $ATOLL_TEST"); got != "0\n"+sb.ID+"\n1\n" {
		t.Errorf("id/hostname/env: %q", got)
	}
	// ns's agent runs its init stage first ("atoll-agent init"); others
	// start it bare.
	if got := strings.Fields(sb.MustSh(t, "cat /proc/1/cmdline | tr '\\0' ' '")); len(got) == 0 || got[0] != "atoll-agent" {
		t.Errorf("PID 1 is %q, want atoll-agent", got)
	}
	out, _, code := sb.ShAs(t, "user", "id -u; touch /home/user/mine && echo ok; touch /root/x 2>/dev/null || echo denied")
	if code != 0 || out != "1000\nok\ndenied\n" {
		t.Errorf("as user: %q (exit %d)", out, code)
	}
	sb.MustSh(t, "mkdir -p /root/work && echo kept > /root/work/file && git --version >/dev/null && echo hello > /tmp/t")
	// Each start is a boot: a new boot ID (E2B's SDK tells a reboot from a
	// resume by it), which the sandbox cannot change.
	boot := sb.MustSh(t, "cat /proc/sys/kernel/random/boot_id")
	if len(strings.TrimSpace(boot)) != 36 {
		t.Errorf("boot_id %q", boot)
	}
	if _, _, code := sb.Sh(t, "echo 00000000-0000-4000-8000-000000000000 > /proc/sys/kernel/random/boot_id"); code == 0 {
		t.Error("the sandbox wrote its boot_id")
	}

	if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if rt.Alive(sb.Inst) {
		t.Fatal("alive after stop")
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after stop: %v", left)
	}
	if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
		t.Errorf("second stop: %v", err)
	}
	sb.start(t, rt)
	if got := sb.MustSh(t, "cat /root/work/file /tmp/t"); got != "kept\nhello\n" {
		t.Errorf("after restart: %q", got)
	}
	if again := sb.MustSh(t, "cat /proc/sys/kernel/random/boot_id"); again == boot || len(strings.TrimSpace(again)) != 36 {
		t.Errorf("boot_id after restart %q, before %q: want a new one", again, boot)
	}
	if got := sb.MustSh(t, ls+"ls1 /home/user"); got != "mine\n" {
		t.Errorf("/home/user after restart: %q", got)
	}
}

// ls defines shell functions that list a directory's names, one a line:
// ls1 without and lsA with dot files. The suite lists with them rather than
// ls(1) so that what it checks is the sandbox, not coreutils: coreutils 9
// calls statx with AT_NO_AUTOMOUNT, which runsc before 2023 rejects.
const ls = `ls1() { for f in "$1"/*; do [ -e "$f" ] || [ -L "$f" ] && echo "${f##*/}"; done; return 0; }
lsA() { for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do [ -e "$f" ] || [ -L "$f" ] && echo "${f##*/}"; done; return 0; }
`

func testIsolation(t *testing.T, rt runtime.Runtime, env Env, caps runtime.Caps) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	hostShadow, _ := os.ReadFile("/etc/shadow")
	checks := []struct {
		name, cmd, want string
		// hostKernel marks how a sandbox on the host kernel is confined;
		// under a user-space kernel or a VM they check nothing that
		// isolates it (Caps.SharedKernel).
		hostKernel bool
	}{
		{"own shadow", "cat /etc/shadow | head -1 | cut -d: -f1,2", "root:*\n", false},
		{"empty root home", "lsA /root", "", false},
		{"no host var", "ls1 /var", "cache\nlib\nlog\ntmp\n", false},
		{"no host home", "ls1 /home", "user\n", false},
		{"pid namespace", "ls1 /proc | grep -c '^[0-9]'", "", false}, // checked below
		{"uid map", "cat /proc/self/uid_map | awk '{print $1, $3}'", "0 65536\n", true},
		{"no new privs", "grep NoNewPrivs /proc/self/status | awk '{print $2}'", "1\n", true},
		{"seccomp", "grep '^Seccomp:' /proc/self/status | awk '{print $2}'", "2\n", true},
		{"cap bounding", "grep CapBnd /proc/self/status | awk '{print $2}'", "00000000a80425fb\n", true},
		// The agent, PID 1, drops the bounding set on the thread that
		// starts every process, its main thread (confine.Starter); the
		// other sets shrink on every thread.
		{"init's capabilities", "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/1/status | awk '{print $2}' | tr '\\n' ' '", "0000000000000000 00000000a80425fb 00000000a80425fb 00000000a80425fb 0000000000000000 1 2 ", true},
		// ... every thread of it the same, but for the bounding set.
		// (Fields in /proc's order: CapInh, CapPrm, CapEff, CapAmb.)
		{"init's threads", "for f in /proc/1/task/*/status; do grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' $f | awk '{print $2}' | tr '\\n' ' '; echo; done | sort -u", "0000000000000000 00000000a80425fb 00000000a80425fb 0000000000000000 1 2 \n", true},
		// ... and is not dumpable: no process of the sandbox, its root
		// included, may trace it or read its memory or environment (its
		// other threads keep a full bounding set).
		{"init not traceable", "cat /proc/1/environ > /dev/null 2>&1 && echo read || echo denied", "denied\n", true},
		{"sys read-only", "touch /sys/x 2>&1 >/dev/null | grep -c 'Read-only'", "1\n", false},
		{"masked proc files", "for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug; do [ -e $f ] && [ -n \"$(head -c1 $f)\" ] && echo $f; done; echo done", "done\n", false},
		{"proc sys read-only", "echo 1 > /proc/sys/kernel/domainname 2>/dev/null && echo wrote || echo denied", "denied\n", false},
		{"mount denied", "mount -t tmpfs t /mnt 2>/dev/null && echo mounted || echo denied", "denied\n", false},
		{"unshare denied", "unshare -U true 2>/dev/null && echo unshared || echo denied", "denied\n", true},
		// The seccomp filter refuses AF_VSOCK sockets (EPERM; without it,
		// a socket or EAFNOSUPPORT).
		{"vsock denied", "python3 -c 'import socket, errno\ntry: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); print(\"socket\")\nexcept OSError as e: print(errno.errorcode[e.errno])'", "EPERM\n", true},
		{"usr read-only", "touch /usr/bin/x 2>/dev/null && echo wrote || echo denied", "denied\n", false},
		{"agent binary not in the root", "lsA / | grep -c atoll", "0\n", false},
		{"proc exe of init", "cat /proc/1/exe > /dev/null 2>&1; echo x >> /proc/1/exe 2>/dev/null && echo wrote || echo denied", "denied\n", false},
		{"only loopback", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort", "lo\n", false}, // eth0 too with a network (below)
		// The node made the sandbox's network namespace, with a network or
		// without: its root has no power over it (SIOCSIFFLAGS taking lo
		// down is refused), but binds low ports and pings as it could in
		// one of its own.
		{"network not the sandbox's", "python3 -c 'import socket, fcntl, struct, errno\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry: fcntl.ioctl(s, 0x8914, struct.pack(\"16sH14x\", b\"lo\", 0)); print(\"changed\")\nexcept OSError as e: print(errno.errorcode[e.errno])'", "EPERM\n", true},
		{"low port", "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 80)); print(\"bound\")'", "bound\n", false},
		{"ping socket", "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print(\"ok\")'", "ok\n", true},
		{"loopback up", "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1); c = socket.create_connection(s.getsockname()); print(\"connected\")'", "connected\n", false},
		{"dev nodes", "lsA /dev | tr '\\n' ' '", "", false}, // checked below
		// Rooted at the sandbox's own cgroup in every hierarchy, also
		// where the process was moved in after its birth (cgroup v1).
		{"cgroup namespace", "cut -d: -f3 /proc/self/cgroup | sort -u", "/\n", true},
		// ... the one of the agent's main thread, which starts every
		// process (confine.Starter): read on the host, as the sandbox
		// may not read the agent's (not dumpable).
		{"cgroup namespace of init", "readlink /proc/self/ns/cgroup", "", true}, // checked below
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if c.hostKernel && !caps.SharedKernel {
				t.Skip("a host-kernel confinement; the runtime does not claim SharedKernel")
			}
			out, errOut, _ := sb.Sh(t, ls+c.cmd)
			switch c.name {
			case "pid namespace":
				if n := strings.TrimSpace(out); n < "1" || n > "5" || len(n) != 1 {
					t.Errorf("sandbox sees %s processes: %s", n, errOut)
				}
			case "dev nodes":
				for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"} {
					if !strings.Contains(" "+out, " "+d+" ") {
						t.Errorf("/dev lacks %s: %q", d, out)
					}
				}
			case "cgroup namespace of init":
				init, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", sb.Inst.PID))
				if err != nil || strings.TrimSpace(out) != init {
					t.Errorf("a process's cgroup namespace %q (stderr %q), the agent's %q (%v): want the same", out, errOut, init, err)
				}
			case "only loopback":
				want := c.want
				if sb.Spec.Network != nil {
					want = "eth0\nlo\n"
				}
				if out != want {
					t.Errorf("got %q (stderr %q), want %q", out, errOut, want)
				}
			default:
				if out != c.want {
					t.Errorf("got %q (stderr %q), want %q", out, errOut, c.want)
				}
			}
		})
	}
	if len(hostShadow) > 0 {
		out, _, _ := sb.Sh(t, "cat /etc/shadow")
		if bytes.Equal([]byte(out), hostShadow) {
			t.Error("sandbox sees the host's /etc/shadow")
		}
	}
	// Files the sandbox's root makes are not owned by host root.
	sb.MustSh(t, "echo x > /root/owned")
	if !env.OwnDisk {
		fi, err := os.Stat(filepath.Join(sb.Spec.Rootfs.Writable, "upper/root/owned"))
		if err != nil {
			t.Fatal(err)
		}
		_ = fi // stored with unshifted ids (0), reachable only through the id-mapped mount
	}
}

func testLimits(t *testing.T, rt runtime.Runtime, env Env, caps runtime.Caps) {
	t.Run("pids", func(t *testing.T) {
		// Memory to spare: forked Pythons cost more under some kernels
		// (gVisor copies on write in larger units).
		sb := Start(t, rt, env, runtime.Limits{CPU: 0.5, MemoryBytes: 512 << 20, PIDs: 64}, 1<<30)
		out, _, _ := sb.Sh(t, pidsScript)
		var n int
		fmt.Sscan(out, &n)
		if n == 0 || n >= 100 {
			t.Errorf("started %d sleeps under a pids limit of 64", n)
		}
	})
	t.Run("memory", func(t *testing.T) {
		sb := Start(t, rt, env, runtime.Limits{CPU: 0.5, MemoryBytes: 64 << 20, PIDs: 64}, 1<<30)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := sb.Client.Exec(ctx, api.ExecRequest{Shell: "python3 -c 'b = bytearray(256 << 20); print(len(b))'"})
		if err == nil && res.ExitCode == 0 {
			t.Fatal("allocating 256 MiB under a 64 MiB limit succeeded")
		}
		if !caps.ProcessOOM {
			// The whole sandbox may have gone; it must not run on as if
			// nothing happened, over its limit.
			t.Skip("the runtime does not claim ProcessOOM: the sandbox need not survive")
		}
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		if got := sb.MustSh(t, "echo alive"); got != "alive\n" {
			t.Errorf("sandbox after OOM: %q", got)
		}
	})
}

// testUpdate checks that Update's limits hold for what starts after it.
func testUpdate(t *testing.T, rt runtime.Runtime, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 1024}, 1<<30)
	if err := rt.Update(context.Background(), sb.ID, runtime.Limits{CPU: 0.5, MemoryBytes: 512 << 20, PIDs: 64}); err != nil {
		t.Fatalf("update: %v", err)
	}
	out, _, _ := sb.Sh(t, pidsScript)
	var n int
	fmt.Sscan(out, &n)
	if n == 0 || n >= 100 {
		t.Errorf("started %d sleeps after updating the pids limit to 64", n)
	}
}

// counterScript counts in /root/count, every 50 ms, in the background.
const counterScript = `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /root/count.tmp; mv /root/count.tmp /root/count; sleep 0.05; done' >/dev/null 2>&1 &`

// count reads the counter from the sandbox's writable layer on the host, so
// that it can be read while the sandbox is paused or gone; for a sandbox
// with a disk of its own, through its agent while it runs.
func count(t testing.TB, sb *Sandbox) int {
	t.Helper()
	n, err := readCount(sb)
	if err != nil {
		t.Fatalf("reading the counter: %v", err)
	}
	return n
}

func readCount(sb *Sandbox) (int, error) {
	var b []byte
	var err error
	if sb.ownDisk {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var rc io.ReadCloser
		if rc, err = sb.Client.ReadFile(ctx, "/root/count"); err == nil {
			b, err = io.ReadAll(rc)
			rc.Close()
		}
		if err != nil && errors.Is(err, errdefs.ErrNotFound) {
			return 0, err
		}
	}
	if !sb.ownDisk || err != nil {
		// Stopped (or checkpointed): its writes are in the layer.
		b, err = os.ReadFile(filepath.Join(sb.Spec.Rootfs.Writable, "upper/root/count"))
	}
	if err != nil {
		return 0, err
	}
	var n int
	fmt.Sscan(string(b), &n)
	return n, nil
}

// waitCount waits until the counter passes n and returns it.
func waitCount(t testing.TB, sb *Sandbox, n int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := readCount(sb); err == nil && c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not pass %d", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testPause checks that Pause stops every process and Resume lets them go on.
func testPause(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	sb.MustSh(t, counterScript)
	waitCount(t, sb, 2)
	if n, err := rt.Processes(ctx, sb.ID); err != nil || n < 2 {
		t.Errorf("processes: %d, %v; want the agent and the counter at least", n, err)
	}
	if sb.ownDisk {
		testPauseByRate(t, rt, sb)
		return
	}
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	c0 := count(t, sb)
	time.Sleep(500 * time.Millisecond)
	if c := count(t, sb); c != c0 {
		t.Errorf("the counter went from %d to %d while paused", c0, c)
	}
	if !rt.Alive(sb.Inst) {
		t.Error("not alive while paused")
	}
	if err := rt.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	waitCount(t, sb, c0)
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("after resume: %q", got)
	}
}

// testPauseByRate checks Pause where the counter cannot be read while the
// sandbox is paused: over the same time, it counts less than half as far
// paused (only while the reads and the pause itself take) as running.
func testPauseByRate(t *testing.T, rt runtime.Runtime, sb *Sandbox) {
	ctx := context.Background()
	const d = 3 * time.Second
	a := count(t, sb)
	time.Sleep(d)
	b := count(t, sb)
	if err := rt.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	time.Sleep(d)
	if !rt.Alive(sb.Inst) {
		t.Error("not alive while paused")
	}
	if err := rt.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	c := count(t, sb)
	t.Logf("counted %d in %v running, %d in %v paused", b-a, d, c-b, d)
	if b-a < 4 {
		t.Fatalf("the counter hardly counts running (%d in %v)", b-a, d)
	}
	if 2*(c-b) >= b-a {
		t.Errorf("the counter went on while paused: %d in %v running, %d paused", b-a, d, c-b)
	}
	waitCount(t, sb, c)
	if got := sb.MustSh(t, "echo up"); got != "up\n" {
		t.Errorf("after resume: %q", got)
	}
}

// testReadopt checks that a new Runtime over the same host state, as after a
// node restart, finds a running sandbox alive, reaches it and stops it.
func testReadopt(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	sb.MustSh(t, "echo before > /root/f")
	rt2 := env.Reopen(t)
	if !rt2.Alive(sb.Inst) {
		t.Fatal("not alive for the new runtime")
	}
	if got := sb.MustSh(t, "cat /root/f"); got != "before\n" {
		t.Errorf("after reopening: %q", got)
	}
	if n, err := rt2.Processes(ctx, sb.ID); err != nil || n < 1 {
		t.Errorf("processes for the new runtime: %d, %v", n, err)
	}
	if err := rt2.Stop(ctx, sb.ID, sb.Inst); err != nil {
		t.Fatalf("stop by the new runtime: %v", err)
	}
	if rt2.Alive(sb.Inst) || rt.Alive(sb.Inst) {
		t.Error("alive after stop")
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after stop: %v", left)
	}
}

// testCheckpoint pauses a sandbox to disk and restores it: a process that
// was counting counts on from where it was, not from the start.
func testCheckpoint(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	sb.MustSh(t, counterScript)
	waitCount(t, sb, 3)
	img := filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if rt.Alive(sb.Inst) {
		t.Fatal("alive after checkpoint")
	}
	if left := env.Leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left after checkpoint: %v", left)
	}
	c0 := count(t, sb)
	time.Sleep(300 * time.Millisecond)
	if c := count(t, sb); c != c0 {
		t.Fatalf("the counter went from %d to %d after checkpoint", c0, c)
	}
	// Restored by a new node, if the backend can be reopened: the image
	// and the spec are all it needs.
	if env.Reopen != nil {
		if cp2, ok := env.Reopen(t).(runtime.Checkpointer); ok {
			cp = cp2
		}
	}
	inst, err := cp.Restore(ctx, sb.Spec, img)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	sb.connect(inst)
	// Nothing but the restored process counts: a fresh start would not.
	waitCount(t, sb, c0)
	if got := sb.MustSh(t, "cat /root/count >/dev/null && echo up"); got != "up\n" {
		t.Errorf("agent after restore: %q", got)
	}
}

// testDistinctFiles checks that files the sandbox makes are distinct from
// the template's and from each other: each reads back what was written to
// it, also after renames over it, and no two show the same device and inode
// number (tools take those for hard links of one file, and so does
// gVisor's sentry, which then serves one's contents for the other).
func testDistinctFiles(t *testing.T, rt runtime.Runtime, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	// One python process: hundreds of forks take minutes under emulation.
	out, errOut, code := sb.Sh(t, `python3 -c '
import os
os.makedirs("/root/many", exist_ok=True)
for i in range(400):
    with open("/root/many/t", "w") as f:
        f.write("file %d" % i)
    os.rename("/root/many/t", "/root/many/f%d" % i)
bad = sum(open("/root/many/f%d" % i).read() != "file %d" % i for i in range(400))
print("bad", bad)
root = os.stat("/").st_dev
seen, same = {}, 0
for d, dirs, files in os.walk("/"):
    dirs[:] = [x for x in dirs if os.lstat(os.path.join(d, x)).st_dev == root and os.path.join(d, x) not in ("/proc", "/sys", "/dev")]
    for f in files:
        st = os.lstat(os.path.join(d, f))
        if st.st_dev != root or not os.path.isfile(os.path.join(d, f)) or os.path.islink(os.path.join(d, f)):
            continue
        k = (st.st_dev, st.st_ino)
        if k in seen and st.st_nlink == 1:
            same += 1
        seen[k] = f
print(same)
'`)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	if out != "bad 0\n0\n" {
		t.Errorf("files of the sandbox and its template: %q (want no file reading wrong and no shared inode numbers)", out)
	}
}

// testFileMetadata checks that file metadata (package filemeta: user.e2b.*
// extended attributes, E2B's) works on the sandbox's root file system: the
// agent writes and reads it, the sandbox's own processes see and set it,
// it stays across stop and start as the file does, and watches with
// entries report it. The root is no network file system to a watch.
func testFileMetadata(t *testing.T, rt runtime.Runtime, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The directory exists before the watch: a recursive watch learns of a
	// new directory by an event, and what is written in it before the
	// watch reaches it is not seen (a slow, emulated guest loses that race).
	sb.MustSh(t, "mkdir -p /root/meta")
	ws, err := sb.Client.WatchWith(ctx, "/root", agent.WatchOptions{Recursive: true, Entries: true, NoNetworkMounts: true})
	if err != nil {
		t.Fatalf("watching /root, refusing network file systems: %v", err)
	}
	defer ws.Close()
	meta := map[string]string{"owner": "agent-7", "empty": ""}
	fi, err := sb.Client.Write(ctx, "/root/meta/f.txt", strings.NewReader("hello"), agent.WriteOptions{Metadata: meta})
	if err != nil {
		t.Fatalf("write with metadata: %v", err)
	}
	if !maps.Equal(fi.Metadata, meta) {
		t.Errorf("written: metadata %v, want %v", fi.Metadata, meta)
	}
	for {
		ev, err := ws.Next()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if ev.Type == api.WatchWrite && ev.Path == "/root/meta/f.txt" {
			if ev.Entry == nil || ev.Entry.Size != 5 || !maps.Equal(ev.Entry.Metadata, meta) {
				t.Errorf("write event's entry: %+v", ev.Entry)
			}
			break
		}
	}
	out := sb.MustSh(t, `python3 -c '
import os
p = "/root/meta/f.txt"
print(os.getxattr(p, "user.e2b.owner").decode())
os.setxattr(p, "user.e2b.set-inside", b"yes")
'`)
	if out != "agent-7\n" {
		t.Errorf("the sandbox reads user.e2b.owner as %q", out)
	}
	want := map[string]string{"owner": "agent-7", "empty": "", "set-inside": "yes"}
	if fi, err := sb.Client.StatMetadata(ctx, "/root/meta/f.txt"); err != nil || !maps.Equal(fi.Metadata, want) {
		t.Errorf("StatMetadata: %v, %v; want %v", fi.Metadata, err, want)
	}
	ws.Close()
	if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
		t.Fatalf("stop: %v", err)
	}
	sb.start(t, rt)
	list, err := sb.Client.ListMetadata(ctx, "/root/meta")
	if err != nil || len(list) != 1 || !maps.Equal(list[0].Metadata, want) {
		t.Errorf("after restart, ListMetadata: %+v, %v; want one file with %v", list, err, want)
	}
	// Overwritten without metadata, the file has none.
	if fi, err := sb.Client.Write(ctx, "/root/meta/f.txt", strings.NewReader("again"), agent.WriteOptions{}); err != nil || fi.Metadata != nil {
		t.Errorf("overwrite: %v, %v", fi.Metadata, err)
	}
	if fi, err := sb.Client.StatMetadata(ctx, "/root/meta/f.txt"); err != nil || fi.Metadata != nil {
		t.Errorf("after an overwrite without metadata: %v, %v", fi.Metadata, err)
	}
}

// testManyLayers starts a sandbox over a template of 100 layers, more than
// one page of overlay mount options names and than a microvm has disks: it
// sees every layer's file, the top layer's copy of a file all of them have,
// and not the files of the bottom layer that the top one and a middle one
// white out. The layers are subvolumes of the layer store's btrfs, as
// snapshots are, each made the same way, so their inode numbers repeat from
// one to the next; each holds a hard link, which must not be taken for
// another layer's.
func testManyLayers(t *testing.T, rt runtime.Runtime, env Env) {
	const n = 100
	var layers []string
	for i := range n {
		id := fmt.Sprintf("%s-layer-%03d", runID, i)
		w, err := env.Layers.CreateWritable(id, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Layers.RemoveWritable(id) })
		l := filepath.Join(w, "upper")
		if err := os.Mkdir(filepath.Join(l, "many"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"both", "linked", fmt.Sprint("f", i)} {
			if err := os.WriteFile(filepath.Join(l, "many", name), []byte(fmt.Sprint(i)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Link(filepath.Join(l, "many", "linked"), filepath.Join(l, "many", fmt.Sprint("link", i))); err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	// Whiteouts as the layer store writes them, 0/0 character devices: one
	// in the top layer, one in a middle one (among those a microvm's disk
	// shares).
	for top, name := range map[int]string{0: "gone", n / 2: "gone2"} {
		if err := os.WriteFile(filepath.Join(layers[n-1], "many", name), []byte("bottom"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(filepath.Join(layers[top], "many", name), syscall.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	sb := New(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 256<<20)
	sb.Spec.Rootfs.Layers = append(layers, sb.Spec.Rootfs.Layers...)
	sb.start(t, rt)
	out := sb.MustSh(t, "ls /many | wc -l; cat /many/both; echo; ls /many/gone* 2>/dev/null; cat /many/f0; echo; cat /many/f99")
	if want := fmt.Sprintf("%d\n0\n0\n99", 2*n+1+1); out != want {
		t.Errorf("a sandbox over %d layers: %q, want %q", n, out, want)
	}
	// Each layer's link reads what that layer wrote.
	out = sb.MustSh(t, fmt.Sprintf("for i in $(seq 0 %d); do echo $i $(cat /many/link$i); done | awk '$1 != $2' | head -3", n-1))
	if out != "" {
		t.Errorf("hard links that read another layer's file (layer, content): %q", out)
	}
}

// testSetuid runs a setuid-root copy of id(1), on a layer of the template,
// as the unprivileged user: only with Spec.Setuid does it run as the
// sandbox's root (how sudo works), and only then is no_new_privs unset.
func testSetuid(t *testing.T, rt runtime.Runtime, env Env) {
	layer := t.TempDir()
	if err := os.Chmod(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(layer, "suid"), 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := os.ReadFile("/usr/bin/id")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(layer, "suid", "id")
	if err := os.WriteFile(bin, id, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		setuid bool
		want   string // euid of the setuid program run by uid 1000
	}{{false, "1000\n"}, {true, "0\n"}} {
		t.Run(fmt.Sprint("setuid=", tc.setuid), func(t *testing.T) {
			sb := New(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 256<<20)
			sb.Spec.Rootfs.Layers = append([]string{layer}, sb.Spec.Rootfs.Layers...)
			sb.Spec.Setuid = tc.setuid
			if p, ok := rt.(runtime.LayerPreparer); ok {
				if err := p.PrepareLayers(context.Background(), sb.Spec.Rootfs.Layers); err != nil {
					t.Fatal(err)
				}
			}
			sb.start(t, rt)
			if out, errOut, code := sb.ShAs(t, "user", "/suid/id -u"); out != tc.want || code != 0 {
				t.Errorf("setuid root program as user: %q %q (exit %d), want %q", out, errOut, code, tc.want)
			}
			if out, _, _ := sb.ShAs(t, "user", "id -u"); out != "1000\n" {
				t.Errorf("user's own uid: %q", out)
			}
			// gVisor's /proc has no NoNewPrivs line.
			nnp := map[bool]string{false: "1\n", true: "0\n"}[tc.setuid]
			if out, _, _ := sb.ShAs(t, "user", "grep NoNewPrivs /proc/self/status | awk '{print $2}'"); out != "" && out != nnp {
				t.Errorf("no_new_privs: %q, want %q", out, nnp)
			}
		})
	}
}

// testPrepareLayers prepares a new layer over the host template's, then
// starts a sandbox over them that sees the layer's file; a layer that is not
// there is an error.
func testPrepareLayers(t *testing.T, rt runtime.Runtime, p runtime.LayerPreparer, env Env) {
	ctx := context.Background()
	layer := t.TempDir()
	if err := os.Chmod(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(layer, "prepared"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "prepared", "marker"), []byte("from the new layer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.PrepareLayers(ctx, []string{filepath.Join(layer, "missing")}); err == nil {
		t.Error("preparing a layer that is not there: no error")
	}
	sb := New(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 256<<20)
	sb.Spec.Rootfs.Layers = append([]string{layer}, sb.Spec.Rootfs.Layers...)
	if err := p.PrepareLayers(ctx, sb.Spec.Rootfs.Layers); err != nil {
		t.Fatal(err)
	}
	sb.start(t, rt)
	if out := sb.MustSh(t, "cat /prepared/marker"); out != "from the new layer" {
		t.Errorf("the prepared layer's file: %q", out)
	}
}

// pidsScript forks sleeping children until fork fails or 100 run, prints how
// many it got, and kills them.
const pidsScript = `python3 -c '
import os, signal, time
kids = []
for i in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print(len(kids))
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
'`

func testDiskQuota(t *testing.T, rt runtime.Runtime, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 64<<20)
	other := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 64<<20)
	_, errOut, code := sb.Sh(t, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1")
	if code == 0 {
		t.Fatal("writing 100 MiB under a 64 MiB quota succeeded")
	}
	out, _, _ := sb.Sh(t, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1 | grep -o 'No space left on device\\|Disk quota exceeded' | head -1")
	if strings.TrimSpace(out) == "" {
		t.Errorf("quota error is not ENOSPC/EDQUOT: %s", errOut)
	}
	sb.MustSh(t, "rm /root/big")
	if got := other.MustSh(t, "dd if=/dev/zero of=/root/f bs=1M count=32 2>/dev/null && echo ok"); got != "ok\n" {
		t.Errorf("neighbour could not write: %q", got)
	}
	if got := sb.MustSh(t, "echo small > /root/s && cat /root/s"); got != "small\n" {
		t.Errorf("after freeing space: %q", got)
	}
}

// usageScript holds 128 MiB and spins until it has had 2.5 s of CPU (not of
// the clock: on a loaded host that takes longer), in the background.
const usageScript = `nohup python3 -c "import time; b = b'x' * (128 << 20); t = time.process_time(); exec('while time.process_time() - t < 2.5: pass'); time.sleep(600)" >/dev/null 2>&1 &`

// testUsage checks that Usage counts what the sandbox's processes use: the
// CPU time of one that spins, the memory it holds and gives back.
func testUsage(t *testing.T, rt runtime.Runtime, m runtime.Meter, env Env) {
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 64}, 1<<30)
	ctx := context.Background()
	before, err := m.Usage(ctx, sb.ID)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	t.Logf("idle: %+v", before)
	sb.MustSh(t, usageScript)
	var u runtime.Usage
	deadline := time.Now().Add(60 * time.Second)
	for {
		if u, err = m.Usage(ctx, sb.ID); err != nil {
			t.Fatalf("usage: %v", err)
		}
		// 1.5 s, not 2.5: gVisor's own clock, which the spinner reads, runs
		// ahead of the host's count of its CPU on a loaded host (1.95 s
		// counted for 2.5 s spun, seen once).
		if u.CPU-before.CPU >= 3*time.Second/2 && u.MemoryBytes-before.MemoryBytes >= 100<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after spinning 2.5 s of CPU with 128 MiB: %+v (idle %+v)", u, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("busy: %+v", u)
	if u.MemoryBytes > 512<<20+64<<20 {
		t.Errorf("memory %d is above the sandbox's limit: not the sandbox's own", u.MemoryBytes)
	}
	if env.OwnDisk && (u.DiskTotalBytes <= 0 || u.DiskBytes <= 0 || u.DiskBytes > u.DiskTotalBytes) {
		t.Errorf("disk %d of %d: the runtime keeps the disk and must measure it", u.DiskBytes, u.DiskTotalBytes)
	}
	sb.MustSh(t, "pkill python3; true")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if u, err = m.Usage(ctx, sb.ID); err != nil {
			t.Fatalf("usage: %v", err)
		}
		if u.MemoryBytes < before.MemoryBytes+64<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory %d after the process ended, %d before it", u.MemoryBytes, before.MemoryBytes)
		}
	}
}
