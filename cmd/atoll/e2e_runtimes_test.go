package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func TestServeEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	if fi, err := os.Stat(filepath.Join(data, "api-key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("api-key file: %v %v", fi.Mode(), err)
	}

	// The CLI on the server's host finds URL and key in the data directory.
	local := exec.Command(d.bin, "--data", data, "ls", "--json")
	local.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := local.CombinedOutput(); err != nil || !strings.Contains(string(out), `"sandboxes"`) {
		t.Errorf("atoll --data %s ls without ATOLL_URL/ATOLL_API_KEY: %v: %s", data, err, out)
	}

	out, code := d.cli("create", "--label", "suite=e2e", "--env", "GREETING=hello")
	if code != 0 {
		t.Fatalf("atoll create: %s", out)
	}
	id := strings.TrimSpace(out)
	if out, code := d.cli("exec", id, "--", "python3", "-c", "print(1)"); code != 0 || out != "1\n" {
		t.Fatalf("python3: %q %d", out, code)
	}
	if out, code := d.cli("exec", id, "--", "sh", "-c", "echo $GREETING; exit 7"); code != 7 || out != "hello\n" {
		t.Errorf("exit code passthrough: %q %d", out, code)
	}
	if out, code := d.cli("exec", id, "--", "sh", "-c", "echo kept > /root/state && mkdir -p /home/user/proj && echo x > /home/user/proj/f"); code != 0 {
		t.Fatal(out)
	}
	c := d.client()
	ctx := context.Background()

	// Stop and start: files exactly as left.
	if out, code := d.cli("stop", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec on stopped sandbox: %v, want conflict", err)
	}
	if _, err := c.StopSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("double stop: %v", err)
	}
	if out, code := d.cli("start", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.StartSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("double start: %v", err)
	}
	if out, _ := sh(t, c, id, "cat /root/state /home/user/proj/f"); out != "kept\nx\n" {
		t.Errorf("after stop/start: %q", out)
	}

	// A background process survives a daemon crash; the sandbox is re-adopted.
	p, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: "while true; do date +%s%N >> /root/ticks; sleep 0.05; done", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	d.kill()
	time.Sleep(300 * time.Millisecond)
	d.start()
	c = d.client()
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.State != api.StateRunning {
		t.Fatalf("after daemon restart: %+v %v", sb, err)
	}
	count := func() int {
		out, _ := sh(t, c, id, "wc -l < /root/ticks")
		var n int
		fmt.Sscan(out, &n)
		return n
	}
	before := count()
	time.Sleep(500 * time.Millisecond)
	if after := count(); after <= before {
		t.Errorf("background process stopped across the daemon restart: %d -> %d ticks", before, after)
	}
	if err := c.Signal(ctx, id, p.PID, "KILL"); err != nil {
		t.Errorf("kill background process: %v", err)
	}

	// cp both ways, files and directories.
	src := filepath.Join(testenv.Dir(t), "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("A"), 0o644)
	if out, code := d.cli("cp", src, id+":/root/up"); code != 0 {
		t.Fatal(out)
	}
	if out, _ := sh(t, c, id, "cat /root/up/sub/a.txt"); out != "A" {
		t.Errorf("uploaded dir: %q", out)
	}
	dst := filepath.Join(testenv.Dir(t), "down")
	if out, code := d.cli("cp", id+":/root/up", dst); code != 0 {
		t.Fatal(out)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "a.txt")); string(b) != "A" {
		t.Errorf("downloaded dir: %q", b)
	}

	// rm: everything released.
	if out, code := d.cli("rm", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.GetSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("get after rm: %v", err)
	}
	if err := c.DeleteSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("double rm: %v", err)
	}
	if left := leftovers(data, id); len(left) > 0 {
		t.Errorf("left after rm: %v", left)
	}
}

// cliSandbox creates a sandbox of runtime through the CLI, checks that it
// runs under that runtime and that python3 runs in it, and returns its ID.
func cliSandbox(t *testing.T, d *daemon, runtime string) string {
	t.Helper()
	out, code := d.cli("create", "--runtime", runtime, "--memory", "512")
	if code != 0 {
		t.Fatalf("atoll create --runtime %s: %s\n%s", runtime, out, d.out.String())
	}
	id := strings.TrimSpace(out)
	c := d.client()
	sb, err := c.GetSandbox(context.Background(), id)
	if err != nil || sb.Runtime != runtime {
		t.Fatalf("sandbox: %+v, %v", sb, err)
	}
	if out, code := sh(t, c, id, "python3 -c 'print(6*7)'"); code != 0 || out != "42\n" {
		t.Fatalf("python3: %q %d", out, code)
	}
	return id
}

// TestGvisorEndToEnd runs a sandbox under runsc through the API: python3,
// a file kept across stop and start, a daemon restart that re-adopts it, and
// nothing left after delete.
func TestGvisorEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "runsc")
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	id := cliSandbox(t, d, "gvisor")
	c := d.client()
	// The kernel answering is gVisor's, not the host's.
	if out, _ := sh(t, c, id, "dmesg | head -1"); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg is not gVisor's: %q", out)
	}
	checkKeptAndReadopted(t, d, id)
	if left := leftovers(data, id); len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
}

// TestVMEndToEnd runs a sandbox in a QEMU microVM through the API and the
// CLI: its own kernel, a file kept across stop and start, a daemon restart
// that re-adopts it, and nothing left after delete.
func TestVMEndToEnd(t *testing.T) {
	requireVM(t)
	data := filepath.Join(testenv.Dir(t), "data")
	linkVMCache(t, data)
	d := startDaemon(t, data)
	id := cliSandbox(t, d, "vm")
	c := d.client()
	// The kernel answering is the guest's, not the host's.
	var uts unix.Utsname
	unix.Uname(&uts)
	hostRelease := unix.ByteSliceToString(uts.Release[:])
	if out, _ := sh(t, c, id, "uname -r"); strings.TrimSpace(out) == hostRelease || out == "" {
		t.Errorf("uname -r in the vm: %q, the host's is %q", out, hostRelease)
	}
	checkKeptAndReadopted(t, d, id)
	left := leftovers(data, id)
	if _, err := os.Stat(filepath.Join(data, "run-vm", "sandboxes", id)); err == nil {
		left = append(left, "run-vm/sandboxes/"+id)
	}
	if b, err := exec.Command("pgrep", "-f", "sandboxes/"+id+"/").Output(); err == nil && len(b) > 0 {
		left = append(left, "processes: "+strings.TrimSpace(string(b)))
	}
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
}

func TestServeNeedsRoot(t *testing.T) {
	testenv.RequireRoot(t)
	cmd := exec.Command(atollBinary(t), "serve", "--data", testenv.Dir(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs root") {
		t.Errorf("atoll serve as nobody: %v: %s", err, out)
	}
}

// checkKeptAndReadopted checks that sandbox id keeps its files across stop
// and start, and that a crash of the daemon leaves it running for the next
// one to re-adopt; then it deletes it.
func checkKeptAndReadopted(t *testing.T, d *daemon, id string) {
	t.Helper()
	c := d.client()
	ctx := context.Background()
	if out, code := sh(t, c, id, "echo kept > /root/state && mkdir -p /home/user/p && echo x > /home/user/p/f"); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.StopSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, id, "cat /root/state /home/user/p/f"); out != "kept\nx\n" {
		t.Errorf("after stop/start: %q", out)
	}

	// A crash of the daemon leaves the sandbox running; the next one
	// re-adopts it.
	d.kill()
	d.start()
	c = d.client()
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
		t.Fatalf("after daemon restart: %+v, %v", sb, err)
	}
	if out, _ := sh(t, c, id, "cat /root/state"); out != "kept\n" {
		t.Errorf("after daemon restart: %q", out)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestSandboxFsync: a sandbox's root overlay is volatile unless the
// server runs with --sandbox-fsync (docs/lifecycle.md, "What fsync in a
// sandbox means").
func TestSandboxFsync(t *testing.T) {
	ctx := context.Background()
	for _, fsync := range []bool{false, true} {
		// Short names: the gvisor agent's socket path holds the test's
		// directory, and a unix socket's path at most 107 bytes.
		name := "volatile"
		if fsync {
			name = "fsync"
		}
		t.Run(name, func(t *testing.T) {
			args := []string{"--warm-pool", "0", "--prestart", "0"}
			if fsync {
				args = append(args, "--sandbox-fsync")
			}
			d, _, c := startRooted(t, args...)
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "grep ' / / ' /proc/self/mountinfo"}, &out, io.Discard); err != nil || code != 0 {
				t.Fatalf("exec: %v (exit %d)", err, code)
			}
			if volatile := testenv.MountedVolatile(out.String()); volatile == fsync {
				t.Errorf("the sandbox's root is mounted %s", out.String())
			}
			// gvisor's root overlay is the node's own mount.
			g, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
			if err != nil {
				t.Fatalf("%v; the server's log:\n%s", err, d.out.String())
			}
			found := false
			for _, m := range runtimetest.Mounts(g.ID) {
				if strings.Contains(m, " - overlay ") {
					found = true
					if volatile := testenv.MountedVolatile(m); volatile == fsync {
						t.Errorf("the gvisor sandbox's root is %s", m)
					}
				}
			}
			if !found {
				t.Errorf("no overlay of gvisor sandbox %s on the host", g.ID)
			}
		})
	}
}
