// Package gvisor runs sandboxes under gVisor's runsc, a user-space kernel
// between the sandbox's processes and the host: a second wall for code nobody
// reviewed. Each sandbox is an OCI bundle whose root is the same overlay of
// template layers and writable layer the ns runtime builds, and whose one
// process is atoll-agent, found at /dev/.atoll/atoll-agent through a read-only
// bind of the host's binary.
//
// The agent cannot be handed a listening socket (the sentry accepts only on
// sockets it bound itself), so it binds one in a small host tmpfs that the
// sandbox sees at /dev/.atoll/sock, with runsc's --host-uds; the node
// connects to the same file from the host. Limits go through the OCI spec:
// cpu and memory to the host cgroup runsc makes, the process count as
// RLIMIT_NPROC inside the sentry (the host cgroup counts the sentry's own
// threads and ptrace stubs, so it only gets a generous backstop).
//
// runsc keeps its state under RunRoot/state and the sandbox's processes are
// not children of the node, so sandboxes outlive a node restart and are
// re-adopted by PID and start time like ns's.
package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
	"github.com/atoll-dev/atoll/internal/runtime/host"
	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
)

// Config configures the gvisor runtime.
type Config struct {
	// RunRoot holds runsc's state (state/) and one directory per sandbox:
	// its bundle, root mount, agent socket and log.
	RunRoot string
	// Runsc is the runsc binary; empty means "runsc" on PATH.
	Runsc string
	// Platform is runsc's --platform; empty means the first of systrap,
	// kvm and ptrace that this runsc offers and that runs a probe sandbox.
	Platform string
	// PlatformCache, if set, is a file that remembers the probe's choice
	// for this runsc and host, so that only the first start after a boot
	// probes (a kvm probe in a nested guest can hang until its timeout).
	// Put it on a tmpfs such as /run: a reboot may change what works.
	PlatformCache string
	// Lowers builds and mounts the template layers' images, shared with the
	// other runtimes of the node; nil makes one in RunRoot/lowers.
	Lowers *lowers.Images
	// CgroupParent is where runsc makes each sandbox's host cgroup,
	// default /atoll-gvisor. Servers that share a host each need their own.
	CgroupParent string
	// SandboxFsync makes fsync and syncfs inside a sandbox reach the disk,
	// as ns.Config.SandboxFsync does.
	SandboxFsync bool
	Logger       *slog.Logger
}

// ErrNoRunsc is New's error when runsc is not installed.
var ErrNoRunsc = errors.New("runsc (gVisor) is not installed")

// Runtime is the gvisor backend.
type Runtime struct {
	runRoot  string
	cgParent string // Config.CgroupParent
	runsc    string
	fsync    bool // Config.SandboxFsync
	platform string
	version  string
	// flags go before every runsc subcommand.
	flags []string
	log   *slog.Logger
	// lowers are the templates' merged images the sandboxes' roots stack on.
	lowers *lowers.Images
}

var (
	_ runtime.Runtime           = (*Runtime)(nil)
	_ runtime.Capabler          = (*Runtime)(nil)
	_ runtime.Checkpointer      = (*Runtime)(nil)
	_ runtime.CheckpointSettler = (*Runtime)(nil)
)

// Where the sandbox sees what the node puts there. /dev is the sentry's own
// tmpfs, so nothing here shows in the sandbox's root directory, and the
// mountpoints runsc's gofer creates for them in the writable layer (an empty
// dev/.atoll/) stay hidden under it.
const (
	agentDir    = "/dev/.atoll"
	agentInside = agentDir + "/" + launch.Name
	sockInside  = agentDir + "/sock"
	sockName    = "agent.sock"
)

// New finds runsc, checks what it supports and picks a platform. It fails
// when runsc is missing or cannot run a sandbox here; the node then does not
// offer this runtime.
func New(cfg Config) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the gvisor runtime needs root")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	bin := cfg.Runsc
	if bin == "" {
		bin = "runsc"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, ErrNoRunsc
	}

	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	r := &Runtime{runRoot: cfg.RunRoot, cgParent: cfg.CgroupParent, fsync: cfg.SandboxFsync, runsc: path, log: cfg.Logger}
	r.version = runscVersion(path)
	help, _ := exec.Command(path, "flags").CombinedOutput()
	flags := string(help)
	if err := os.MkdirAll(filepath.Join(cfg.RunRoot, "state"), 0o700); err != nil {
		return nil, err
	}
	if err := host.PrivateMount(cfg.RunRoot); err != nil {
		return nil, err
	}
	if r.lowers = cfg.Lowers; r.lowers == nil {
		if r.lowers, err = lowers.New(filepath.Join(cfg.RunRoot, "lowers"), cfg.Logger); err != nil {
			return nil, err
		}
	}
	r.flags = []string{"--root", filepath.Join(cfg.RunRoot, "state"), "--network=none"}
	// The agent binds its socket on the host (create). Open too: runsc
	// 2022 cannot even unlink a host socket file without it, so a program
	// that removes a stale socket before binding again would fail. Open
	// lets the sandbox connect to host sockets only inside its own mounts:
	// its root, read-only template directories such as /usr, and the
	// agent's directory.
	switch {
	case strings.Contains(flags, "-host-uds"):
		r.flags = append(r.flags, "--host-uds=all")
	case strings.Contains(flags, "-fsgofer-host-uds"):
		r.flags = append(r.flags, "--fsgofer-host-uds")
	default:
		return nil, fmt.Errorf("runsc %s cannot bind host unix sockets (no --host-uds)", r.version)
	}
	if strings.Contains(flags, "-overlay2") {
		// Writes must reach the writable layer, never a sentry-memory
		// overlay (newer runsc default to one).
		r.flags = append(r.flags, "--overlay2=none")
	}
	r.platform = cfg.Platform
	if r.platform == "" {
		r.platform, err = host.Remembered(cfg.PlatformCache, r.runsc+" "+r.version, func() (string, error) { return r.probePlatform(flags) })
		if err != nil {
			return nil, err
		}
	}
	r.flags = append(r.flags, "--platform="+r.platform)
	if d := os.Getenv("ATOLL_RUNSC_DEBUG"); d != "" {
		r.flags = append(r.flags, "--debug", "--strace", "--debug-log="+d+"/")
	}
	r.log.Info("gvisor runtime", "runsc", path, "version", r.version, "platform", r.platform)
	return r, nil
}

// runscVersion is what runsc at path says of its version, or, for a runsc
// built with go install (which says VERSION_MISSING), the version of
// gVisor's module it was built from.
func runscVersion(path string) string {
	out, _ := exec.Command(path, "--version").Output()
	v := strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "runsc version ")
	if v != "" && v != "VERSION_MISSING" {
		return v
	}
	if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return v
}

// probePlatform returns the fastest platform that runs `true` in a throwaway
// sandbox: systrap (runsc from mid-2023 on), kvm where /dev/kvm opens (it
// may still fail in a nested guest), and ptrace, which works wherever
// ptrace does.
func (r *Runtime) probePlatform(flags string) (string, error) {
	var candidates []string
	if strings.Contains(flags, "systrap") {
		candidates = append(candidates, "systrap")
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		candidates = append(candidates, "kvm")
	}
	candidates = append(candidates, "ptrace")
	if len(candidates) == 1 {
		// Nothing to choose: spare every node start a probe sandbox (a
		// second); a runsc that cannot run one fails each Start clearly.
		return candidates[0], nil
	}
	root, err := os.MkdirTemp(r.runRoot, "probe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(root)
	var errs []error
	for _, p := range candidates {
		// `runsc do true` takes about a second where the platform works.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, r.runsc, "--root", root, "--network=none", "--platform="+p, "do", "true")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil {
			return p, nil
		}
		errs = append(errs, fmt.Errorf("platform %s: %v: %s", p, err, host.LastLine(out)))
	}
	return "", fmt.Errorf("runsc runs no sandbox here: %w", errors.Join(errs...))
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "gvisor" }

// Platform is the runsc platform in use.
func (r *Runtime) Platform() string { return r.platform }

// PrepareLayers implements runtime.LayerPreparer: the layers' erofs images.
func (r *Runtime) PrepareLayers(ctx context.Context, layers []string) error {
	_, err := r.lowers.Mount(ctx, layers)
	return err
}

// PruneLayers implements runtime.LayerPruner.
func (r *Runtime) PruneLayers() { r.lowers.Prune() }

// Capabilities implements runtime.Capabler. runsc pauses in memory and
// checkpoints to disk, and a checkpoint restores under other IDs over
// copies of the files (a fork's children), taking up the network of the
// namespace it is restored in; the host cgroup's OOM killer may end the
// whole sandbox; the sentry, not the host kernel, serves the sandbox's
// system calls; its own network stack (netstack) runs over the sandbox's
// eth0 (--network=sandbox), so policy, firewall and ports apply as under ns.
func (r *Runtime) Capabilities() runtime.Caps {
	return runtime.Caps{Pause: true, MemorySnapshot: true, MemoryFork: true, Network: true}
}

func (r *Runtime) runDir(id string) string { return filepath.Join(r.runRoot, id) }

// SocketPath is the host path of sandbox id's agent socket.
func (r *Runtime) SocketPath(id string) string {
	return filepath.Join(r.runDir(id), "sock", sockName)
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	return r.start(ctx, spec, "")
}

// Restore implements runtime.Checkpointer: runsc restore from the image in
// dir, over the same files, then the agent takes its socket up again.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Instance, error) {
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return runtime.Instance{}, fmt.Errorf("no checkpoint image: %w", err)
	}
	return r.start(ctx, spec, dir)
}

// start runs spec afresh, or from the checkpoint image in image if set.
func (r *Runtime) start(ctx context.Context, spec runtime.Spec, image string) (inst runtime.Instance, err error) {
	t0 := time.Now()
	// What a crashed start or an unclean node exit left goes first: runsc
	// refuses an ID it still knows.
	if err := r.Cleanup(ctx, spec.ID); err != nil {
		return inst, fmt.Errorf("cleaning up before start: %w", err)
	}
	defer func() {
		if err != nil {
			_ = r.Cleanup(context.WithoutCancel(ctx), spec.ID)
		}
	}()
	dir := r.runDir(spec.ID)
	if err := r.prepareBundle(ctx, spec, dir); err != nil {
		return inst, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return inst, err
	}
	defer logFile.Close()
	pidFile := filepath.Join(dir, "sandbox.pid")
	// Without a network, runsc makes an empty namespace: loopback only.
	args := []string{"--network=none"}
	if spec.Network != nil {
		args = []string{"--network=sandbox"}
	}
	if spec.Setuid {
		// The sentry ignores setuid bits unless told (and unless the
		// spec's noNewPrivileges, which spec() leaves off then).
		args = append(args, "--allow-suid")
	}
	if image == "" {
		args = append(args, "run", "--detach")
	} else {
		args = append(args, "restore", "--detach", "--image-path", image)
	}
	args = append(args, "--bundle", dir, "--pid-file", pidFile, spec.ID)
	// The sandbox inherits runsc's stdio as its agent's: the log file, never
	// a pipe of ours, which would stay open as long as the sandbox runs.
	if err := r.run(ctx, logFile, args...); err != nil {
		return inst, err
	}
	pid, err := host.ReadPID(pidFile)
	if err != nil {
		return inst, err
	}
	st, err := host.StartTime(pid)
	if err != nil {
		return inst, fmt.Errorf("sandbox process: %w", err)
	}
	if image != "" {
		// The restored agent let go of its socket before the checkpoint.
		if err := r.run(ctx, nil, "kill", spec.ID, strconv.Itoa(int(agent.ListenSignal))); err != nil {
			return inst, err
		}
	}
	sock := r.SocketPath(spec.ID)
	if err := waitForAgent(ctx, sock, pid); err != nil {
		return inst, fmt.Errorf("%w (log: %s)", err, host.LastLine([]byte(host.Tail(filepath.Join(dir, "agent.log")))))
	}
	if err := sealSocketDir(dir, true); err != nil {
		return inst, err
	}
	r.log.Debug("sandbox started", "sandbox", spec.ID, "pid", pid, "op", "start",
		"restored", image != "", "ms", float64(time.Since(t0).Microseconds())/1000)
	return runtime.Instance{PID: pid, StartTime: st, Socket: sock}, nil
}

// prepareBundle mounts the sandbox's root and agent socket directory under
// dir and writes its OCI config.
func (r *Runtime) prepareBundle(ctx context.Context, spec runtime.Spec, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	rootfs := filepath.Join(dir, "rootfs")
	sock := filepath.Join(dir, "sock")
	if spec.Network != nil {
		if err := checkNetns(spec.Network.Netns); err != nil {
			return err
		}
		// resolv.conf and hosts, mounted read-only over the root's.
		for name, content := range map[string]string{"resolv.conf": spec.Network.ResolvConf(), "hosts": spec.Network.Hosts(spec.Hostname)} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{rootfs, sock} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	// The same overlay, with the same user.overlay.* whiteouts, that the ns
	// runtime mounts inside its user namespace: a writable layer or a
	// snapshot means the same under both.
	// Its lower layer is the template's merged image: with the layers
	// themselves the sentry would take some files for others (package
	// lowers says why).
	lower, err := r.lowers.Mount(ctx, spec.Rootfs.Layers)
	if err != nil {
		return err
	}
	if err := overlay.Mount(rootfs, overlay.Options{
		Lower: lower, Upper: filepath.Join(spec.Rootfs.Writable, "upper"), Work: filepath.Join(spec.Rootfs.Writable, "work"),
		UserXattr: true, Xino: true, NoDev: true, NoSuid: true, Volatile: !r.fsync,
	}); err != nil {
		return fmt.Errorf("mounting overlay root: %w", err)
	}
	// A tmpfs of its own for the socket, sealed once the agent listens
	// (sealSocketDir): until then the sandbox could write here, and it
	// must not fill a host file system doing so.
	if err := unix.Mount("tmpfs", sock, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,nr_inodes=16,mode=0700"); err != nil {
		return fmt.Errorf("mounting socket directory: %w", err)
	}
	cfg, err := r.ociSpec(spec, dir, rootfs, sock)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// subcommand is the runsc subcommand in args, after any flags.
func subcommand(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// checkNetns makes sure the namespace at path has an eth0 with addresses
// for runsc to take: runsc moves them from the host's interface into its
// own stack, so a namespace a sandbox ran in before has none left.
func checkNetns(path string) error {
	return netns.Run(path, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("the sandbox's network has no eth0: %w", err)
		}
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) == 0 {
			return errors.New("the sandbox's eth0 has no address: its network was used by another runsc")
		}
		return nil
	})
}

// run runs one runsc subcommand; out, if not nil, gets its stdout and stderr
// (and, for run and restore, the sandbox's).
func (r *Runtime) run(ctx context.Context, out *os.File, args ...string) error {
	cmd := exec.CommandContext(ctx, r.runsc, append(append([]string{}, r.flags...), args...)...)
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	var buf bytes.Buffer
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		cmd.Stdout, cmd.Stderr = &buf, &buf
	}
	if err := cmd.Run(); err != nil {
		msg := buf.String()
		if out != nil {
			msg = host.Tail(out.Name())
		}
		return fmt.Errorf("runsc %s: %w: %s", subcommand(args), err, host.LastLine([]byte(msg)))
	}
	return nil
}

// output runs one runsc subcommand and returns its stdout.
func (r *Runtime) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.runsc, append(append([]string{}, r.flags...), args...)...)
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, host.LastLine(append(stderr.Bytes(), out...)))
	}
	return out, nil
}

// waitForAgent waits until the agent accepts on sock, giving up early if
// the sandbox process pid dies.
func waitForAgent(ctx context.Context, sock string, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, runtime.AgentTimeout)
	defer cancel()
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err == nil {
			c.Close()
			return nil
		}
		if _, serr := host.StartTime(pid); serr != nil {
			return errors.New("sandbox exited before its agent listened")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent did not listen within %v: %v", runtime.AgentTimeout, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string, inst runtime.Instance) error {
	// runsc delete --force kills a running or paused sandbox and forgets it.
	_ = r.run(ctx, nil, "delete", "--force", id)
	if r.Alive(inst) {
		// runsc has lost track of it (its state is gone): kill it by PID.
		_ = host.KillAndWait(inst.PID, 5*time.Second)
	}
	return r.Cleanup(ctx, id)
}

// Cleanup implements runtime.Runtime: whatever runsc still knows of id, the
// processes and cgroups it left, and the bundle's mounts and directory.
func (r *Runtime) Cleanup(ctx context.Context, id string) error {
	var errs []error
	if r.known(id) {
		if err := r.run(ctx, nil, "delete", "--force", id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, host.RemoveDir(r.runDir(id)))
	return errors.Join(errs...)
}

// known reports whether runsc has state for container id.
func (r *Runtime) known(id string) bool {
	ents, err := os.ReadDir(filepath.Join(r.runRoot, "state"))
	if err != nil {
		return false
	}
	for _, e := range ents {
		// runsc names its files after the container ID (id_sandbox:id.state
		// and lock files), or a directory id in older versions.
		if e.Name() == id || strings.HasPrefix(e.Name(), id+"_") {
			return true
		}
	}
	return false
}

// Pause implements runtime.Runtime with runsc pause: the sentry stops every
// task, memory stays.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.run(ctx, nil, "pause", id)
}

// Resume implements runtime.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.run(ctx, nil, "resume", id)
}

// Processes implements runtime.Runtime from the sentry's process table.
func (r *Runtime) Processes(ctx context.Context, id string) (int, error) {
	out, err := r.output(ctx, "ps", "--format", "json", id)
	if err != nil {
		return 0, err
	}
	var ps []json.RawMessage
	if err := json.Unmarshal(out, &ps); err != nil {
		return 0, fmt.Errorf("parsing runsc ps: %w", err)
	}
	return len(ps), nil
}

// Usage implements runtime.Meter from the sandbox's host cgroup, which
// runsc's sandbox, gofer and platform stubs share: the CPU they use on the
// sandbox's behalf is its CPU, and its memory is what the cgroup is
// charged less the host's page cache. Not less shared memory, as for ns:
// the sentry keeps the sandbox's memory, its own page cache included, in a
// memory file, which the host counts as shared memory. So used includes
// the sentry's own (as a VM's includes its guest kernel's).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	u, err := cgroup.ReadUsage(r.cgroupPath(id))
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("reading cgroup: %w", err)
	}
	cache := max(u.FileBytes-u.ShmemBytes, 0)
	return runtime.Usage{CPU: u.CPU, MemoryBytes: max(u.MemoryBytes-cache, 0), CacheBytes: cache}, nil
}

// Alive implements runtime.Runtime: inst.PID is runsc's sandbox process,
// which lives exactly as long as the sandbox.
func (r *Runtime) Alive(inst runtime.Instance) bool {
	return host.Alive(inst.PID, inst.StartTime)
}

// Settle implements runtime.CheckpointSettler: the agent listens again.
func (r *Runtime) Settle(ctx context.Context, id string, inst runtime.Instance) error {
	if !r.Alive(inst) {
		return errors.New("sandbox is not running")
	}
	// The agent ignores ListenSignal while it listens. A checkpoint still
	// under way keeps the sentry's control server busy: runsc kill is
	// refused until it ends, and then the sentry either runs on or exits.
	for deadline := time.Now().Add(15 * time.Second); ; {
		err := r.relisten(ctx, id, inst)
		if err == nil {
			return nil
		}
		if !r.Alive(inst) {
			return errors.New("sandbox is not running: its checkpoint ended it")
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Checkpoint implements runtime.Checkpointer with runsc checkpoint. The
// sentry cannot save a socket bound on the host, so the agent first lets go
// of its own; a sandbox whose processes bound other unix sockets on its
// file system (which --host-uds=create also puts on the host) is refused
// rather than lost, since a failed runsc checkpoint ends the sandbox.
func (r *Runtime) Checkpoint(ctx context.Context, id string, inst runtime.Instance, imageDir string) error {
	if !r.Alive(inst) {
		return errors.New("sandbox is not running")
	}
	if bound := r.hostSockets(inst.PID, id); len(bound) > 0 {
		return fmt.Errorf("%d unix sockets bound on the sandbox's file system (first %s) cannot be checkpointed", len(bound), bound[0])
	}
	if err := r.release(ctx, id, inst); err != nil {
		return err
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		_ = r.relisten(ctx, id, inst)
		return err
	}
	if err := r.run(ctx, nil, "checkpoint", "--image-path", imageDir, id); err != nil {
		if r.Alive(inst) {
			_ = r.relisten(ctx, id, inst)
		}
		return err
	}
	// The sandbox has exited; release what it held.
	return r.Stop(ctx, id, inst)
}

// release makes the agent let go of its socket, its processes running on.
func (r *Runtime) release(ctx context.Context, id string, inst runtime.Instance) error {
	dir := r.runDir(id)
	if err := sealSocketDir(dir, false); err != nil {
		return err
	}
	if err := r.run(ctx, nil, "kill", id, strconv.Itoa(int(agent.ReleaseSignal))); err != nil {
		_ = sealSocketDir(dir, true)
		return err
	}
	if err := waitGone(ctx, r.SocketPath(id), inst.PID); err != nil {
		_ = r.relisten(ctx, id, inst)
		return fmt.Errorf("agent did not release its socket: %w", err)
	}
	return nil
}

// relisten undoes a release: the agent binds again, and only then is its
// directory sealed again.
func (r *Runtime) relisten(ctx context.Context, id string, inst runtime.Instance) error {
	if err := r.run(ctx, nil, "kill", id, strconv.Itoa(int(agent.ListenSignal))); err != nil {
		return err
	}
	if err := waitForAgent(ctx, r.SocketPath(id), inst.PID); err != nil {
		return err
	}
	return sealSocketDir(r.runDir(id), true)
}

// sealSocketDir makes the directory holding the agent's socket immutable,
// or lets the agent change it again. Sealed, no process in the sandbox can
// remove the agent's socket or bind one of its own in its place, posing as
// the agent to the node; the bound socket still accepts. The flag is on the
// directory's inode, so the gofer's view of it follows. (A read-only
// remount would do as much, but the kernel refuses it while an unlinked
// file is held open, and runsc's gofer holds every socket the agent ever
// bound until the sandbox exits.)
func sealSocketDir(dir string, sealed bool) error {
	const fsImmutable = 0x10 // FS_IMMUTABLE_FL of linux/fs.h, not in x/sys/unix
	f, err := os.Open(filepath.Join(dir, "sock"))
	if err != nil {
		return fmt.Errorf("sealing the agent's socket directory: %w", err)
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err == nil {
		if sealed {
			flags |= fsImmutable
		} else {
			flags &^= fsImmutable
		}
		err = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
	}
	if err != nil {
		return fmt.Errorf("sealing the agent's socket directory: %w", err)
	}
	return nil
}

// hostSockets lists the paths of the unix sockets bound on the host that
// sandbox process pid holds, other than its agent's.
func (r *Runtime) hostSockets(pid int, id string) []string {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	own := filepath.Join("/", sockInside, sockName)
	// The gofer binds them in its own network namespace: look in those of
	// every process of the sandbox, once each.
	seen := map[string]bool{}
	for _, p := range append([]int{pid}, r.cgroupPIDs(id)...) {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", p))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", p))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// Num RefCount Protocol Flags Type St Inode Path
			fields := strings.Fields(sc.Text())
			if len(fields) < 8 || !inodes[fields[6]] || strings.HasPrefix(fields[7], "@") {
				continue
			}
			inodes[fields[6]] = false // once, though in both tables
			if !strings.HasSuffix(fields[7], own) {
				out = append(out, fields[7])
			}
		}
		f.Close()
	}
	return out
}

// waitGone waits until path no longer exists.
func waitGone(ctx context.Context, path string, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if _, err := host.StartTime(pid); err != nil {
			return errors.New("sandbox exited")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
