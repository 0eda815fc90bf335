package ns

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
)

// DefaultCgroupParent is Config.CgroupParent's default.
const DefaultCgroupParent = "/atoll"

func (r *Runtime) cgroupPath(id string) string { return r.cgParent + "/" + id }

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{CPU: cgroup.CPU(l.CPUWeight, l.CPU)}
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

func (r *Runtime) newCgroup(id string, l runtime.Limits) (*cgroup.Cgroup, error) {
	return cgroup.New(r.cgroupPath(id), resources(l))
}

func (r *Runtime) loadCgroup(id string) (*cgroup.Cgroup, error) {
	return cgroup.Load(r.cgroupPath(id))
}
