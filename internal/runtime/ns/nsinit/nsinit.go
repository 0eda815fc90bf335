// Package nsinit sets a namespace sandbox up from the inside. The node starts
// the agent binary as "atoll-agent init", already in its own user, mount, PID,
// UTS, IPC, network (or one the node made for it) and cgroup namespaces and
// its cgroups; Setup waits for the
// node to prepare id-mapped layers, builds the sandbox's mount namespace (overlay
// root, /proc, /dev, /sys, masked paths), pivots into it and drops privileges
// (capability bounding set, no_new_privs, seccomp) on every thread of the
// process. The same process then goes on as the agent, PID 1: one program start
// per sandbox instead of two.
package nsinit

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
)

// Arg is the first argument that selects this stage in the agent binary.
const Arg = "init"

// The init stage's inherited descriptors.
const (
	ListenerFD = 3 // the agent's listening socket, kept across exec
	ControlFD  = 4 // stream socket to the node: Config in, Status out
)

// Config is what the node sends the init stage once its mounts are ready.
type Config struct {
	Rootfs   string   `json:"rootfs"`   // empty host directory to build the root on
	Lower    []string `json:"lower"`    // id-mapped lower layers, top first
	Upper    string   `json:"upper"`    // id-mapped directory holding upper/ and work/
	Binds    []Bind   `json:"binds"`    // id-mapped read-only directories
	Hostname string   `json:"hostname"` // of the UTS namespace
	AgentEnv string   `json:"agent_env"`
	User     string   `json:"user,omitempty"`    // default user of processes
	Workdir  string   `json:"workdir,omitempty"` // default working directory
	// Setuid leaves no_new_privs unset, so that setuid programs (sudo)
	// work (runtime.Spec.Setuid).
	Setuid bool `json:"setuid,omitempty"`
	// Net is set when the sandbox runs in a network namespace the node made
	// (see runtime.Network).
	Net *Net `json:"net,omitempty"`
	// NewCgroupNS is set when the process was born outside its cgroup and
	// moved in (cgroup v1, see cgroup.StartMoved): it creates its cgroup
	// namespace, rooted at its cgroup, before anything else.
	NewCgroupNS bool `json:"new_cgroupns,omitempty"`
}

// Net is what the node prepared for a sandbox with a network.
type Net struct {
	// Files is an id-mapped read-only directory holding resolv.conf and
	// hosts, mounted over /etc's.
	Files string `json:"files"`
	// Sys is a read-only sysfs the node mounted from inside the sandbox's
	// network namespace (only the namespace's owner may), mounted at /sys.
	Sys string `json:"sys"`
}

// Bind is a read-only directory mounted at Target inside the root.
type Bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// Status is the init stage's one-line answer to the node; an empty Error means
// the sandbox is set up and the agent is about to serve on its socket.
type Status struct {
	Error string `json:"error,omitempty"`
}

// Setup sets the sandbox up and returns ready, which the agent calls once it
// is about to serve: that tells the node the sandbox is up. On failure Setup
// tells the node why and exits.
func Setup() (ready func()) {
	ctl := os.NewFile(ControlFD, "control")
	if err := setup(ctl); err != nil {
		json.NewEncoder(ctl).Encode(Status{Error: err.Error()})
		os.Exit(1)
	}
	return func() {
		json.NewEncoder(ctl).Encode(Status{})
		ctl.Close()
	}
}

func setup(ctl *os.File) error {
	// Only the listener and the control socket are meant to reach the
	// sandbox; anything else the node let through must not pass to the
	// processes the agent starts.
	if err := unix.CloseRange(ControlFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("marking descriptors close-on-exec: %w", err)
	}
	// What does not depend on the configuration is done before waiting for
	// it: the node may have started this process ahead of demand.
	if err := setupLoopback(); err != nil {
		return err
	}
	filter, err := seccompFilter()
	if err != nil {
		return err
	}
	var cfg Config
	if err := json.NewDecoder(ctl).Decode(&cfg); err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	if cfg.NewCgroupNS {
		if err := newCgroupNS(); err != nil {
			return err
		}
	}
	// From here the sandbox outlives the node (see ns.Runtime.Start).
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 0, 0); e != 0 {
		return fmt.Errorf("clearing the parent-death signal: %w", e)
	}
	// The node's staging mounts have arrived by propagation; from here on
	// nothing propagates in either direction.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := buildRoot(cfg); err != nil {
		return err
	}
	if err := pivot(cfg.Rootfs); err != nil {
		return err
	}
	if err := maskPaths(); err != nil {
		return err
	}
	if err := confine(filter, cfg.Setuid); err != nil {
		return err
	}
	// The agent reads its defaults from its environment, then clears it.
	for k, v := range map[string]string{agent.EnvVar: cfg.AgentEnv, agent.UserVar: cfg.User, agent.CwdVar: cfg.Workdir} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	return nil
}

// confine drops the capabilities and loads the seccomp filter on every
// thread. TSYNC puts the filter on every thread of the process; this
// goroutine keeps to one thread while it loads.
//
// Loading a filter takes no_new_privs or CAP_SYS_ADMIN (of the sandbox's
// own user namespace). By default capabilities go first and no_new_privs is
// set on every thread, so nothing in the sandbox gains privileges by exec.
// With setuid, the filter loads while CAP_SYS_ADMIN is still held and
// no_new_privs stays unset, so that setuid programs such as sudo raise a
// process to the sandbox's root: at most the capabilities kept here, under
// the same filter, in the sandbox's user namespace.
func confine(filter seccomp.Filter, setuid bool) error {
	load := func() error {
		filter.Flag = seccomp.FilterFlagTSync
		filter.NoNewPrivs = !setuid
		goruntime.LockOSThread()
		err := seccomp.LoadFilter(filter)
		goruntime.UnlockOSThread()
		if err != nil {
			return fmt.Errorf("loading seccomp filter: %w", err)
		}
		return nil
	}
	if setuid {
		if err := load(); err != nil {
			return err
		}
		return dropCapabilities()
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("setting no_new_privs: %w", e)
	}
	return load()
}

// newCgroupNS puts every thread of the process in one new cgroup namespace,
// rooted at the process's cgroup: one thread makes it, the others join it,
// so that whichever thread later starts a process passes on the same one.
func newCgroupNS() error {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("creating the cgroup namespace: %w", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the cgroup namespace: %w", err)
	}
	defer unix.Close(fd)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWCGROUP, 0); e != 0 {
		return fmt.Errorf("joining the cgroup namespace: %w", e)
	}
	return nil
}

func buildRoot(cfg Config) error {
	root := cfg.Rootfs
	// Xino: with each lower layer on a file system of its own (package
	// lowers), every file shows an inode number of its own.
	if err := overlay.Mount(root, overlay.Options{
		Lower: cfg.Lower, Upper: filepath.Join(cfg.Upper, "upper"), Work: filepath.Join(cfg.Upper, "work"),
		UserXattr: true, Xino: true,
	}); err != nil {
		return fmt.Errorf("mounting overlay root: %w", err)
	}
	for _, b := range cfg.Binds {
		dst, err := mountpoint(root, b.Target, true)
		if err != nil {
			return err
		}
		if err := unix.Mount(b.Source, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", b.Target, err)
		}
	}
	type mnt struct {
		target, fstype, data string
		flags                uintptr
	}
	const common = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	mounts := []mnt{
		{"/proc", "proc", "", common},
		{"/dev", "tmpfs", "mode=755,size=65536k", unix.MS_NOSUID | unix.MS_STRICTATIME},
		{"/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"/dev/shm", "tmpfs", "mode=1777,size=65536k", common},
		{"/dev/mqueue", "mqueue", "", common},
	}
	if cfg.Net == nil {
		mounts = append(mounts, mnt{"/sys", "sysfs", "", common | unix.MS_RDONLY})
	}
	for _, m := range mounts {
		dst, err := mountpoint(root, m.target, true)
		if err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	if cfg.Net != nil {
		if err := mountNet(root, cfg.Net); err != nil {
			return err
		}
	}
	// Device nodes cannot be made in a user namespace; bind the host's.
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		dst, err := mountpoint(root, "/dev/"+d, false)
		if err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	if err := bootID(root); err != nil {
		return err
	}
	links := map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, "dev", name)); err != nil {
			return fmt.Errorf("linking /dev/%s: %w", name, err)
		}
	}
	return nil
}

// bootID gives the sandbox a boot ID of its own, new at each start, over
// the host kernel's /proc/sys/kernel/random/boot_id: programs (and E2B's
// SDK tests) tell a reboot from a resume by it, and a sandbox whose
// processes were started afresh has rebooted as far as they can see. The
// file is made on the sandbox's /dev tmpfs, bound read-only over the
// kernel's, and unlinked: the mount holds it.
func bootID(root string) error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	b[6] = b[6]&0x0f | 0x40 // a version 4 UUID, as the kernel makes
	b[8] = b[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	src := filepath.Join(root, "dev", ".boot_id")
	if err := os.WriteFile(src, []byte(id), 0o444); err != nil {
		return fmt.Errorf("writing the boot ID: %w", err)
	}
	defer os.Remove(src)
	dst := filepath.Join(root, "proc/sys/kernel/random/boot_id")
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the boot ID: %w", err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("read-only boot ID: %w", err)
	}
	return nil
}

// mountNet mounts what the node prepared for a sandbox with a network: its
// sysfs, and its resolv.conf and hosts over the image's.
func mountNet(root string, n *Net) error {
	dst, err := mountpoint(root, "/sys", true)
	if err != nil {
		return err
	}
	if err := unix.Mount(n.Sys, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding /sys: %w", err)
	}
	for _, name := range []string{"resolv.conf", "hosts"} {
		target := "/etc/" + name
		// An image's symlink here (to a systemd-resolved stub, say) is
		// replaced by a file to mount on: the sandbox's resolver is
		// atoll's.
		if fi, err := os.Lstat(filepath.Join(root, target)); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if err := os.Remove(filepath.Join(root, target)); err != nil {
				return fmt.Errorf("replacing the symlink %s: %w", target, err)
			}
		}
		dst, err := mountpoint(root, target, false)
		if err != nil {
			return err
		}
		// Read-only as the staged directory is, which the sandbox cannot
		// change (its flags are locked).
		if err := unix.Mount(filepath.Join(n.Files, name), dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s: %w", target, err)
		}
	}
	return nil
}

// mountpoint returns root+target after making sure it exists as a directory or
// file. Template layers normally provide mountpoints; creating one here writes
// it into the sandbox's writable layer. Paths come from the node, not from the
// sandbox, and the root is not yet visible to any sandbox process, so plain
// path operations are safe here.
func mountpoint(root, target string, dir bool) (string, error) {
	p := filepath.Join(root, target)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() != dir || fi.Mode()&os.ModeSymlink != 0 {
			return "", fmt.Errorf("mountpoint %s has the wrong type", target)
		}
		return p, nil
	}
	if dir {
		return p, os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	return p, f.Close()
}

func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir root: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; unmounting
	// "." then removes it, with no directory needed for it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching old root: %w", err)
	}
	return unix.Chdir("/")
}

// maskedPaths and readonlyPaths follow runc's defaults for Docker.
var maskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/proc/interrupts", "/sys/firmware", "/sys/devices/virtual/powercap",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

func maskPaths() error {
	for _, p := range maskedPaths {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("masking %s: %w", p, err)
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("masking %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", p, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount(p, p, "", flags, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
	}
	return nil
}

// setupLoopback brings up lo in the new network namespace. In a namespace
// the node made, lo is up already and the sandbox could not change it.
func setupLoopback() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// keptCapabilities is Docker's default capability set.
var keptCapabilities = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true,
	unix.CAP_FSETID: true, unix.CAP_KILL: true, unix.CAP_SETGID: true,
	unix.CAP_SETUID: true, unix.CAP_SETPCAP: true, unix.CAP_NET_BIND_SERVICE: true,
	unix.CAP_NET_RAW: true, unix.CAP_SYS_CHROOT: true, unix.CAP_MKNOD: true,
	unix.CAP_AUDIT_WRITE: true, unix.CAP_SETFCAP: true,
}

// dropCapabilities shrinks every thread's bounding, permitted, effective and
// inheritable sets to keptCapabilities and clears the ambient set: the agent
// and every process it starts hold at most those, and none can regain the
// others. Capabilities are per thread, hence AllThreadsSyscall (which needs a
// binary without cgo, as the agent is).
func dropCapabilities() error {
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if keptCapabilities[c] {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("dropping capability %d: %w", c, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clearing ambient capabilities: %w", e)
	}
	var mask [2]uint32
	for c := range keptCapabilities {
		mask[c/32] |= 1 << (c % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: mask[0], Permitted: mask[0]},
		{Effective: mask[1], Permitted: mask[1]},
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// MaskPaths and DropCapabilities confine the vm runtime's guest the way an
// ns sandbox is confined: masked and read-only /proc and /sys paths, and
// Docker's default capabilities for everything its init starts.
func MaskPaths() error { return maskPaths() }

// DropCapabilities: see MaskPaths.
func DropCapabilities() error { return dropCapabilities() }

// SetupLoopback brings lo up, for the vm runtime's guest as for a sandbox
// with a network namespace of its own.
func SetupLoopback() error { return setupLoopback() }
