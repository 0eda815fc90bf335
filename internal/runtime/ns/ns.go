// Package ns runs sandboxes in Linux namespaces: user (root inside maps to an
// unprivileged host range), pid, mount, uts, ipc, net (its own, or one made
// for it by package network, which the sandbox does not own) and cgroup, on an overlay
// of id-mapped template layers and a writable layer, under cgroup limits, with a
// reduced capability set, no_new_privs and a seccomp filter.
//
// The node side here prepares what needs host privileges (cgroups, id-mapped
// mounts, the agent's socket); nsinit, running inside the new namespaces, does
// the rest and goes on as the agent. Nothing is mounted in the host's mount namespace
// once a sandbox runs: its mounts live and die with its own mount namespace.
package ns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
	"github.com/atoll-dev/atoll/internal/runtime/host"
	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
	"github.com/atoll-dev/atoll/internal/runtime/spawn"
)

// Config configures the ns runtime.
type Config struct {
	// RunRoot holds one directory per running sandbox (socket, log, transient
	// mountpoints). It must be reachable (mode 0711 or wider on every parent)
	// by the sandboxes' unprivileged host uids.
	RunRoot string
	// Lowers builds and mounts the template layers' images, shared with the
	// other runtimes of the node; nil makes one in RunRoot/lowers.
	Lowers *lowers.Images
	// CgroupParent is the cgroup below which each sandbox gets its own,
	// default /atoll. Servers that share a host each need their own.
	CgroupParent string
	// SandboxFsync makes fsync and syncfs inside a sandbox reach the disk.
	// Unset, a sandbox's root overlay is volatile (overlay.Options.Volatile,
	// docs/lifecycle.md says why): its writes reach the disk by writeback
	// alone, and deleting it does not sync the layer store.
	SandboxFsync bool
	Logger       *slog.Logger
}

// Runtime is the ns backend.
type Runtime struct {
	runRoot  string
	cgParent string // Config.CgroupParent
	fsync    bool   // Config.SandboxFsync
	log      *slog.Logger

	mu       sync.Mutex
	prepared map[string]*prepared // by sandbox ID
	// lowers are the template layers' images the sandboxes' roots stack
	// on (package lowers says why).
	lowers *lowers.Images
	// spawner starts the sandboxes' processes, made on the first start
	// with its agent binary.
	spawner *spawn.Spawner
	// lonets are the network namespaces of sandboxes without a network
	// (lonet.go).
	lonets *loNets
	// inits holds a pidfd of the init of each sandbox this runtime
	// started, by its instance, and the instance by sandbox ID: Alive and
	// Stop ask the pidfd. A sandbox started before the node's restart is
	// looked up by its PID and start time in /proc/PID/stat instead
	// (host.Alive): those reads, with the one at start (finish), were
	// about 1% of the node's CPU in a sustained run of creates and deletes.
	inits   map[instKey]*spawn.Child
	initsOf map[string]instKey
}

// instKey names a sandbox's init across PID reuse.
type instKey struct {
	pid   int
	start uint64
}

func keyOf(inst runtime.Instance) instKey { return instKey{inst.PID, inst.StartTime} }

// keepInit records child as the init of sandbox id, started as inst.
func (r *Runtime) keepInit(id string, inst runtime.Instance, child *spawn.Child) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropInitLocked(id)
	r.inits[keyOf(inst)] = child
	r.initsOf[id] = keyOf(inst)
}

// dropInitLocked forgets sandbox id's init, closing its pidfd; r.mu is held.
func (r *Runtime) dropInitLocked(id string) {
	if k, ok := r.initsOf[id]; ok {
		_ = r.inits[k].Release()
		delete(r.inits, k)
		delete(r.initsOf, id)
	}
}

// takeInit returns the pidfd of sandbox id's init if this runtime started
// it as inst, and forgets it: the caller releases it.
func (r *Runtime) takeInit(id string, inst runtime.Instance) *spawn.Child {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := keyOf(inst)
	c, ok := r.inits[k]
	if !ok || r.initsOf[id] != k {
		return nil
	}
	delete(r.inits, k)
	delete(r.initsOf, id)
	return c
}

var (
	_ runtime.Runtime  = (*Runtime)(nil)
	_ runtime.Preparer = (*Runtime)(nil)
	_ runtime.Capabler = (*Runtime)(nil)
)

// New checks that the host can run namespace sandboxes and prepares RunRoot.
func New(cfg Config) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the ns runtime needs root")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.RunRoot, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(cfg.RunRoot, 0o711); err != nil {
		return nil, err
	}
	if err := host.PrivateTmpfs(cfg.RunRoot); err != nil {
		return nil, err
	}
	// Descriptors this process inherited are not close-on-exec, so every
	// sandbox would inherit them too; a directory among them is a way out of
	// the sandbox's root (CVE-2024-21626). Go opens its own close-on-exec.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return nil, fmt.Errorf("marking inherited descriptors close-on-exec: %w", err)
	}
	lw := cfg.Lowers
	if lw == nil {
		var err error
		if lw, err = lowers.New(filepath.Join(cfg.RunRoot, "lowers"), cfg.Logger); err != nil {
			return nil, err
		}
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	return &Runtime{runRoot: cfg.RunRoot, cgParent: cfg.CgroupParent, fsync: cfg.SandboxFsync, log: cfg.Logger, prepared: map[string]*prepared{}, inits: map[instKey]*spawn.Child{}, initsOf: map[string]instKey{}, lowers: lw, lonets: newLoNets()}, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "ns" }

// PrepareLayers implements runtime.LayerPreparer: the layers' erofs images.
func (r *Runtime) PrepareLayers(ctx context.Context, layers []string) error {
	_, err := r.lowers.Mount(ctx, layers)
	return err
}

// PruneLayers implements runtime.LayerPruner.
func (r *Runtime) PruneLayers() { r.lowers.Prune() }

// Capabilities implements runtime.Capabler: the cgroup freezer pauses, the
// memory cgroup's OOM killer picks single processes, and the sandbox runs on
// the host kernel.
func (r *Runtime) Capabilities() runtime.Caps {
	return runtime.Caps{Pause: true, ProcessOOM: true, SharedKernel: true, Network: true}
}

func (r *Runtime) runDir(id string) string { return filepath.Join(r.runRoot, id) }

// SocketPath is where the agent of sandbox id listens.
func (r *Runtime) SocketPath(id string) string { return SocketPath(r.runRoot, id) }

// SocketPath is the host path of sandbox id's agent socket under a runtime
// whose Config.RunRoot is runRoot.
func SocketPath(runRoot, id string) string { return filepath.Join(runRoot, id, "agent.sock") }

// prepared is a sandbox process started ahead of its files: namespaces,
// cgroup and agent socket exist, and the init stage waits on ctl for its
// configuration.
type prepared struct {
	dir    string
	cg     *cgroup.Cgroup
	child  *spawn.Child
	ctl    *os.File
	limits runtime.Limits
	netns  string // the network namespace it was started in; "" for its own
	// newCgroupNS: it was born outside its cgroup and moved in (v1), so
	// it creates its cgroup namespace itself (nsinit.Config.NewCgroupNS).
	newCgroupNS bool
}

// netnsOf is the path of spec's network namespace, "" for one of its own.
func netnsOf(spec runtime.Spec) string {
	if spec.Network == nil {
		return ""
	}
	return spec.Network.Netns
}

// kill ends p's process and releases what it holds.
func (r *Runtime) kill(id string, p *prepared) {
	_ = p.child.Kill()
	_ = p.child.Release()
	p.ctl.Close()
	_ = p.cg.KillAll(5 * time.Second)
	_ = p.cg.Delete()
	r.lonets.release(id, false)
	_ = r.cleanupDir(id)
}

// Prepare implements runtime.Preparer: it does the part of a start that does
// not depend on the sandbox's files (cgroup, namespaces, the agent process
// and its runtime start-up, about two thirds of a start), so that a Start of
// spec.ID later only mounts and goes. Until then the process dies with the
// node.
func (r *Runtime) Prepare(ctx context.Context, spec runtime.Spec) error {
	p, err := r.prepare(spec)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.prepared[spec.ID]; old != nil {
		r.kill(spec.ID, old)
	}
	r.prepared[spec.ID] = p
	return nil
}

// takePrepared returns the process prepared for id, if any.
func (r *Runtime) takePrepared(id string) *prepared {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.prepared[id]
	delete(r.prepared, id)
	return p
}

func (r *Runtime) prepare(spec runtime.Spec) (_ *prepared, err error) {
	dir := r.runDir(spec.ID)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	p := &prepared{dir: dir, limits: spec.Limits, netns: netnsOf(spec)}
	var childCtl *os.File
	defer func() {
		if childCtl != nil {
			childCtl.Close()
		}
		if err == nil {
			return
		}
		if p.child != nil {
			_ = p.child.Kill()
			_ = p.child.Release()
		}
		if p.ctl != nil {
			p.ctl.Close()
		}
		if p.cg != nil {
			_ = p.cg.KillAll(5 * time.Second)
			_ = p.cg.Delete()
		}
		r.lonets.release(spec.ID, false)
		_ = r.cleanupDir(spec.ID)
	}()

	lnFile, err := listenAgent(r.SocketPath(spec.ID))
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()

	p.cg, err = r.newCgroup(spec.ID, spec.Limits)
	if err != nil {
		return nil, err
	}
	if p.ctl, childCtl, err = controlPair(); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()

	if err := stagingMount(filepath.Join(dir, "mnt")); err != nil {
		return nil, err
	}

	// A sandbox without a network made for it gets a namespace of the
	// node's too, holding only lo.
	join := p.netns
	if join == "" {
		f, err := r.lonets.get(spec.ID)
		if err != nil {
			return nil, err
		}
		join = loNetPath(f)
	}
	cmd := initCommand(spec, join, logFile, lnFile, childCtl)
	if p.child, p.newCgroupNS, err = r.start(p.cg, cmd, join); err != nil {
		return nil, fmt.Errorf("starting sandbox init: %w", err)
	}
	return p, nil
}

// start starts cmd through the spawner (package spawn says why), born in
// cg on cgroup v2; on v1 it is moved in at once and then, born outside,
// creates its cgroup namespace itself (cgroup.BirthDir): newCgroupNS.
func (r *Runtime) start(cg *cgroup.Cgroup, cmd *exec.Cmd, netns string) (child *spawn.Child, newCgroupNS bool, err error) {
	dir, err := cg.BirthDir()
	if err != nil {
		return nil, false, err
	}
	if dir != nil {
		defer dir.Close()
	} else {
		cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWCGROUP
	}
	r.mu.Lock()
	if r.spawner == nil {
		r.spawner = spawn.New(cmd.Path)
	}
	sp := r.spawner
	r.mu.Unlock()
	if child, err = sp.Start(cmd, netns, dir); err != nil {
		return nil, false, err
	}
	if dir == nil {
		if err := cg.MoveIn(child.Pid); err != nil {
			_ = child.Kill()
			_ = child.Release()
			return nil, false, err
		}
	}
	return child, dir == nil, nil
}

// listenAgent opens the agent's socket at sock, replacing a stale one, and
// returns it as a file for the sandbox's init to inherit. The socket stays
// on disk when the node's copy is closed.
func listenAgent(sock string) (*os.File, error) {
	_ = os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	return lnFile, err
}

// controlPair makes the control socket pair between the node and the
// sandbox's init: node is the node's end, child the init's.
func controlPair() (node, child *os.File, err error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	// The node's end is non-blocking, so that reads from it can time out.
	if err := unix.SetNonblock(pair[0], true); err != nil {
		unix.Close(pair[0])
		unix.Close(pair[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(pair[0]), "control"), os.NewFile(uintptr(pair[1]), "control-child"), nil
}

// stagingMount makes mnt, the staging directory, a small tmpfs of its own
// with shared propagation, so that the id-mapped layers mounted there after
// the sandbox's mount namespace exists still appear in it (as a slave,
// nothing flows back). It stays until the sandbox is configured.
//
// A tmpfs rather than a bind of the run directory onto itself: the mount
// points of the layers are then the tmpfs's own directories, which go with
// it, not directories of the run directory that its cleanup removes one by
// one. Other sandboxes' mount namespaces, cloned while this one stages,
// copy the staging mounts, and removing a directory that a copy still
// mounts on waits for an RCU grace period (about four a sandbox in a
// sustained run).
func stagingMount(mnt string) error {
	if err := os.MkdirAll(mnt, 0o711); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=64k"); err != nil {
		return fmt.Errorf("staging mount: %w", err)
	}
	if err := unix.Mount("", mnt, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("staging mount: %w", err)
	}
	return nil
}

// initCommand is the sandbox's init, the agent in its init role, to be
// started in new namespaces (joining netns, if set, for the network: a
// namespace of its own only if not) with the agent socket and its end of
// the control pair.
func initCommand(spec runtime.Spec, netns string, logFile, lnFile, childCtl *os.File) *exec.Cmd {
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(spec.IDMap.HostID), Size: int(spec.IDMap.Size)}}
	cmd := exec.Command(spec.AgentPath, launch.Init)
	// argv[0] is what the sandbox sees in /proc/1/cmdline: not a host path.
	cmd.Args[0] = launch.Name
	// GOMAXPROCS stays as set at start (agentProcs): Go's runtime would
	// otherwise start a goroutine to follow the cgroup's CPU limit and
	// look at the limit every second, in every sandbox.
	cmd.Env = []string{"GODEBUG=updatemaxprocs=0"}
	if n := agentProcs(spec.Limits); n > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", n))
	}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{lnFile, childCtl} // launch.ListenerFD and ControlFD
	// Every namespace at once, so that all threads of the agent share
	// them; the cgroup namespace is rooted where the process is born, in
	// the sandbox's cgroup, and a network made for the sandbox is joined
	// the same way (see cgroup.start).
	clone := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
		syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWCGROUP)
	if netns == "" {
		clone |= syscall.CLONE_NEWNET
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 clone,
		UidMappings:                idmap,
		GidMappings:                idmap,
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		// Its own session: the sandbox outlives the node and must not get
		// the node's terminal signals.
		Setsid: true,
		// But until it is set up it dies with the node: a child the node
		// dies before configuring would wait forever. The init stage
		// clears this once configured.
		Pdeathsig: syscall.SIGKILL,
	}
	return cmd
}

// agentProcs is the GOMAXPROCS of the agent of a sandbox with limits l:
// its CPU limit in whole cores and at least 2, as Go's own default for a
// cgroup's limit, or 0 (Go's default) without one. The agent does not get
// that default by itself: on v1 it is born outside its cgroup, so Go
// counts the host's CPUs, and every P more is memory and threads for
// nothing in a sandbox held to its share. Not one P: the agent would then
// keep so few threads that, once a fork bomb in the sandbox holds every
// PID its limit allows, it needs a thread it cannot make, and Go ends the
// process (TestResourceExhaustion). A later change of the limit leaves the
// agent's as it was.
func agentProcs(l runtime.Limits) int {
	if l.CPU <= 0 {
		return 0
	}
	return max(2, int(math.Ceil(l.CPU)))
}

// Start implements runtime.Runtime, finishing a prepared process if there is
// one for spec.ID.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (inst runtime.Instance, err error) {
	start := time.Now()
	p := r.takePrepared(spec.ID)
	if p != nil && p.netns != netnsOf(spec) {
		r.log.Warn("prepared sandbox process is in another network namespace; starting afresh", "sandbox", spec.ID)
		r.kill(spec.ID, p)
		p = nil
	}
	if p != nil {
		if p.limits != spec.Limits {
			if err := p.cg.Update(resources(spec.Limits)); err != nil {
				r.kill(spec.ID, p)
				return inst, fmt.Errorf("setting limits: %w", err)
			}
		}
		inst, err = r.finish(ctx, spec, p, start)
		if !errors.Is(err, errNotConfigured) {
			return inst, err
		}
		// The prepared process died before it was used: start afresh.
		r.log.Warn("prepared sandbox process was gone", "sandbox", spec.ID, "err", err)
	}
	if p, err = r.prepare(spec); err != nil {
		return inst, err
	}
	return r.finish(ctx, spec, p, start)
}

// errNotConfigured marks a failure before the init stage got its
// configuration, after which a fresh start may succeed.
var errNotConfigured = errors.New("sandbox init not configured")

// finish configures prepared process p as sandbox spec and waits for its agent.
func (r *Runtime) finish(ctx context.Context, spec runtime.Spec, p *prepared, start time.Time) (inst runtime.Instance, err error) {
	defer func() {
		if err != nil {
			r.kill(spec.ID, p)
		} else {
			r.keepInit(spec.ID, inst, p.child)
		}
	}()
	defer p.ctl.Close()
	defer r.unmountStaging(p.dir)
	pid := p.child.Pid
	cfg, err := r.stageMounts(spec, p.dir, pid)
	if err != nil {
		return inst, fmt.Errorf("%w: %v", errNotConfigured, err)
	}
	cfg.NewCgroupNS = p.newCgroupNS
	cfg.Procs = agentProcs(spec.Limits)
	if err := nsinit.WriteConfig(p.ctl, cfg); err != nil {
		return inst, fmt.Errorf("%w: %v", errNotConfigured, err)
	}
	// The answer comes once the agent is about to serve on its socket.
	var st nsinit.Status
	if err := p.ctl.SetReadDeadline(time.Now().Add(runtime.AgentTimeout)); err != nil {
		return inst, err
	}
	if err := json.NewDecoder(p.ctl).Decode(&st); err != nil {
		return inst, fmt.Errorf("sandbox init: %w", err)
	}
	if st.Error != "" {
		return inst, fmt.Errorf("sandbox init: %s", st.Error)
	}
	st0, err := host.StartTime(pid)
	if err != nil {
		return inst, err
	}
	r.log.Debug("sandbox started", "sandbox", spec.ID, "pid", pid, "op", "start",
		"ms", float64(time.Since(start).Microseconds())/1000)
	return runtime.Instance{PID: pid, StartTime: st0, Socket: r.SocketPath(spec.ID)}, nil
}

// stageMounts makes id-mapped views of the layers under dir/mnt, mapped through
// the sandbox's user namespace: a file owned by 0 on disk is owned by the
// sandbox's root, and what the sandbox writes is stored with unshifted ids, so
// layers can be shared between sandboxes with different host ranges.
func (r *Runtime) stageMounts(spec runtime.Spec, dir string, pid int) (nsinit.Config, error) {
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nsinit.Config{}, fmt.Errorf("opening user namespace: %w", err)
	}
	defer unix.Close(userns)
	mnt := filepath.Join(dir, "mnt")
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o711); err != nil {
		return nsinit.Config{}, err
	}
	stage := func(src, name string, attr uint64) (string, error) {
		dst := filepath.Join(mnt, name)
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
		return dst, idmapMount(src, dst, userns, attr)
	}
	agentEnv, err := json.Marshal(spec.Env)
	if err != nil {
		return nsinit.Config{}, err
	}
	filter, err := seccompProgram()
	if err != nil {
		return nsinit.Config{}, err
	}
	cfg := nsinit.Config{
		Seccomp:  filter,
		Rootfs:   rootfs,
		Hostname: spec.Hostname,
		User:     spec.User,
		Workdir:  spec.Workdir,
		AgentEnv: string(agentEnv),
		Setuid:   spec.Setuid,
		Volatile: !r.fsync,
	}
	const ro = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID
	// The template's setuid programs (sudo) are on its layers; the ids
	// they raise to are the sandbox's own (the mount is id-mapped).
	layerAttr := uint64(ro)
	if spec.Setuid {
		layerAttr &^= unix.MOUNT_ATTR_NOSUID
	}
	lower, err := r.lowers.Mount(context.Background(), spec.Rootfs.Layers)
	if err != nil {
		return cfg, err
	}
	for i, l := range lower {
		p, err := stage(l, "l"+strconv.Itoa(i), layerAttr)
		if err != nil {
			return cfg, err
		}
		cfg.Lower = append(cfg.Lower, p)
	}
	if cfg.Upper, err = stage(spec.Rootfs.Writable, "upper", 0); err != nil {
		return cfg, err
	}
	for i, b := range spec.Rootfs.Binds {
		p, err := stage(b.Source, "b"+strconv.Itoa(i), ro)
		if err != nil {
			return cfg, err
		}
		cfg.Binds = append(cfg.Binds, nsinit.Bind{Source: p, Target: b.Target})
	}
	if spec.Network != nil {
		netDir := filepath.Join(dir, "net")
		if err := writeNetworkFiles(netDir, spec); err != nil {
			return cfg, err
		}
		staged, err := stage(netDir, "net", ro)
		if err != nil {
			return cfg, err
		}
		cfg.Net = &nsinit.Net{Files: staged}
	}
	// sysfs shows the network devices of the namespace its mounter is in,
	// and only the namespace's owner may mount it: the node made the
	// sandbox's, so it mounts it here, from inside.
	sys := filepath.Join(mnt, "sys")
	if err := os.Mkdir(sys, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return cfg, err
	}
	mountSys := func() error {
		return unix.Mount("sysfs", sys, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	}
	switch lonet := r.lonets.of(spec.ID); {
	case spec.Network != nil:
		err = netns.Run(spec.Network.Netns, mountSys)
	case lonet != nil:
		err = netns.RunFd(int(lonet.Fd()), mountSys)
	default:
		return cfg, nil // its own namespace: it mounts its own
	}
	if err != nil {
		return cfg, fmt.Errorf("mounting sysfs of the sandbox's network: %w", err)
	}
	cfg.Sys = sys
	return cfg, nil
}

// writeNetworkFiles writes the resolv.conf and hosts that are mounted over
// the sandbox's own.
func writeNetworkFiles(dir string, spec runtime.Spec) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, content := range map[string]string{"resolv.conf": spec.Network.ResolvConf(), "hosts": spec.Network.Hosts(spec.Hostname)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// idmapMount mounts a clone of src at dst, id-mapped through userns and with
// the extra mount attributes attr.
func idmapMount(src, dst string, userns int, attr uint64) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	ma := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attr, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, ma); err != nil {
		return fmt.Errorf("id-mapping %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s: %w", src, err)
	}
	return nil
}

// unmountStaging detaches the id-mapped staging mounts and the staging mount
// itself; the sandbox's overlay keeps its own references to the layers.
func (r *Runtime) unmountStaging(dir string) {
	// One lazy unmount of the staging mount takes the id-mapped mounts under
	// it along: each unmount call waits for an RCU grace period, which costs
	// milliseconds when sandboxes start side by side.
	mnt := filepath.Join(dir, "mnt")
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		r.log.Warn("unmounting staging mount", "path", mnt, "err", err)
	}
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string, inst runtime.Instance) error {
	cg, err := r.loadCgroup(id)
	if err == nil {
		// Frozen processes cannot die: thaw a paused sandbox first.
		_ = cg.Thaw()
	}
	// PID 1 of the sandbox's PID namespace: when it is gone, the kernel
	// has killed the rest.
	if c := r.takeInit(id, inst); c != nil {
		if c.Kill() == nil {
			c.Wait(5 * time.Second)
		}
		_ = c.Release()
	} else if r.Alive(inst) {
		_ = host.KillAndWait(inst.PID, 5*time.Second)
	}
	return r.cleanup(id, cg, err, true)
}

// Cleanup implements runtime.Runtime.
func (r *Runtime) Cleanup(ctx context.Context, id string) error {
	cg, err := r.loadCgroup(id)
	return r.cleanup(id, cg, err, false)
}

// cleanup is Cleanup with the sandbox's cgroup loaded (cg, or the error
// loading it gave), thawed already if thawed (by Stop, which nothing
// freezes after).
func (r *Runtime) cleanup(id string, cg *cgroup.Cgroup, cgErr error, thawed bool) error {
	r.mu.Lock()
	r.dropInitLocked(id)
	r.mu.Unlock()
	if p := r.takePrepared(id); p != nil {
		p.ctl.Close()
		_ = p.child.Release()
	}
	var errs []error
	ended := false // every process of the sandbox is gone
	if cgErr == nil {
		if !thawed {
			_ = cg.Thaw()
		}
		if err := cg.KillAll(10 * time.Second); err != nil {
			errs = append(errs, err)
		} else {
			ended = true
			if err := cg.Delete(); err != nil {
				errs = append(errs, fmt.Errorf("deleting cgroup: %w", err))
			}
		}
	}
	r.lonets.release(id, ended)
	return errors.Join(append(errs, r.cleanupDir(id))...)
}

// cleanupDir unmounts what is left under sandbox id's run directory and
// removes it.
func (r *Runtime) cleanupDir(id string) error {
	return host.RemoveDir(r.runDir(id))
}

// Pause implements runtime.Runtime with the cgroup freezer.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	cg, err := r.loadCgroup(id)
	if err != nil {
		return fmt.Errorf("loading cgroup: %w", err)
	}
	return cg.Freeze()
}

// Resume implements runtime.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	cg, err := r.loadCgroup(id)
	if err != nil {
		return fmt.Errorf("loading cgroup: %w", err)
	}
	return cg.Thaw()
}

// Processes implements runtime.Runtime from the sandbox's cgroup.
func (r *Runtime) Processes(ctx context.Context, id string) (int, error) {
	cg, err := r.loadCgroup(id)
	if err != nil {
		return 0, err
	}
	pids, err := cg.PIDs()
	return len(pids), err
}

// Usage implements runtime.Meter from the sandbox's cgroup, which holds
// every process of it; its page cache (tmpfs files too) is not counted as
// used, as envd does not count the kernel's in an E2B sandbox.
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	u, err := cgroup.ReadUsage(r.cgroupPath(id))
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("reading cgroup: %w", err)
	}
	return runtime.Usage{CPU: u.CPU, MemoryBytes: max(u.MemoryBytes-u.FileBytes, 0), CacheBytes: u.FileBytes}, nil
}

// Update implements runtime.Runtime.
func (r *Runtime) Update(ctx context.Context, id string, l runtime.Limits) error {
	cg, err := r.loadCgroup(id)
	if err != nil {
		return fmt.Errorf("loading cgroup: %w", err)
	}
	return cg.Update(resources(l))
}

// Alive implements runtime.Runtime.
func (r *Runtime) Alive(inst runtime.Instance) bool {
	r.mu.Lock()
	if c, ok := r.inits[keyOf(inst)]; ok {
		// Under the lock: a Stop closing the pidfd meanwhile would leave
		// its number free for another file.
		exited := c.Wait(0)
		r.mu.Unlock()
		return !exited
	}
	r.mu.Unlock()
	return host.Alive(inst.PID, inst.StartTime)
}
