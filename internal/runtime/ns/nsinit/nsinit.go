// Package nsinit sets a namespace sandbox up from the inside. The node starts
// the agent binary as "atoll-agent init" (launch.Init), already in its own user, mount, PID,
// UTS, IPC, network (or one the node made for it) and cgroup namespaces and
// its cgroups; Setup waits for the
// node to prepare id-mapped layers, builds the sandbox's mount namespace (overlay
// root, /proc, /dev, /sys, masked paths), pivots into it and drops privileges
// (capability bounding set, no_new_privs, seccomp): the bounding set on the
// one thread that starts every process (confine.Starter), the rest on every
// thread of the process. The same process then goes on as the agent, PID 1: one program start
// per sandbox instead of two.
package nsinit

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/runtime/confine"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
)

// Config is what the node sends the init stage once its mounts are ready,
// as a frame of WriteConfig's.
type Config struct {
	Rootfs   string   // empty host directory to build the root on
	Lower    []string // id-mapped lower layers, top first
	Upper    string   // id-mapped directory holding upper/ and work/
	Binds    []Bind   // id-mapped read-only directories
	Hostname string   // of the UTS namespace
	AgentEnv string
	User     string // default user of processes
	Workdir  string // default working directory
	// Procs is the agent's GOMAXPROCS for the sandbox's limits (0: Go's
	// default). The node started the process with the value for the
	// limits it had then (a prepared process may get others).
	Procs int
	// Volatile mounts the root overlay volatile (overlay.Options.Volatile):
	// ns.Config.SandboxFsync unset.
	Volatile bool
	// Setuid leaves no_new_privs unset, so that setuid programs (sudo)
	// work (runtime.Spec.Setuid).
	Setuid bool
	// Net is set when the sandbox runs in a network the node made (see
	// runtime.Network).
	Net *Net
	// Sys is a read-only sysfs the node mounted from inside the sandbox's
	// network namespace, which the node made (only the namespace's owner
	// may mount one), bound at /sys; empty, the sandbox owns its network
	// namespace and mounts its own.
	Sys string
	// NewCgroupNS is set when the process was born outside its cgroup and
	// moved in (cgroup v1, see cgroup.BirthDir): it creates its cgroup
	// namespace, rooted at its cgroup, before anything else.
	NewCgroupNS bool
	// Seccomp is the seccomp filter every process of the sandbox runs
	// under, a BPF program the node assembled (struct sock_filter's, in
	// the machine's byte order). The init stage refuses to go on without.
	Seccomp []byte
}

// Net is what the node prepared for a sandbox with a network.
type Net struct {
	// Files is an id-mapped read-only directory holding resolv.conf and
	// hosts, mounted over /etc's.
	Files string
}

// Bind is a read-only directory mounted at Target inside the root.
type Bind struct {
	Source string
	Target string
}

// Status is the init stage's one-line answer to the node; an empty Error means
// the sandbox is set up and the agent is about to serve on its socket.
type Status struct {
	Error string `json:"error,omitempty"`
}

// Main runs the init stage, then agentMain as the sandbox's agent with
// ready, which the agent calls once it is about to serve (that tells the node
// the sandbox is up), and startOn, on which the agent must start every
// process: it runs its function on the one thread whose capability bounding
// set was dropped, the calling goroutine's (confine.Starter). The caller
// keeps to the main thread (agentbin locks it there from its init), so that
// the bounding set of PID 1 as /proc shows it is the dropped one too. On
// failure the init stage tells the node why and exits.
func Main(agentMain func(ready func(), startOn func(func()))) {
	starter := confine.NewStarter()
	go func() {
		defer starter.Stop()
		ctl := os.NewFile(launch.ControlFD, "control")
		if err := setup(ctl, starter); err != nil {
			json.NewEncoder(ctl).Encode(Status{Error: err.Error()})
			os.Exit(1)
		}
		agentMain(func() {
			// Status{} as JSON, written as such: encoding/json's first
			// use in this process would cost more than the rest.
			ctl.Write([]byte("{}\n"))
			ctl.Close()
		}, starter.Do)
	}()
	starter.Serve()
}

func setup(ctl *os.File, starter *confine.Starter) error {
	// Only the listener and the control socket are meant to reach the
	// sandbox; anything else the node let through must not pass to the
	// processes the agent starts.
	if err := unix.CloseRange(launch.ControlFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("marking descriptors close-on-exec: %w", err)
	}
	// What does not depend on the configuration is done before waiting for
	// it: the node may have started this process ahead of demand.
	if err := confine.Loopback(); err != nil {
		return err
	}
	cfg, err := ReadConfig(ctl)
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	if cfg.Procs > 0 && cfg.Procs != goruntime.GOMAXPROCS(0) {
		goruntime.GOMAXPROCS(cfg.Procs)
	} else if cfg.Procs == 0 && os.Getenv("GOMAXPROCS") != "" {
		goruntime.SetDefaultGOMAXPROCS()
	}
	if cfg.NewCgroupNS {
		if err := newCgroupNS(starter); err != nil {
			return err
		}
	}
	// From here the sandbox outlives the node (see ns.Runtime.Start).
	starter.Do(func() { err = clearParentDeathSignal() })
	if err != nil {
		return err
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
	if err := confine.MaskPaths(); err != nil {
		return err
	}
	if err := dropPrivileges(starter, cfg.Seccomp, cfg.Setuid); err != nil {
		return err
	}
	// The agent reads its defaults from its environment, then clears it.
	for k, v := range map[string]string{launch.EnvVar: cfg.AgentEnv, launch.UserVar: cfg.User, launch.CwdVar: cfg.Workdir} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	return nil
}

// dropPrivileges drops the capabilities (the bounding set on the starter's
// thread, which starts every process; the other sets on every thread) and
// loads the seccomp filter on every thread: TSYNC puts the filter on every
// thread of the process, and with it the loading thread's no_new_privs.
// Everything runs on the starter's thread, so that it holds no_new_privs
// itself, not only by that sync.
//
// Loading a filter takes no_new_privs or CAP_SYS_ADMIN (of the sandbox's
// own user namespace). By default capabilities go first and no_new_privs is
// set, so nothing in the sandbox gains privileges by exec. With setuid, the
// filter loads while CAP_SYS_ADMIN is still held and no_new_privs stays
// unset, so that setuid programs such as sudo raise a process to the
// sandbox's root: at most the capabilities kept here, under the same filter,
// in the sandbox's user namespace.
//
// Two stops of the Go world in all (the capset and the filter's sync),
// where dropping each capability on every thread took ~30.
func dropPrivileges(starter *confine.Starter, filter []byte, setuid bool) error {
	load := func() (err error) {
		starter.Do(func() { err = loadSeccomp(filter, !setuid) })
		return err
	}
	if setuid {
		if err := load(); err != nil {
			return err
		}
		return starter.DropCapabilities()
	}
	if err := starter.DropCapabilities(); err != nil {
		return err
	}
	return load()
}

// loadSeccomp sets no_new_privs if asked and loads the BPF program prog on
// every thread of the process (TSYNC, which passes the caller's
// no_new_privs on too).
func loadSeccomp(prog []byte, noNewPrivs bool) error {
	if len(prog) == 0 || len(prog)%8 != 0 || len(prog)/8 > 0xffff {
		return fmt.Errorf("no valid seccomp filter (%d bytes)", len(prog))
	}
	if noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	insts := make([]unix.SockFilter, len(prog)/8)
	for i := range insts {
		b := prog[8*i:]
		insts[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
	}
	fprog := unix.SockFprog{Len: uint16(len(insts)), Filter: &insts[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	goruntime.KeepAlive(insts)
	if e != 0 {
		return fmt.Errorf("loading seccomp filter: %w", e)
	}
	if r != 0 { // TSYNC: the thread that could not take the filter
		return fmt.Errorf("loading seccomp filter: thread %d could not be synchronized", r)
	}
	return nil
}

// clearParentDeathSignal clears the signal the node asked for when this
// process's parent dies. It is set on the main thread alone (a thread made
// by clone starts without one), so where this goroutine runs there a plain
// prctl does; elsewhere it takes a stop of the Go world. It runs on a
// locked thread (the starter's).
func clearParentDeathSignal() error {
	if unix.Gettid() == unix.Getpid() {
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0); err != nil {
			return fmt.Errorf("clearing the parent-death signal: %w", err)
		}
		return nil
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 0, 0); e != 0 {
		return fmt.Errorf("clearing the parent-death signal: %w", e)
	}
	return nil
}

// newCgroupNS puts the starter's thread, which starts every process of the
// sandbox, in a new cgroup namespace rooted at the process's cgroup: what it
// starts inherits it. The agent's other threads keep the node's: none of them
// starts a process, mounts a cgroup file system or reads its cgroups, and
// joining them too took a stop of the Go world per sandbox.
func newCgroupNS(starter *confine.Starter) (err error) {
	starter.Do(func() {
		if e := unix.Unshare(unix.CLONE_NEWCGROUP); e != nil {
			err = fmt.Errorf("creating the cgroup namespace: %w", e)
		}
	})
	return err
}

func buildRoot(cfg Config) error {
	root := cfg.Rootfs
	// Xino: with each lower layer on a file system of its own (package
	// lowers), every file shows an inode number of its own.
	if err := overlay.Mount(root, overlay.Options{
		Lower: cfg.Lower, Upper: filepath.Join(cfg.Upper, "upper"), Work: filepath.Join(cfg.Upper, "work"),
		UserXattr: true, Xino: true, Volatile: cfg.Volatile,
	}); err != nil {
		return fmt.Errorf("mounting overlay root: %w", err)
	}
	for _, b := range cfg.Binds {
		dst, err := confine.Mountpoint(root, b.Target, true)
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
	if cfg.Sys == "" {
		mounts = append(mounts, mnt{"/sys", "sysfs", "", common | unix.MS_RDONLY})
	}
	for _, m := range mounts {
		mountpoint := confine.Mountpoint
		if strings.HasPrefix(m.target, "/dev/") {
			mountpoint = devEntry
		}
		dst, err := mountpoint(root, m.target, true)
		if err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	if cfg.Sys != "" {
		dst, err := confine.Mountpoint(root, "/sys", true)
		if err != nil {
			return err
		}
		if err := unix.Mount(cfg.Sys, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /sys: %w", err)
		}
	}
	if cfg.Net != nil {
		if err := mountNet(root, cfg.Net); err != nil {
			return err
		}
	}
	// Device nodes cannot be made in a user namespace; bind the host's.
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		dst, err := devEntry(root, "/dev/"+d, false)
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

// devEntry makes the mount point target, a directory (dir) or a file, in
// the /dev tmpfs that buildRoot mounted under root, where nothing is yet:
// one system call, where confine.Mountpoint first looks for what the
// image has.
func devEntry(root, target string, dir bool) (string, error) {
	p := filepath.Join(root, target)
	var err error
	if dir {
		err = unix.Mkdir(p, 0o755)
	} else {
		err = unix.Mknod(p, unix.S_IFREG|0o644, 0)
	}
	if err != nil {
		return "", fmt.Errorf("making mount point %s: %w", target, err)
	}
	return p, nil
}

// bootID gives the sandbox a boot ID of its own, new at each start, over
// the host kernel's /proc/sys/kernel/random/boot_id: programs (and E2B's
// SDK tests) tell a reboot from a resume by it, and a sandbox whose
// processes were started afresh has rebooted as far as they can see. The
// file is made on the sandbox's /dev tmpfs, bound read-only over the
// kernel's, and unlinked: the mount holds it.
func bootID(root string) error {
	// getrandom(2) itself: crypto/rand's first read sets up its generator,
	// a cost each sandbox's start would pay for these 16 bytes alone.
	var b [16]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		return fmt.Errorf("reading random bytes: %w", err)
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
		dst, err := confine.Mountpoint(root, target, false)
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
