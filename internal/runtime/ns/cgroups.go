package ns

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
)

// cgroupParent is the cgroup under which every sandbox gets its own.
const cgroupParent = "/atoll"

func cgroupPath(id string) string { return cgroupParent + "/" + id }

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	weight := l.CPUWeight
	if weight == 0 {
		weight = 100
	}
	// v1 shares: 1024 is the default as 100 is for v2's weight.
	shares := max(weight*1024/100, 2)
	r.CPU = &specs.LinuxCPU{Shares: &shares}
	if l.CPU > 0 {
		// A short period bounds how long a sandbox spinning on every core
		// can hold them all before it is throttled: at 100 ms (the usual
		// default) its neighbours wait up to tens of milliseconds.
		period := uint64(10000)
		quota := int64(l.CPU * float64(period))
		r.CPU.Period, r.CPU.Quota = &period, &quota
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

func newCgroup(id string, l runtime.Limits) (*cgroup.Cgroup, error) {
	return cgroup.New(cgroupPath(id), resources(l))
}

func loadCgroup(id string) (*cgroup.Cgroup, error) { return cgroup.Load(cgroupPath(id)) }
