package ns

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/internal/runtime"
)

// cgroupParent is the cgroup under which every sandbox gets its own.
const cgroupParent = "/atoll"

// cgroup is a sandbox's cgroup on either hierarchy. On hybrid hosts (v1
// controllers, an empty v2 tree) the v1 controllers are used.
type cgroup struct {
	v1 cgroup1.Cgroup
	v2 *cgroup2.Manager
}

func unified() bool { return cgroups.Mode() == cgroups.Unified }

func cgroupPath(id string) string { return cgroupParent + "/" + id }

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if l.CPU > 0 {
		period := uint64(100000)
		quota := int64(l.CPU * float64(period))
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if l.MemoryBytes > 0 {
		limit := l.MemoryBytes
		swap := l.MemoryBytes // memory+swap == memory: no swap
		r.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &swap}
	}
	if l.PIDs > 0 {
		pids := l.PIDs
		r.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return r
}

func newCgroup(id string, l runtime.Limits) (*cgroup, error) {
	if unified() {
		r := cgroup2.ToResources(resources(l))
		if l.MemoryBytes > 0 {
			zero := int64(0)
			r.Memory.Swap = &zero
		}
		m, err := cgroup2.NewManager("/sys/fs/cgroup", cgroupPath(id), r)
		if err != nil {
			return nil, fmt.Errorf("creating cgroup: %w", err)
		}
		return &cgroup{v2: m}, nil
	}
	c, err := cgroup1.New(cgroup1.StaticPath(cgroupPath(id)), resources(l), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	return &cgroup{v1: c}, nil
}

// v1Hierarchy is the v1 controllers atoll uses; others (net_cls, perf_event,
// named hierarchies) are left alone.
func v1Hierarchy() ([]cgroup1.Subsystem, error) {
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
}

func loadCgroup(id string) (*cgroup, error) {
	if unified() {
		m, err := cgroup2.Load(cgroupPath(id))
		if err != nil {
			return nil, err
		}
		return &cgroup{v2: m}, nil
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(cgroupPath(id)), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, err
	}
	return &cgroup{v1: c}, nil
}

func (c *cgroup) update(l runtime.Limits) error {
	if c.v2 != nil {
		r := cgroup2.ToResources(resources(l))
		if l.MemoryBytes > 0 {
			zero := int64(0)
			r.Memory.Swap = &zero
		}
		return c.v2.Update(r)
	}
	return c.v1.Update(resources(l))
}

func (c *cgroup) add(pid int) error {
	if c.v2 != nil {
		return c.v2.AddProc(uint64(pid))
	}
	return c.v1.Add(cgroup1.Process{Pid: pid})
}

func (c *cgroup) pids() ([]int, error) {
	if c.v2 != nil {
		ps, err := c.v2.Procs(true)
		out := make([]int, len(ps))
		for i, p := range ps {
			out[i] = int(p)
		}
		return out, err
	}
	ps, err := c.v1.Processes(cgroup1.Pids, true)
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.Pid
	}
	return out, err
}

// killAll kills whatever is left in the cgroup and waits until it is empty, so
// that deleting it cannot fail with EBUSY.
func (c *cgroup) killAll(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := c.pids()
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
			_ = killPID(p)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (c *cgroup) delete() error {
	if c.v2 != nil {
		return c.v2.Delete()
	}
	return c.v1.Delete()
}
