package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
	"github.com/atoll-dev/atoll/internal/runtime/confine"
	"github.com/atoll-dev/atoll/internal/runtime/host"
)

// DefaultCgroupParent is Config.CgroupParent's default.
const DefaultCgroupParent = "/atoll-gvisor"

func (r *Runtime) cgroupPath(id string) string { return r.cgParent + "/" + id }

// memoryOverhead is added to a sandbox's memory limit for the sentry and
// gofer themselves (about 20 MiB idle), so that the limit is what the
// sandbox's processes may use.
const memoryOverhead = 32 << 20

// keptCapabilities are Docker's defaults, as the ns runtime keeps; runsc
// drops CAP_NET_RAW on its own unless --net-raw. No masked paths: the
// sentry's /proc and /sys are its own (see package confine).
var keptCapabilities = confine.CapabilityNames()

// ociSpec is the OCI config of sandbox spec, whose bundle is dir, whose root
// is mounted at rootfs and whose agent socket directory is sock.
func (r *Runtime) ociSpec(spec runtime.Spec, dir, rootfs, sock string) (*specs.Spec, error) {
	agentEnv, err := json.Marshal(spec.Env)
	if err != nil {
		return nil, err
	}
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, b := range spec.Rootfs.Binds {
		mounts = append(mounts, specs.Mount{Destination: b.Target, Type: "bind", Source: b.Source, Options: ro})
	}
	// runsc puts a tmpfs on an empty /tmp unless /tmp is a mount of its
	// own, and /tmp is part of what a sandbox keeps across stop and start.
	// The bind's source is resolved on the host, so it must be the root's
	// own directory, never a symlink a sandbox left there.
	if fi, err := os.Lstat(filepath.Join(rootfs, "tmp")); err == nil && fi.IsDir() {
		mounts = append(mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(rootfs, "tmp"), Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	mounts = append(mounts,
		specs.Mount{Destination: agentInside, Type: "bind", Source: spec.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: sockInside, Type: "bind", Source: sock, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	)
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace}
	if spec.Network != nil {
		// runsc joins the namespace and takes its eth0 for the sentry's
		// network stack (prepareBundle wrote these files into dir).
		netns.Path = spec.Network.Netns
		for _, name := range []string{"resolv.conf", "hosts"} {
			mounts = append(mounts, specs.Mount{Destination: "/etc/" + name, Type: "bind", Source: filepath.Join(dir, name), Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
		}
	}
	nproc := uint64(spec.Limits.PIDs)
	var rlimits []specs.POSIXRlimit
	if nproc > 0 {
		// The sentry counts tasks per user against RLIMIT_NPROC, as the
		// pids cgroup counts a sandbox's tasks under ns; no process here
		// holds CAP_SYS_RESOURCE or CAP_SYS_ADMIN, which would lift it.
		rlimits = append(rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc})
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			// argv[0] is what the sandbox sees as PID 1's command line; the
			// sentry finds it on this PATH. The agent clears its environment
			// before it starts anything.
			Args: []string{launch.Name},
			Env: []string{
				"PATH=" + agentDir,
				launch.EnvVar + "=" + string(agentEnv),
				launch.UserVar + "=" + spec.User,
				launch.CwdVar + "=" + spec.Workdir,
				launch.ListenVar + "=" + sockInside + "/" + sockName,
			},
			Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: keptCapabilities, Effective: keptCapabilities, Permitted: keptCapabilities,
			},
			Rlimits:         rlimits,
			NoNewPrivileges: !spec.Setuid,
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: spec.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, netns, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			Resources:   resources(spec.Limits),
			CgroupsPath: r.cgroupPath(spec.ID),
		},
	}, nil
}

// resources are the host cgroup's limits for l: cpu as ns sets them, memory
// with the runtime's overhead on top and no swap, and a pids backstop (the
// ptrace platform keeps a stub process per address space and the sentry and
// gofer have threads of their own; RLIMIT_NPROC is the real count).
func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{CPU: cgroup.CPU(l.CPUWeight, l.CPU)}
	if l.MemoryBytes > 0 {
		limit := l.MemoryBytes + memoryOverhead
		r.Memory = &specs.LinuxMemory{Limit: &limit}
		if swapAccounting() {
			swap := limit
			r.Memory.Swap = &swap
		}
	}
	if l.PIDs > 0 {
		backstop := 4*l.PIDs + 512
		r.Pids = &specs.LinuxPids{Limit: &backstop}
	}
	return r
}

// swapAccounting reports whether the memory cgroup can cap memory+swap (v1
// with memsw, or v2).
func swapAccounting() bool {
	if cgroups.Mode() == cgroups.Unified {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// Update implements runtime.Runtime: the host cgroup's limits at once, and
// RLIMIT_NPROC of the agent (so of everything it starts from now on) through
// a process runsc starts in the sandbox with the capability to set it.
func (r *Runtime) Update(ctx context.Context, id string, l runtime.Limits) error {
	res := resources(l)
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(r.cgroupPath(id))
		if err != nil {
			return fmt.Errorf("loading cgroup: %w", err)
		}
		if err := m.Update(cgroup2.ToResources(res)); err != nil {
			return err
		}
	} else {
		c, err := cgroup1.Load(cgroup1.StaticPath(r.cgroupPath(id)), cgroup1.WithHierarchy(v1Hierarchy))
		if err != nil {
			return fmt.Errorf("loading cgroup: %w", err)
		}
		if err := c.Update(res); err != nil {
			return err
		}
	}
	if l.PIDs <= 0 {
		return nil
	}
	n := strconv.FormatInt(l.PIDs, 10)
	return r.run(ctx, nil, "exec", "--cap", "CAP_SYS_RESOURCE", id,
		"/usr/bin/prlimit", "--pid", "1", "--nproc="+n+":"+n)
}

// v1Hierarchy is the v1 controllers whose limits Update sets.
func v1Hierarchy() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	want := map[cgroup1.Name]bool{cgroup1.Cpu: true, cgroup1.Memory: true, cgroup1.Pids: true}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if want[s.Name()] {
			out = append(out, s)
		}
	}
	return out, nil
}

// cgroupPIDs lists the host processes in sandbox id's cgroup: sentry, gofer
// and platform stubs.
func (r *Runtime) cgroupPIDs(id string) []int {
	f := filepath.Join("/sys/fs/cgroup", r.cgroupPath(id), "cgroup.procs")
	if cgroups.Mode() != cgroups.Unified {
		f = filepath.Join("/sys/fs/cgroup/pids", r.cgroupPath(id), "cgroup.procs")
	}
	b, _ := os.ReadFile(f)
	var pids []int
	for _, s := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(s); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// removeCgroups kills what is left in sandbox id's host cgroups and removes
// them, on every v1 hierarchy runsc used or on v2. runsc delete does this
// itself; this is for what a crash left.
func (r *Runtime) removeCgroups(id string) error {
	var dirs []string
	if cgroups.Mode() == cgroups.Unified {
		dirs = []string{filepath.Join("/sys/fs/cgroup", r.cgroupPath(id))}
	} else {
		ents, _ := os.ReadDir("/sys/fs/cgroup")
		for _, e := range ents {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", e.Name(), r.cgroupPath(id)))
		}
	}
	var errs []error
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			pids := strings.Fields(string(b))
			if err != nil || len(pids) == 0 || time.Now().After(deadline) {
				break
			}
			for _, p := range pids {
				if pid, err := strconv.Atoi(p); err == nil {
					_ = host.KillAndWait(pid, time.Second)
				}
			}
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
