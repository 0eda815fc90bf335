package spawn

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The helper starts a sandbox's process with clone3(CLONE_VM) and a child
// that runs a fixed list of system calls, rather than with os/exec.
//
// Why: Go forks, not vforks, a child that gets a new user namespace (its
// parent must write the child's ID maps before the child goes on, and a
// vfork's parent waits for the exec). A fork copies the helper's page
// tables, marks its memory copy-on-write, and the child's exec then throws
// the copy away: in a sustained run of creates that was about a tenth of
// the machine's CPU, in the helper's clone and the faults after it and in
// the child's exec (docs/benchmarks.md, issue #13). Here the child shares
// the helper's memory and so costs none of that, and the helper is not
// suspended as after a vfork: it writes the maps itself while the child
// waits for them on a pipe.
//
// The child runs only clone3's assembly, on a stack of its own: it reads
// the list (built and kept alive here) and makes each call, with no Go code,
// so it never touches the Go runtime's state, which it shares. Signals are
// blocked on the cloning thread across the clone, so the child starts with
// them blocked; its first calls set every handler back to the default, and
// its mask is restored just before the execve, as os/exec does.

// op is one system call of the child: trap and six arguments, and whether
// its failure ends the child: an errno (must 1), an errno or a result other
// than want (must 2), or never (0). clone3's assembly knows this layout (72
// bytes).
type op struct {
	trap uintptr
	a    [6]uintptr
	must uintptr
	want uintptr
}

// cloneArgs is struct clone_args.
type cloneArgs struct {
	flags, pidFD, childTID, parentTID, exitSignal, stack, stackSize, tls, setTID, setTIDSize, cgroup uint64
}

// kernelSigaction is the kernel's struct sigaction on amd64.
type kernelSigaction struct {
	handler, flags, restorer uintptr
	mask                     uint64
}

//go:noescape
func clone3(args *cloneArgs, size uintptr, ops *op, n uintptr, errfd uintptr) (pid uintptr, errno uintptr)

// maxOps bounds a child's list: a reset for each of 64 signals, at most
// maxFiles+3 descriptors, and the rest.
const maxOps = 64 + maxFiles + 3 + 16

// childMem is what the child reads, in one allocation on the Go heap that
// outlives the child's exec (see fastStart's KeepAlive).
type childMem struct {
	ops     [maxOps]op
	names   [maxOps]string // constants, for the parent's error message only
	n       int
	dfl     kernelSigaction
	all     uint64 // every signal, blocked across the clone
	oldMask uint64 // the cloning thread's mask, the child's after the reset
	nofile  unix.Rlimit
	buf     [8]byte
	helper  unix.PollFd // the helper's pidfd, polled by the child
	pidfd   int32
	args    cloneArgs
}

func (m *childMem) add(name string, must bool, trap uintptr, a ...uintptr) {
	o := &m.ops[m.n]
	o.trap = trap
	copy(o.a[:], a)
	if must {
		o.must = 1
	}
	m.names[m.n] = name
	m.n++
}

// addWant adds a call that must return want.
func (m *childMem) addWant(name string, want uintptr, trap uintptr, a ...uintptr) {
	m.add(name, true, trap, a...)
	m.ops[m.n-1].must, m.ops[m.n-1].want = 2, want
}

// childStackSize is the child's stack: it holds nothing but the two words
// of a failure report (and a signal frame, were one ever delivered).
const childStackSize = 16 << 10

// helperPidfd is a pidfd of this process (close-on-exec), for children to
// find whether it still lives.
var helperPidfd = sync.OnceValues(func() (int, error) { return unix.PidfdOpen(os.Getpid(), 0) })

// stacks holds the children's stacks for reuse: mapped outside the Go
// heap, which the child must not depend on.
var stacks = sync.Pool{New: func() any {
	b, err := unix.Mmap(-1, 0, childStackSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_STACK)
	if err != nil {
		return fmt.Errorf("mapping a stack: %w", err)
	}
	return &b
}}

// fastStart starts cmd as os/exec's Start would with the attributes the ns
// runtime sets (see attr), and returns the child's PID and a pidfd. The
// caller reaps the child. It runs on the calling thread, whose network
// namespace the child is born in.
func fastStart(cmd *exec.Cmd) (pid, pidfd int, err error) {
	sys := cmd.SysProcAttr
	if sys == nil {
		sys = &syscall.SysProcAttr{}
	}
	m := new(childMem)

	// What the child reads, on the heap and kept alive to the end.
	path, err := syscall.BytePtrFromString(cmd.Path)
	if err != nil {
		return 0, -1, err
	}
	argv, err := syscall.SlicePtrFromStrings(cmd.Args)
	if err != nil {
		return 0, -1, err
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	envv, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return 0, -1, err
	}
	var dir *byte
	if cmd.Dir != "" {
		if dir, err = syscall.BytePtrFromString(cmd.Dir); err != nil {
			return 0, -1, err
		}
	}

	// The child's descriptors 0, 1, 2 and ExtraFiles from 3, each first
	// duplicated here above the last of them, close-on-exec, so that the
	// child's dup3 into place never overwrites one it still needs.
	targets := []*os.File{nil, fileOf(cmd.Stdout), fileOf(cmd.Stderr)}
	targets = append(targets, cmd.ExtraFiles...)
	if len(targets) > maxFiles+3 {
		return 0, -1, errors.New("spawn: too many files")
	}
	var devnull *os.File
	var owned []int // descriptors to close once the child has them
	defer func() {
		for _, fd := range owned {
			unix.Close(fd)
		}
		if devnull != nil {
			devnull.Close()
		}
	}()
	srcs := make([]int, len(targets))
	for i, f := range targets {
		if f == nil {
			if devnull == nil {
				if devnull, err = os.Open(os.DevNull); err != nil {
					return 0, -1, err
				}
			}
			f = devnull
		}
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, len(targets))
		if err != nil {
			return 0, -1, fmt.Errorf("spawn: duplicating descriptor: %w", err)
		}
		owned = append(owned, fd)
		srcs[i] = fd
	}
	var release, report [2]int
	if err := unix.Pipe2(release[:], unix.O_CLOEXEC); err != nil {
		return 0, -1, err
	}
	owned = append(owned, release[0], release[1])
	if err := unix.Pipe2(report[:], unix.O_CLOEXEC); err != nil {
		return 0, -1, err
	}
	owned = append(owned, report[1])
	defer unix.Close(report[0])

	// The child's calls, in os/exec's order (syscall.forkAndExecInChild1).
	ptr := func(p unsafe.Pointer) uintptr { return uintptr(p) }
	maps := sys.UidMappings != nil || sys.GidMappings != nil
	if maps {
		// Its copy of the pipe's writing end goes first, so that the
		// helper's death ends its wait for the ID maps (an end of file,
		// after which, the maps unwritten, its credentials fail).
		m.add("closing the release pipe", false, unix.SYS_CLOSE, uintptr(release[1]))
	}
	for sig := 1; sig <= 64; sig++ {
		if sig == int(unix.SIGKILL) || sig == int(unix.SIGSTOP) {
			continue
		}
		m.add("resetting signal", false, unix.SYS_RT_SIGACTION, uintptr(sig), ptr(unsafe.Pointer(&m.dfl)), 0, 8)
	}
	if maps {
		// One byte, or the helper died first (an end of file).
		m.addWant("waiting for the ID maps", 1, unix.SYS_READ, uintptr(release[0]), ptr(unsafe.Pointer(&m.buf[0])), 1)
	}
	if sys.Setsid {
		m.add("setsid", true, unix.SYS_SETSID)
	}
	if c := sys.Credential; c != nil {
		if len(c.Groups) > 0 {
			return 0, -1, errors.New("spawn: supplementary groups are not supported")
		}
		if !(sys.GidMappings != nil && !sys.GidMappingsEnableSetgroups) && !c.NoSetGroups {
			m.add("setgroups", true, unix.SYS_SETGROUPS, 0, 0)
		}
		m.add("setgid", true, unix.SYS_SETGID, uintptr(c.Gid))
		m.add("setuid", true, unix.SYS_SETUID, uintptr(c.Uid))
	}
	if dir != nil {
		m.add("chdir", true, unix.SYS_CHDIR, ptr(unsafe.Pointer(dir)))
	}
	if sys.Pdeathsig != 0 {
		// After the credentials, whose change clears it. A helper that
		// died before this cannot send it: the child then polls the
		// helper's pidfd, readable once it is gone, where os/exec compares
		// getppid (0 in a new PID namespace).
		self, err := helperPidfd()
		if err != nil {
			return 0, -1, fmt.Errorf("spawn: the helper's pidfd: %w", err)
		}
		m.helper = unix.PollFd{Fd: int32(self), Events: unix.POLLIN}
		m.add("setting the parent-death signal", true, unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(sys.Pdeathsig))
		m.addWant("finding the helper alive", 0, unix.SYS_POLL, ptr(unsafe.Pointer(&m.helper)), 1, 0)
	}
	for i, fd := range srcs {
		m.add("placing descriptor", true, unix.SYS_DUP3, uintptr(fd), uintptr(i), 0)
	}
	if nofile, ok := childNofile(); ok {
		// What os/exec gives a child: the limit from before Go raised it.
		m.nofile = nofile
		m.add("restoring RLIMIT_NOFILE", false, unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NOFILE, ptr(unsafe.Pointer(&m.nofile)), 0)
	}
	m.add("restoring the signal mask", true, unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, ptr(unsafe.Pointer(&m.oldMask)), 0, 8)
	m.add("exec", true, unix.SYS_EXECVE, ptr(unsafe.Pointer(path)), ptr(unsafe.Pointer(&argv[0])), ptr(unsafe.Pointer(&envv[0])))

	sp, ok := stacks.Get().(*[]byte)
	if !ok {
		return 0, -1, fmt.Errorf("spawn: child stack: %v", stacks.Get())
	}
	stack := *sp
	m.args = cloneArgs{
		flags:      uint64(sys.Cloneflags) | unix.CLONE_VM | unix.CLONE_PIDFD,
		pidFD:      uint64(ptr(unsafe.Pointer(&m.pidfd))),
		exitSignal: uint64(unix.SIGCHLD),
		stack:      uint64(ptr(unsafe.Pointer(&stack[0]))),
		stackSize:  uint64(len(stack)),
	}
	if sys.UseCgroupFD {
		m.args.flags |= unix.CLONE_INTO_CGROUP
		m.args.cgroup = uint64(sys.CgroupFD)
	}
	m.all = ^uint64(0)

	// Signals stay blocked on this thread from before the clone until
	// after it, so that none is handled by Go on the child.
	goruntime.LockOSThread()
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, ptr(unsafe.Pointer(&m.all)), ptr(unsafe.Pointer(&m.oldMask)), 8, 0, 0); e != 0 {
		goruntime.UnlockOSThread()
		stacks.Put(sp)
		return 0, -1, fmt.Errorf("spawn: blocking signals: %w", e)
	}
	upid, errno := clone3(&m.args, unsafe.Sizeof(m.args), &m.ops[0], uintptr(m.n), uintptr(report[1]))
	unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, ptr(unsafe.Pointer(&m.oldMask)), 0, 8, 0, 0)
	goruntime.UnlockOSThread()
	if errno != 0 {
		stacks.Put(sp)
		return 0, -1, fmt.Errorf("spawn: clone3: %w", syscall.Errno(errno))
	}
	pid, pidfd = int(upid), int(m.pidfd)

	fail := func(err error) (int, int, error) {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		reap(pid)
		unix.Close(pidfd)
		return 0, -1, err
	}
	if maps {
		if err := writeIDMaps(pid, sys); err != nil {
			return fail(err) // its stack is not reused: the child may be on it
		}
		if _, err := unix.Write(release[1], []byte{0}); err != nil {
			return fail(fmt.Errorf("spawn: releasing the child: %w", err))
		}
	}
	// Close the parent's copies of the child's ends, so that the report
	// pipe ends at the child's exec.
	for _, fd := range owned {
		unix.Close(fd)
	}
	owned = nil
	var rep [16]byte
	n, err := readFull(report[0], rep[:])
	goruntime.KeepAlive(m)
	goruntime.KeepAlive(path)
	goruntime.KeepAlive(argv)
	goruntime.KeepAlive(envv)
	goruntime.KeepAlive(dir)
	if err != nil {
		return fail(fmt.Errorf("spawn: reading the child's report: %w", err))
	}
	if n == 0 { // the exec closed it: the child is the new program
		stacks.Put(sp)
		return pid, pidfd, nil
	}
	// The child failed and is exiting; its stack is done with.
	stacks.Put(sp)
	idx := *(*uintptr)(unsafe.Pointer(&rep[0]))
	e := syscall.Errno(*(*uintptr)(unsafe.Pointer(&rep[8])))
	what := "starting"
	if idx < uintptr(m.n) {
		what = describe(m.names[idx], m.ops[idx], cmd.Path)
	}
	reap(pid)
	unix.Close(pidfd)
	return 0, -1, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: fmt.Errorf("%s: %w", what, e)}
}

// describe names a failed call of the child for its error: name, with the
// signal, descriptor or program it was about.
func describe(name string, o op, path string) string {
	switch o.trap {
	case unix.SYS_RT_SIGACTION:
		return name + " " + strconv.Itoa(int(o.a[0]))
	case unix.SYS_DUP3:
		return name + " " + strconv.Itoa(int(o.a[1]))
	case unix.SYS_EXECVE:
		return name + " " + path
	}
	return name
}

func fileOf(w any) *os.File {
	f, _ := w.(*os.File)
	return f
}

// readFull reads until b is full or the end; it returns how much it read.
func readFull(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Read(fd, b[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			break
		}
		n += k
	}
	return n, nil
}

// writeIDMaps writes the child's user namespace's ID maps, as os/exec does.
func writeIDMaps(pid int, sys *syscall.SysProcAttr) error {
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	if sys.GidMappings != nil {
		if !sys.GidMappingsEnableSetgroups {
			if err := os.WriteFile(dir+"setgroups", []byte("deny"), 0); err != nil {
				return fmt.Errorf("spawn: writing setgroups: %w", err)
			}
		}
		if err := os.WriteFile(dir+"gid_map", idMap(sys.GidMappings), 0); err != nil {
			return fmt.Errorf("spawn: writing gid_map: %w", err)
		}
	}
	if sys.UidMappings != nil {
		if err := os.WriteFile(dir+"uid_map", idMap(sys.UidMappings), 0); err != nil {
			return fmt.Errorf("spawn: writing uid_map: %w", err)
		}
	}
	return nil
}

func idMap(ms []syscall.SysProcIDMap) []byte {
	var b []byte
	for _, m := range ms {
		b = strconv.AppendInt(b, int64(m.ContainerID), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(m.HostID), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(m.Size), 10)
		b = append(b, '\n')
	}
	return b
}

// childNofile is the RLIMIT_NOFILE a child gets, and whether to set it. Go
// raised this process's soft limit to the hard one less one at its start
// (package syscall) and os/exec gives children the limit from before; that
// value is Go's own, so where the raise happened the child gets Linux's
// default soft limit, 1024, which is what the process started with unless
// its starter chose otherwise (systemd's default too).
//
// Read once: nothing in the helper changes its limit.
var childNofile = sync.OnceValues(func() (unix.Rlimit, bool) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Max == unix.RLIM_INFINITY || lim.Cur != lim.Max-1 {
		return lim, false
	}
	lim.Cur = min(1024, lim.Max)
	return lim, true
})

// haveFastStart says fastStart is there (amd64).
const haveFastStart = true

// reap waits for the child pid to end.
func reap(pid int) {
	for {
		_, err := unix.Wait4(pid, nil, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
