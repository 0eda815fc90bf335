// Package cgroup places a sandbox's host processes in a cgroup of their own,
// on a v2 (unified) host or, on hybrid and v1 hosts, in the v1 controllers
// atoll uses, and starts processes born inside it.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/internal/runtime/host"
)

// Cgroup is a cgroup on either hierarchy. On hybrid hosts (v1 controllers,
// an empty v2 tree) the v1 controllers are used.
type Cgroup struct {
	path string // below the hierarchy's root, e.g. /atoll/ID
	v1   cgroup1.Cgroup
	v2   *cgroup2.Manager
}

// Unified reports whether the host's cgroups are v2 only.
func Unified() bool { return cgroups.Mode() == cgroups.Unified }

// Path is the cgroup's path below the hierarchy's root.
func (c *Cgroup) Path() string { return c.path }

// v2Resources is r for cgroup2: a memory limit comes with no swap, as v1's
// memory+swap limit equal to it says.
func v2Resources(r *specs.LinuxResources) *cgroup2.Resources {
	out := cgroup2.ToResources(r)
	if r.Memory != nil && r.Memory.Limit != nil && out.Memory != nil {
		zero := int64(0)
		out.Memory.Swap = &zero
	}
	return out
}

// CPU is a sandbox's CPU limits: its share of contended CPU from weight
// (100 when 0, as cgroup v2's default; v1 shares are 1024 at that) and, if
// cores is above 0, a quota of that many cores. The quota's period is short:
// at 100 ms (the usual default) a sandbox spinning on every core holds them
// all for tens of milliseconds before it is throttled, and its neighbours
// wait that long.
func CPU(weight uint64, cores float64) *specs.LinuxCPU {
	if weight == 0 {
		weight = 100
	}
	shares := max(weight*1024/100, 2)
	c := &specs.LinuxCPU{Shares: &shares}
	if cores > 0 {
		period := uint64(10000)
		quota := int64(cores * float64(period))
		c.Period, c.Quota = &period, &quota
	}
	return c
}

// New makes the cgroup at path with limits r.
func New(path string, r *specs.LinuxResources) (*Cgroup, error) {
	if Unified() {
		m, err := cgroup2.NewManager("/sys/fs/cgroup", path, v2Resources(r))
		if err != nil {
			return nil, fmt.Errorf("creating cgroup: %w", err)
		}
		return &Cgroup{path: path, v2: m}, nil
	}
	c, err := cgroup1.New(cgroup1.StaticPath(path), r, cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	return &Cgroup{path: path, v1: c}, nil
}

// v1Hierarchy is the v1 controllers atoll uses; others (net_cls, perf_event,
// named hierarchies) are left alone. Where they are mounted is read once:
// finding out parses /proc/self/mountinfo, and every create, delete and
// limit change of a sandbox asks.
var v1Hierarchy = sync.OnceValues(func() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	// Each controller joined costs a cgroup migration at start; these are the
	// ones whose limits or freezing atoll uses.
	want := map[cgroup1.Name]bool{
		cgroup1.Cpu: true, cgroup1.Cpuacct: true, cgroup1.Memory: true,
		cgroup1.Pids: true, cgroup1.Freezer: true,
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if want[s.Name()] {
			out = append(out, s)
		}
	}
	return out, nil
})

// Load opens the cgroup at path.
func Load(path string) (*Cgroup, error) {
	if Unified() {
		m, err := cgroup2.Load(path)
		if err != nil {
			return nil, err
		}
		return &Cgroup{path: path, v2: m}, nil
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, err
	}
	return &Cgroup{path: path, v1: c}, nil
}

// Update sets the cgroup's limits to r.
func (c *Cgroup) Update(r *specs.LinuxResources) error {
	if c.v2 != nil {
		return c.v2.Update(v2Resources(r))
	}
	if r != nil && r.Memory != nil && r.Memory.Swap != nil {
		// containerd's cgroup1 writes memory.limit_in_bytes before
		// memory.memsw.limit_in_bytes (its reordering for a rising limit
		// swaps the wrong pair), and the kernel refuses a limit above the
		// current memsw: raise memsw first. When the limit falls, this
		// write is refused and the update below lowers both in order.
		c.v1.Update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Swap: r.Memory.Swap}})
	}
	return c.v1.Update(r)
}

// Start starts cmd as a process born inside the cgroup, so that a cgroup
// namespace it creates at clone is rooted there, and, if netns is not
// empty, inside the network namespace at that path (see runtime.Network).
// On v2 the kernel does the cgroup part (CLONE_INTO_CGROUP). On v1 the
// forking thread joins the cgroup for the clone (v1 places threads, not
// only processes) and then goes back where it was. The network namespace is
// joined the same way, by the forking thread for the clone only. A thread
// that cannot go back ends, its goroutine still locked to it, so the Go
// runtime retires the thread rather than run other work in the sandbox's
// cgroup or namespace; the child goes with it (Pdeathsig is per thread).
// A thread that went back lives on, and so does the child.
func (c *Cgroup) Start(cmd *exec.Cmd, netns string) error {
	if c.v2 != nil {
		dir, err := os.Open(filepath.Join("/sys/fs/cgroup", c.path))
		if err != nil {
			return err
		}
		defer dir.Close()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dir.Fd())
		if netns == "" {
			return cmd.Start()
		}
	}
	return c.start(cmd, netns, c.v1 != nil)
}

// BirthDir opens the cgroup's directory for a process to be born in it
// (CLONE_INTO_CGROUP) on v2, and returns nil on v1, where a process started
// elsewhere is moved in instead (MoveIn): that costs one cgroup migration
// per controller, where being born inside on v1 costs two (the forking
// thread's way in and back out), and each migration takes a lock that
// every fork and exit on the host also takes, so in a burst of creates they
// are a large part of a start. A process moved in must not fork before the
// move (a child would stay behind; its own threads move with it) and, born
// outside, it must create its cgroup namespace itself once moved.
func (c *Cgroup) BirthDir() (*os.File, error) {
	if c.v2 == nil {
		return nil, nil
	}
	return os.Open(filepath.Join("/sys/fs/cgroup", c.path))
}

// MoveIn moves process pid into the cgroup (see BirthDir).
func (c *Cgroup) MoveIn(pid int) error {
	if c.v2 != nil {
		return c.v2.AddProc(uint64(pid))
	}
	if err := c.v1.Add(cgroup1.Process{Pid: pid}); err != nil {
		return fmt.Errorf("moving the process into its cgroup: %w", err)
	}
	return nil
}

// start starts cmd from a thread in network namespace netns (if set) and,
// if join, in the v1 cgroup (see Start).
func (c *Cgroup) start(cmd *exec.Cmd, netns string, join bool) error {
	if !join && netns == "" {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		tid := unix.Gettid()
		var home cgroup1.Cgroup
		if join {
			var err error
			home, err = cgroup1.Load(threadPath(tid), cgroup1.WithHierarchy(v1Hierarchy))
			if err != nil {
				goruntime.UnlockOSThread()
				errc <- fmt.Errorf("finding the node's cgroup: %w", err)
				return
			}
		}
		back := func() error { return nil }
		if netns != "" {
			var err error
			if back, err = joinNetns(netns); err != nil {
				goruntime.UnlockOSThread()
				errc <- err
				return
			}
		}
		if join {
			if err := c.v1.AddTask(cgroup1.Process{Pid: tid}); err != nil {
				// Perhaps in some of the controllers: the thread ends.
				errc <- fmt.Errorf("joining cgroup: %w", err)
				return
			}
		}
		err := cmd.Start()
		// Back home before answering, so that nothing acting on the
		// sandbox's cgroup (a kill of all it holds) ever meets this thread.
		if home != nil {
			if herr := home.AddTask(cgroup1.Process{Pid: tid}); herr != nil {
				errc <- errors.Join(err, fmt.Errorf("leaving the sandbox's cgroup: %w", herr))
				return
			}
		}
		if nerr := back(); nerr != nil {
			errc <- errors.Join(err, nerr)
			return
		}
		goruntime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// joinNetns moves the calling thread, which must be locked to its
// goroutine, into the network namespace at path, and returns how to move it
// back.
func joinNetns(path string) (back func() error, err error) {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace: %w", err)
	}
	defer unix.Close(target)
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening own network namespace: %w", err)
	}
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		unix.Close(orig)
		return nil, fmt.Errorf("joining network namespace: %w", err)
	}
	return func() error {
		defer unix.Close(orig)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("returning to own network namespace: %w", err)
		}
		return nil
	}, nil
}

// threadPath is the v1 cgroup path of thread tid, per subsystem.
func threadPath(tid int) cgroup1.Path {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	paths := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			paths[ctrl] = parts[2]
		}
	}
	return func(name cgroup1.Name) (string, error) {
		if err != nil {
			return "", err
		}
		p, ok := paths[string(name)]
		if !ok {
			return "", cgroup1.ErrControllerNotActive
		}
		return p, nil
	}
}

// PIDs lists the processes in the cgroup.
func (c *Cgroup) PIDs() ([]int, error) {
	if c.v2 != nil {
		ps, err := c.v2.Procs(true)
		out := make([]int, len(ps))
		for i, p := range ps {
			out[i] = int(p)
		}
		return out, err
	}
	// Any controller will do: a process is in all of them. The cgroup may
	// lack some, if a crash came while it was being made.
	subs := c.v1.Subsystems()
	if len(subs) == 0 {
		return nil, nil
	}
	p, ok := subs[0].(interface{ Path(string) string })
	if !ok {
		return nil, fmt.Errorf("cgroup v1 %s has no path", subs[0].Name())
	}
	return procsBelow(p.Path(c.path), nil)
}

// procsBelow appends to pids the processes of the v1 cgroup at dir and of
// the cgroups below it. It reads cgroup.procs and lists directories only,
// where containerd's Processes stats every file of every cgroup: a delete
// of each sandbox asks.
func procsBelow(dir string, pids []int) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return pids, err
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return pids, fmt.Errorf("parsing %s: %w", filepath.Join(dir, "cgroup.procs"), err)
		}
		pids = append(pids, pid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return pids, err
	}
	for _, e := range entries {
		if e.IsDir() {
			if pids, err = procsBelow(filepath.Join(dir, e.Name()), pids); err != nil && !errors.Is(err, os.ErrNotExist) {
				return pids, err
			}
		}
	}
	return pids, nil
}

// KillAll kills whatever is left in the cgroup and waits until it is empty, so
// that deleting it cannot fail with EBUSY.
func (c *Cgroup) KillAll(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := c.PIDs()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup still has %d processes", len(pids))
		}
		for _, p := range pids {
			_ = host.KillPID(p)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Delete removes the cgroup, which must be empty.
func (c *Cgroup) Delete() error {
	if c.v2 != nil {
		return c.v2.Delete()
	}
	if rmdirV1(c.path) == nil {
		return nil
	}
	return c.v1.Delete()
}

// rmdirV1 removes the cgroup at path from each v1 hierarchy with one rmdir
// each. The kernel refuses (EBUSY) while the cgroup holds a process or a
// child cgroup; then the caller goes on to containerd's Delete, which says
// which and retries. It is the common case made cheap: containerd's Delete
// first walks every file of the cgroup in each hierarchy (a stat of each)
// to look for processes the rmdir would find too.
func rmdirV1(path string) error {
	subs, err := v1Hierarchy()
	if err != nil {
		return err
	}
	for _, s := range subs {
		p, ok := s.(interface{ Path(string) string })
		if !ok {
			return fmt.Errorf("cgroup v1 %s has no path", s.Name())
		}
		// cpu and cpuacct share a hierarchy: the second finds it gone.
		if err := unix.Rmdir(p.Path(path)); err != nil && err != unix.ENOENT {
			return err
		}
	}
	return nil
}

// Freeze freezes every process in the cgroup.
func (c *Cgroup) Freeze() error {
	if c.v2 != nil {
		return c.v2.Freeze()
	}
	return c.v1.Freeze()
}

// Thaw thaws them. A v1 cgroup that is not frozen is left as it is: a
// delete thaws first in case the sandbox was paused, and containerd's thaw
// writes the state and reads it back.
func (c *Cgroup) Thaw() error {
	if c.v2 != nil {
		return c.v2.Thaw()
	}
	if frozen, err := c.v1Frozen(); err == nil && !frozen {
		return nil
	}
	return c.v1.Thaw()
}

// v1Frozen reports whether the v1 freezer holds the cgroup frozen, or
// freezing.
func (c *Cgroup) v1Frozen() (bool, error) {
	for _, s := range c.v1.Subsystems() {
		if s.Name() != cgroup1.Freezer {
			continue
		}
		p, ok := s.(interface{ Path(string) string })
		if !ok {
			break
		}
		b, err := os.ReadFile(filepath.Join(p.Path(c.path), "freezer.state"))
		if err != nil {
			return false, err
		}
		return !strings.EqualFold(strings.TrimSpace(string(b)), string(cgroup1.Thawed)), nil
	}
	return false, errors.New("no v1 freezer")
}
