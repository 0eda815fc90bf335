package runtimetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// escapePrelude gives each escape script a raw syscall helper: sc(nr, ...)
// returns (result, errno).
const escapePrelude = `
import ctypes, errno, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# argv: the test's host pid, and 1 if the sandbox shares the host's kernel
# (ns), 0 if it has a kernel of its own (gVisor, a VM): then what it sees of
# "the kernel" is its own, and only refusals that protect the host count.
host_pid, shared_kernel = int(sys.argv[1]), sys.argv[2] == "1"
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
def denied(name, r):
    if r[0] != -1:
        print(name, "succeeded")
    elif r[1] not in (errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EINVAL, errno.EFAULT, errno.ESRCH, errno.EBADF, errno.ENOENT, errno.EROFS, errno.ENODEV, errno.EOPNOTSUPP):
        print(name, "failed oddly:", errno.errorcode.get(r[1], r[1]))
`

// escapes are attempts, from inside a sandbox, modelled on container escapes
// and host-kernel attack surface. Each script prints nothing when the
// attempt fails as it should, and what went wrong otherwise.
var escapes = []struct{ name, script string }{
	// CVE-2019-5736: runc's binary overwritten through /proc/self/exe of a
	// process it had just started. Here PID 1 is the agent, whose binary is
	// a host file.
	{"proc exe overwrite", `
for p in ("/proc/1/exe", "/proc/self/exe"):
    for mode in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
        try:
            fd = os.open(p, mode)
            os.close(fd)
            print("opened", p, "for writing")
        except OSError:
            pass
`},
	// CVE-2024-21626: a host directory descriptor leaked into the sandbox
	// lets a process chdir out of its root through /proc/self/fd/N.
	{"leaked directory fds", `
for pid in ("self", "1"):
    d = "/proc/%s/fd" % pid
    for n in os.listdir(d):
        p = d + "/" + n
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and os.path.realpath(p) != os.path.realpath(d):
            print("directory fd", p, "->", os.readlink(p))
def link(p):
    try:
        return os.readlink(p)
    except OSError:
        return None
fds = {n: link("/proc/self/fd/" + n) for n in os.listdir("/proc/self/fd")}
extra = {n: l for n, l in fds.items() if n not in ("0", "1", "2") and l is not None}
if extra:
    print("unexpected fds:", extra)
`},
	// The cgroup v1 release_agent escape (CVE-2022-0492) needs a writable
	// cgroupfs: none is mounted writable, and mounting one is refused.
	{"cgroup release_agent", `
import glob
for p in glob.glob("/sys/fs/cgroup/**/release_agent", recursive=True) + ["/sys/fs/cgroup/release_agent"]:
    try:
        with open(p, "w") as f:
            f.write("/x")
        print("wrote", p)
    except OSError:
        pass
os.makedirs("/tmp/cg", exist_ok=True)
r = os.system("mount -t cgroup -o rdma cgroup /tmp/cg 2>/dev/null")
if r == 0:
    print("mounted a cgroup v1 hierarchy")
`},
	{"kernel knobs", `
for p, v in (("/proc/sys/kernel/core_pattern", "|/x"), ("/proc/sysrq-trigger", "h"), ("/proc/sys/vm/drop_caches", "3"),
             ("/sys/kernel/uevent_helper", "/x"), ("/proc/sys/kernel/modprobe", "/x")):
    try:
        with open(p, "w") as f:
            f.write(v)
        print("wrote", p)
    except OSError:
        pass
`},
	{"devices", `
for p in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/loop0", "/dev/kvm", "/dev/fuse"):
    if os.path.exists(p) and (shared_kernel or p != "/dev/fuse"):
        print("present:", p)
try:
    os.mknod("/tmp/disk", 0o600 | stat.S_IFBLK, os.makedev(8, 0))
    try:
        open("/tmp/disk", "rb").read(1)
        print("read a block device it made")
    except OSError:
        pass
except OSError:
    pass
`},
	// System calls that reach kernel attack surface or host state: each is
	// refused by seccomp or by missing capabilities (x86_64 numbers).
	{"syscalls", `
for name, nr, args in (
    ("bpf", 321, (0, 0, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("kexec_load", 246, (0, 0, 0, 0)), ("kexec_file_load", 320, (-1, -1, 0, 0, 0)),
    ("init_module", 175, (0, 0, 0)), ("finit_module", 313, (-1, 0, 0)), ("delete_module", 176, (0, 0)),
    ("add_key", 248, (0, 0, 0, 0, 0)), ("request_key", 249, (0, 0, 0, 0)), ("keyctl", 250, (0, 0, 0, 0, 0)),
    ("open_by_handle_at", 304, (-100, 0, 0)), ("name_to_handle_at", 303, (-100, 0, 0, 0, 0)),
    ("iopl", 172, (3,)), ("ioperm", 173, (0, 1024, 1)), ("reboot", 169, (0xfee1dead, 672274793, 0x1234567, 0)),
    ("swapon", 167, (0, 0)), ("acct", 163, (0,)),
    ("settimeofday", 164, (0, 0)), ("clock_settime", 227, (0, 0)), ("quotactl", 179, (0, 0, 0, 0)),
    ("lookup_dcookie", 212, (0, 0, 0)), ("userfaultfd", 323, (0,)), ("vhangup", 153, ()),
    ("fsopen", 430, (0, 0)), ("open_tree", 428, (-100, 0, 0)), ("pivot_root", 155, (0, 0)),
):
    denied(name, sc(nr, *args))
if shared_kernel:
    denied("syslog", sc(103, 3, 0, 0))
`},
	// Host processes are out of sight: another PID namespace.
	{"host processes", `
if not shared_kernel:
    sys.exit(0)
ns = os.readlink("/proc/self/ns/pid")
for pid in (host_pid, 2):
    try:
        os.kill(pid, 0)
        if os.readlink("/proc/%d/ns/pid" % pid) != ns:
            print("can signal host pid", pid)
    except OSError:
        pass
denied("ptrace attach", sc(101, 16, host_pid, 0, 0))
`},
	// Namespace files of the host are not reachable: setns to the sandbox's
	// own namespaces needs CAP_SYS_ADMIN, which is gone.
	{"setns", `
if not shared_kernel:
    sys.exit(0)
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
denied("setns mnt", sc(308, fd, 0))
`},
}

// testEscapes runs the escape attempts in a sandbox, then checks the host
// side: the agent binary is unchanged.
func testEscapes(t *testing.T, rt runtime.Runtime, env Env) {
	before := fileSum(t, env.AgentPath)
	sb := Start(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 512 << 20, PIDs: 256}, 1<<30)
	for _, e := range escapes {
		t.Run(strings.ReplaceAll(e.name, " ", "_"), func(t *testing.T) {
			// The script is written first and run without a shell, so that
			// the only descriptors it has are the ones the agent gave it.
			sb.MustSh(t, "cat > /tmp/escape.py <<'EOF'\n"+escapePrelude+e.script+"\nEOF")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			shared := "0"
			if runtime.CapsOf(rt).SharedKernel {
				shared = "1"
			}
			res, err := sb.Client.Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "/tmp/escape.py", strconv.Itoa(os.Getpid()), shared}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 || len(res.Stdout) > 0 {
				t.Errorf("exit %d:\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
	if after := fileSum(t, env.AgentPath); !bytes.Equal(before, after) {
		t.Errorf("the agent binary on the host changed")
	}
}

func fileSum(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return s[:]
}
