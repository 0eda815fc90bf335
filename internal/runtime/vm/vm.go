// Package vm runs sandboxes as QEMU microVMs, each with a Linux kernel of
// its own between the sandbox's processes and the host. The guest kernel is
// the distribution's (Debian's linux-image package), booted directly (PVH
// from an uncompressed vmlinux, which the runtime extracts once) with an
// initramfs holding atoll-agent, which is PID 1 (package vminit).
//
// Disks: every read-only layer and bind of the template becomes an erofs
// image, built once and shared read-only by every VM over it; the sandbox's
// writable layer becomes an ext4 disk of its own, made from the layer's
// upper/ at start and copied back into it at stop and checkpoint, so that
// the layer store's writable layer stays the one thing that persists, the
// same under every runtime (snapshots, forks and archives read it). Inside,
// the guest stacks them as an overlay, with the same user.overlay.*
// whiteouts the ns runtime writes.
//
// The agent serves over a virtio-serial port whose QEMU chardev is a unix
// socket; a proxy (the agent binary, "vm-proxy") carries the node's many
// connections over it as yamux streams (package channel) and listens on the
// sandbox's agent socket. QEMU and the proxy are daemons of their own, not
// children of the node: sandboxes outlive a node restart and are re-adopted
// by QEMU's PID and start time.
//
// A sandbox with a network joins the namespace package network made for it
// through a tap device there, redirected to and from its eth0 (net.go).
//
// Pause is QMP stop and cont; a checkpoint is a migration of the stopped VM
// to a file, its writable disk kept beside it, and restore starts QEMU with
// -incoming from that file. KVM is used when a probe boot under it
// succeeds; otherwise TCG, which emulates the CPU: much slower, and not a
// security boundary.
package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
	"github.com/atoll-dev/atoll/internal/runtime/host"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// Config configures the vm runtime.
type Config struct {
	// RunRoot holds one directory per sandbox (its QEMU's sockets, pid
	// file, console log and writable disk) and cache/, the images shared
	// by every sandbox: the kernel, the initramfs and the layers' erofs
	// images.
	RunRoot string
	// QEMU is the qemu-system-x86_64 binary; empty means the one on PATH.
	QEMU string
	// Kernel is the guest kernel (a bzImage or vmlinux); empty means the
	// newest /boot/vmlinuz-* with modules in /lib/modules.
	Kernel string
	// Accel is "kvm" or "tcg"; empty means kvm if a probe boot under it
	// succeeds, else tcg.
	Accel string
	// AccelCache, if set, is a file that remembers the probe's choice for
	// this QEMU and kernel (in /run: until the host reboots), so that a
	// node restart does not wait for a KVM that hangs again.
	AccelCache string
	// CgroupParent is where each VM's QEMU gets a host cgroup of its own,
	// default /atoll-vm. Servers that share a host each need their own.
	CgroupParent string
	Logger       *slog.Logger
}

// Errors New returns when the runtime cannot be offered.
var (
	ErrNoQEMU   = errors.New("qemu-system-x86_64 is not installed (package qemu-system-x86)")
	ErrNoKernel = errors.New("no guest kernel (install linux-image-amd64)")
)

// Runtime is the vm backend.
type Runtime struct {
	runRoot  string
	cgParent string // Config.CgroupParent
	qemu     string
	bzImage  string // the kernel as installed
	once     sync.Once
	setupErr error
	kernel   string // what QEMU boots, set by setup
	modules  string // the kernel's /lib/modules directory
	accel    string
	// accelCache is Config.AccelCache.
	accelCache string
	tscKHz     int // the host's TSC rate, which a TCG guest cannot measure
	log        *slog.Logger

	buildMu sync.Mutex // held while building a cached image
}

var (
	_ runtime.Runtime           = (*Runtime)(nil)
	_ runtime.Capabler          = (*Runtime)(nil)
	_ runtime.Checkpointer      = (*Runtime)(nil)
	_ runtime.CheckpointSettler = (*Runtime)(nil)
)

// Files in a sandbox's run directory.
const (
	qmpName     = "qmp.sock"
	chanName    = "chan.sock"
	sockName    = "agent.sock"
	pidName     = "qemu.pid"
	proxyPID    = "proxy.pid"
	consoleName = "console.log"
	proxyLog    = "proxy.log"
	initrdName  = "initrd.img"
	diskName    = "writable.img"
	bootedName  = "booted" // the disk holds what a guest wrote
	machineName = "machine.json"
)

// memoryName holds a checkpoint's memory in the caller's directory, beside
// the disk and machine description it needs.
const memoryName = "memory"

// Guest memory beyond the sandbox's limit, for the guest kernel, its page
// cache and the initramfs; and the memory of a sandbox without a limit.
const (
	guestOverhead = 192 << 20
	defaultMemory = 1 << 30
)

// tools are the commands that make a vm's disks, each with the Debian
// package that has it.
var tools = []struct{ cmd, pkg string }{
	{"mkfs.erofs", "erofs-utils"}, // the template's layers
	{"mkfs.ext4", "e2fsprogs"},    // the writable disk
	{"rsync", "rsync"},            // a stopped vm's files, back into its writable layer
}

// Packages are the Debian packages of the tools New looks for.
func Packages() []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.pkg)
	}
	return out
}

// New finds QEMU and a guest kernel and picks an accelerator. It fails when
// either is missing; the node then does not offer this runtime.
func New(cfg Config) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the vm runtime needs root")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	bin := cfg.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	qemu, err := exec.LookPath(bin)
	if err != nil {
		return nil, ErrNoQEMU
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t.cmd); err != nil {
			return nil, fmt.Errorf("%s is not installed (package %s)", t.cmd, t.pkg)
		}
	}
	kernel, modules := cfg.Kernel, ""
	if kernel == "" {
		if kernel, modules, err = findKernel(); err != nil {
			return nil, err
		}
	} else {
		modules = filepath.Join("/lib/modules", strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-"))
	}
	if _, err := os.Stat(kernel); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoKernel, err)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	r := &Runtime{runRoot: cfg.RunRoot, cgParent: cfg.CgroupParent, qemu: qemu, bzImage: kernel, modules: modules, accel: cfg.Accel, accelCache: cfg.AccelCache, log: cfg.Logger, tscKHz: hostTSCKHz()}
	if err := os.MkdirAll(r.cacheDir(), 0o700); err != nil {
		return nil, err
	}
	return r, nil
}

// setup prepares the kernel and picks the accelerator, once, on the first
// start: a node that never starts a VM spends nothing on them.
func (r *Runtime) setup() error {
	r.once.Do(func() {
		k, err := r.vmlinux(r.bzImage)
		if err != nil {
			r.setupErr = fmt.Errorf("preparing the guest kernel: %w", err)
			return
		}
		r.kernel = k
		if r.accel == "" {
			r.accel, _ = host.Remembered(r.accelCache, r.qemu+" "+r.bzImage, func() (string, error) { return r.probeAccel(), nil })
		}
		r.log.Info("vm runtime", "qemu", r.qemu, "kernel", r.kernel, "accel", r.accel)
	})
	return r.setupErr
}

// probeAccel boots the kernel under KVM with no root to mount: it panics
// and QEMU exits within seconds where KVM works. /dev/kvm existing is not
// enough: in a nested guest it may open and still not run a VM.
func (r *Runtime) probeAccel() string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	// Where KVM works the kernel panics (no root) within a second or two.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.qemu, "-M", "microvm,accel=kvm", "-cpu", "host", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", r.kernel, "-append", "console=ttyS0 panic=-1 quiet")
	cmd.WaitDelay = time.Second
	out, _ := cmd.CombinedOutput()
	if bytes.Contains(out, []byte("Kernel panic")) {
		return "kvm"
	}
	r.log.Info("kvm does not boot a guest here; using tcg", "out", host.LastLine(out))
	return "tcg"
}

// hostTSCKHz is the host's processor clock from /proc/cpuinfo, 0 if unknown.
func hostTSCKHz() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(f * 1000)
			}
		}
	}
	return 0
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "vm" }

// Accel is the accelerator in use: "kvm" or "tcg" (probed on first use).
func (r *Runtime) Accel() string {
	_ = r.setup()
	return r.accel
}

// emulated reports whether VMs run under TCG: without a /dev/kvm to open
// they do; with one, the accelerator probe (run once, on first use) says.
func (r *Runtime) emulated() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return true
	}
	f.Close()
	return r.Accel() == "tcg"
}

// PrepareLayers implements runtime.LayerPreparer: the layers' erofs disk
// images (for a sandbox without binds).
func (r *Runtime) PrepareLayers(ctx context.Context, layers []string) error {
	for _, ls := range diskLayers(layers, maxLayerDisks) {
		if _, err := r.diskImage(ctx, ls); err != nil {
			return err
		}
	}
	return nil
}

// diskImage is the image of one disk's layers (diskLayers).
func (r *Runtime) diskImage(ctx context.Context, layers []string) (string, error) {
	if len(layers) == 1 {
		return r.layerImage(ctx, layers[0], false)
	}
	return r.mergedImage(ctx, layers)
}

// maxLayerDisks is how many read-only disks (layers and binds) a machine
// gets: a microvm has 24 virtio-mmio transports, and the agent's channel,
// the writable disk and the network take one each.
const maxLayerDisks = 21

// diskLayers groups layers (top first) into at most n disks, a disk each
// while they fit; past that the bottom ones share one disk, an image of
// their overlay, so the template's upper layers stay shared with others.
func diskLayers(layers []string, n int) [][]string {
	n = max(n, 1)
	var out [][]string
	for i, l := range layers {
		if len(layers) > n && i == n-1 {
			return append(out, layers[i:])
		}
		out = append(out, []string{l})
	}
	return out
}

// Capabilities implements runtime.Capabler. The guest's own cgroup kills a
// process over the memory limit and the sandbox lives on; the sandbox's
// processes call the guest's kernel, not the host's; a checkpoint restores
// under another ID over a copy of its disk (a fork's child), and a restored
// guest takes up the addresses and hostname it is restored with.
func (r *Runtime) Capabilities() runtime.Caps {
	return runtime.Caps{Pause: true, MemorySnapshot: true, MemoryFork: true, ProcessOOM: true, Network: true, Emulated: r.emulated()}
}

func (r *Runtime) cacheDir() string            { return filepath.Join(r.runRoot, "cache") }
func (r *Runtime) runDir(id string) string     { return filepath.Join(r.runRoot, "sandboxes", id) }
func (r *Runtime) file(id, name string) string { return filepath.Join(r.runDir(id), name) }

// SocketPath is the host path of sandbox id's agent socket.
func (r *Runtime) SocketPath(id string) string { return r.file(id, sockName) }

// bootTimeout bounds a start: a TCG guest takes seconds to boot, and a
// loaded host many more.
func (r *Runtime) bootTimeout() time.Duration {
	if r.accel == "kvm" {
		return 30 * time.Second
	}
	return 3 * time.Minute
}

// machine is what QEMU is started with; a checkpoint keeps it, since the
// incoming QEMU must be configured as the one that saved the state was.
type machine struct {
	// ID is the sandbox's whose disks these are; a checkpoint restored
	// under another ID (a fork's child) copies the writable disk.
	ID       string     `json:"id,omitempty"`
	Accel    string     `json:"accel"`
	VCPUs    int        `json:"vcpus"`
	MemoryMB int64      `json:"memory_mb"`
	Disks    []diskSpec `json:"disks"`
	// MAC is the guest's network device's, "" without a network.
	MAC string `json:"mac,omitempty"`
}

type diskSpec struct {
	Serial   string `json:"serial"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	inst, err := r.start(ctx, spec, "")
	if err != nil {
		return inst, fmt.Errorf("booting vm %s: %w", spec.ID, err)
	}
	return inst, nil
}

// Restore implements runtime.Checkpointer.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Instance, error) {
	for _, f := range []string{memoryName, diskName, initrdName, machineName} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return runtime.Instance{}, fmt.Errorf("restoring vm %s: incomplete checkpoint: %w", spec.ID, err)
		}
	}
	inst, err := r.start(ctx, spec, dir)
	if err != nil {
		return inst, fmt.Errorf("restoring vm %s: %w", spec.ID, err)
	}
	return inst, nil
}

func (r *Runtime) start(ctx context.Context, spec runtime.Spec, image string) (inst runtime.Instance, err error) {
	t0 := time.Now()
	if err := r.setup(); err != nil {
		return inst, err
	}
	if !validID(spec.ID) {
		return inst, fmt.Errorf("%w: sandbox id %q", errdefs.ErrInvalid, spec.ID)
	}
	if err := r.Cleanup(ctx, spec.ID); err != nil {
		return inst, fmt.Errorf("cleaning up before start: %w", err)
	}
	defer func() {
		if err != nil {
			_ = r.Cleanup(context.WithoutCancel(ctx), spec.ID)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, r.bootTimeout())
	defer cancel()
	dir := r.runDir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return inst, err
	}
	var m machine
	if image != "" {
		if m, err = r.prepareRestore(ctx, spec, dir, image); err != nil {
			return inst, err
		}
		if (m.MAC != "") != (spec.Network != nil) {
			return inst, fmt.Errorf("%w: the checkpoint was made with a network and restored without one, or the other way round", errdefs.ErrInvalid)
		}
	}
	var gnet *vminit.Net
	netns := ""
	if spec.Network != nil {
		netns = spec.Network.Netns
		if err := os.WriteFile(filepath.Join(dir, netnsName), []byte(netns), 0o600); err != nil {
			return inst, err
		}
		if gnet, err = plumb(spec.Network, spec.Hostname); err != nil {
			return inst, err
		}
	}
	if image == "" {
		if m, err = r.prepare(ctx, spec, dir, gnet); err != nil {
			return inst, err
		}
	}
	args := r.qemuArgs(spec.ID, dir, m)
	if image != "" {
		// No announcements after the migration: QEMU's own (RARP frames
		// from the device's MAC) and the guest's would come from the MAC
		// the guest was saved with, the parent's for a fork's child, and
		// teach the bridge that the parent is behind the child's port.
		// The guest takes its own slot's MAC when it is readdressed.
		args = append(args, "-global", "migration.announce-rounds=0",
			"-incoming", "exec:cat "+shellQuote(filepath.Join(image, memoryName)))
	}
	if err := r.runQEMU(ctx, spec.ID, dir, netns, spec.Limits, args); err != nil {
		return inst, err
	}
	pid, err := host.ReadPID(filepath.Join(dir, pidName))
	if err != nil {
		return inst, err
	}
	if image != "" {
		if err := finishIncoming(ctx, filepath.Join(dir, qmpName)); err != nil {
			return inst, err
		}
	}
	st, err := host.StartTime(pid)
	if err != nil {
		return inst, fmt.Errorf("qemu exited (console: %s)", consoleError(filepath.Join(dir, consoleName)))
	}
	if err := r.startProxy(ctx, spec.AgentPath, dir); err != nil {
		return inst, fmt.Errorf("%w (console: %s)", err, consoleError(filepath.Join(dir, consoleName)))
	}
	if err := os.WriteFile(filepath.Join(dir, bootedName), nil, 0o600); err != nil {
		return inst, err
	}
	if image != "" {
		r.setClock(ctx, spec.ID)
		// The namespace is made anew for every start: its addresses may
		// not be those the guest was saved with (a fork's child's are not).
		if gnet != nil {
			if err := r.guestCall(ctx, spec.ID, http.MethodPut, vminit.NetPath, gnet, nil); err != nil {
				return inst, fmt.Errorf("giving the restored guest its network: %w", err)
			}
		}
	}
	r.log.Debug("sandbox started", "sandbox", spec.ID, "pid", pid, "op", "start", "accel", r.accel,
		"restored", image != "", "ms", float64(time.Since(t0).Microseconds())/1000)
	return runtime.Instance{PID: pid, StartTime: st, Socket: r.SocketPath(spec.ID)}, nil
}

// prepare makes what a fresh boot needs: the layer images, the writable
// disk and the initramfs with the sandbox's config.
func (r *Runtime) prepare(ctx context.Context, spec runtime.Spec, dir string, gnet *vminit.Net) (machine, error) {
	m := machine{ID: spec.ID, Accel: r.accel, VCPUs: vcpus(spec.Limits.CPU), MemoryMB: memoryMB(spec.Limits.MemoryBytes)}
	if gnet != nil {
		m.MAC = gnet.MAC
	}
	cfg := vminit.Config{
		Hostname: spec.Hostname, Writable: "rw", Env: spec.Env, User: spec.User, Workdir: spec.Workdir, Setuid: spec.Setuid, Net: gnet,
		Limits: vminit.Limits{CPU: spec.Limits.CPU, MemoryBytes: spec.Limits.MemoryBytes, PIDs: spec.Limits.PIDs},
	}
	disk := filepath.Join(dir, diskName)
	if err := os.WriteFile(filepath.Join(dir, "writable"), []byte(spec.Rootfs.Writable), 0o600); err != nil {
		return m, err
	}
	if err := makeWritableDisk(ctx, disk, spec.Rootfs.Writable); err != nil {
		return m, err
	}
	m.Disks = append(m.Disks, diskSpec{Serial: "rw", Path: disk})
	for i, ls := range diskLayers(spec.Rootfs.Layers, maxLayerDisks-len(spec.Rootfs.Binds)) {
		img, err := r.diskImage(ctx, ls)
		if err != nil {
			return m, err
		}
		serial := "l" + strconv.Itoa(i)
		m.Disks = append(m.Disks, diskSpec{Serial: serial, Path: img, ReadOnly: true})
		cfg.Layers = append(cfg.Layers, serial)
	}
	for i, b := range spec.Rootfs.Binds {
		img, err := r.layerImage(ctx, b.Source, true)
		if err != nil {
			return m, err
		}
		serial := "b" + strconv.Itoa(i)
		m.Disks = append(m.Disks, diskSpec{Serial: serial, Path: img, ReadOnly: true})
		cfg.Binds = append(cfg.Binds, vminit.Bind{Serial: serial, Target: b.Target})
	}
	base, err := r.baseInitrd(spec.AgentPath)
	if err != nil {
		return m, fmt.Errorf("building the initramfs: %w", err)
	}
	if err := writeInitrd(filepath.Join(dir, initrdName), base, cfg); err != nil {
		return m, err
	}
	return m, writeJSON(filepath.Join(dir, machineName), m)
}

// prepareRestore takes a checkpoint's disk, initramfs and machine back into
// the run directory.
func (r *Runtime) prepareRestore(ctx context.Context, spec runtime.Spec, dir, image string) (machine, error) {
	var m machine
	b, err := os.ReadFile(filepath.Join(image, machineName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parsing the checkpoint's machine: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "writable"), []byte(spec.Rootfs.Writable), 0o600); err != nil {
		return m, err
	}
	if m.Accel != r.accel {
		return m, fmt.Errorf("the checkpoint was made under %s, this node runs %s", m.Accel, r.accel)
	}
	for i, d := range m.Disks {
		if d.ReadOnly {
			// Only images this runtime built: a checkpoint naming any
			// other file would show it to the guest.
			if filepath.Dir(d.Path) != r.cacheDir() || !strings.HasSuffix(d.Path, ".erofs") {
				return m, fmt.Errorf("%w: the checkpoint names a disk that is not a layer image", errdefs.ErrInvalid)
			}
			if _, err := os.Stat(d.Path); err != nil {
				return m, fmt.Errorf("the checkpoint's layer image is gone: %w", err)
			}
			continue
		}
		disk := filepath.Join(dir, diskName)
		moved, err := takeDisk(ctx, filepath.Join(image, diskName), disk, m.ID == spec.ID)
		if err != nil {
			return m, err
		}
		if moved {
			if err := os.WriteFile(filepath.Join(dir, "restored-from"), []byte(image), 0o600); err != nil {
				return m, err
			}
		}
		m.Disks[i].Path = disk
	}
	m.ID = spec.ID
	if err := run(ctx, "cp", filepath.Join(image, initrdName), filepath.Join(dir, initrdName)); err != nil {
		return m, err
	}
	return m, writeJSON(filepath.Join(dir, machineName), m)
}

// takeDisk gives a restore the checkpoint's writable disk at from. Its own
// checkpoint's disk moves (the checkpoint's copy would be stale as soon as
// the guest writes; a failed restore leaves it in the run directory, which
// Cleanup moves back). A disk that is another sandbox's (own is false: a
// fork's child restores from its parent's image) or that is linked from a
// second image (the parent's, while a fork's image holds it too) is copied,
// sparse and by reflink where the file system can: each guest must write to
// a disk of its own.
func takeDisk(ctx context.Context, from, to string, own bool) (moved bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(from, &st); err != nil {
		return false, fmt.Errorf("the checkpoint's disk: %w", err)
	}
	if own && st.Nlink == 1 {
		return true, os.Rename(from, to)
	}
	return false, run(ctx, "cp", "--sparse=always", "--reflink=auto", from, to)
}

// validID reports whether id can name a run directory (and a QEMU
// argument: no commas).
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func vcpus(cpu float64) int {
	n := int(math.Ceil(cpu))
	if n < 1 {
		n = 1
	}
	if max := goruntime.NumCPU(); n > max {
		n = max
	}
	return n
}

func memoryMB(limit int64) int64 {
	if limit <= 0 {
		limit = defaultMemory
	}
	return (limit + guestOverhead + (1<<20 - 1)) >> 20
}

// qemuArgs is QEMU's command line for sandbox id in dir.
func (r *Runtime) qemuArgs(id, dir string, m machine) []string {
	args := append([]string{"-name", "atoll-" + id},
		r.machineArgs(m.Accel, m.VCPUs, m.MemoryMB, filepath.Join(dir, initrdName), launch.VMInit)...)
	args = append(args,
		"-display", "none",
		"-serial", "file:"+filepath.Join(dir, consoleName),
		"-qmp", "unix:"+filepath.Join(dir, qmpName)+",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+filepath.Join(dir, chanName)+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+vminit.PortName,
		"-pidfile", filepath.Join(dir, pidName), "-daemonize",
	)
	if m.MAC != "" {
		args = append(args,
			"-netdev", "tap,id=net0,ifname="+tapName+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net0,mac="+m.MAC)
	}
	for _, d := range m.Disks {
		drive := "file=" + d.Path + ",if=none,format=raw,id=" + d.Serial
		if d.ReadOnly {
			drive += ",readonly=on"
		} else {
			drive += ",discard=unmap"
		}
		args = append(args, "-drive", drive, "-device", "virtio-blk-device,drive="+d.Serial+",serial="+d.Serial)
	}
	return args
}

// machineArgs are the machine, kernel and initramfs QEMU boots: a microvm
// (no PCI, no firmware beyond what PVH needs, virtio-mmio devices described
// by ACPI, as Debian's virtio_mmio discovers them) with init given initArg.
func (r *Runtime) machineArgs(accel string, vcpus int, memoryMB int64, initrd, initArg string) []string {
	cmdline := "console=ttyS0 quiet panic=-1 rdinit=" + vminit.AgentPath
	cpu := "host"
	if accel == "tcg" {
		cpu = "max"
		if r.tscKHz > 0 {
			// Without a PIT or HPET a TCG guest cannot measure its TSC
			// and stops booting; QEMU's TSC is the host's.
			cmdline += " tsc_early_khz=" + strconv.Itoa(r.tscKHz)
		}
	}
	if initArg != "" {
		cmdline += " -- " + initArg
	}
	return []string{
		"-M", "microvm,accel=" + accel,
		"-cpu", cpu, "-smp", strconv.Itoa(vcpus), "-m", strconv.FormatInt(memoryMB, 10),
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-kernel", r.kernel, "-initrd", initrd, "-append", cmdline,
	}
}

// runQEMU starts QEMU, which daemonizes once its devices are set up, in the
// network namespace netns if set.
func (r *Runtime) runQEMU(ctx context.Context, id, dir, netns string, l runtime.Limits, args []string) error {
	cg, err := cgroup.New(r.cgroupPath(id), hostResources(l))
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, r.qemu, args...)
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Born in the VM's host cgroup, which its daemon stays in.
	if err := cg.Start(cmd, netns); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("qemu: %w: %s", err, host.LastLine(out.Bytes()))
	}
	return nil
}

// DefaultCgroupParent is Config.CgroupParent's default.
const DefaultCgroupParent = "/atoll-vm"

func (r *Runtime) cgroupPath(id string) string { return r.cgParent + "/" + id }

// hostResources are the limits of a VM's host cgroup: its share of
// contended CPU (l.CPUWeight, as ns gives it) and a backstop on QEMU's
// threads. The guest's own cgroup holds the sandbox's limits; the VM's
// memory and vCPUs are fixed by its machine (a memory limit here could
// only kill the whole VM, and TCG's translation cache grows on its own).
func hostResources(l runtime.Limits) *specs.LinuxResources {
	pids := int64(1024)
	return &specs.LinuxResources{CPU: cgroup.CPU(l.CPUWeight, 0), Pids: &specs.LinuxPids{Limit: &pids}}
}

// removeCgroup kills what is left in VM id's host cgroup and removes it.
func (r *Runtime) removeCgroup(id string) error {
	cg, err := cgroup.Load(r.cgroupPath(id))
	if err != nil {
		return nil // none, or not all of it: nothing runs in it
	}
	if err := cg.KillAll(10 * time.Second); err != nil {
		return err
	}
	if err := cg.Delete(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the VM's cgroup: %w", err)
	}
	return nil
}

// finishIncoming waits until QEMU has loaded the checkpoint and runs the VM,
// which was stopped when it was saved.
func finishIncoming(ctx context.Context, qmpPath string) error {
	q, err := dialQMP(ctx, qmpPath)
	if err != nil {
		return err
	}
	defer q.Close()
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := q.query("query-status", &st); err != nil {
			return err
		}
		switch st.Status {
		case "inmigrate":
		case "running":
			return nil
		case "paused", "postmigrate", "prelaunch":
			_, err := q.do("cont", nil)
			return err
		default:
			return fmt.Errorf("loading the checkpoint: vm is %s", st.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startProxy starts the agent channel's proxy, which detaches once the
// guest's agent answers.
func (r *Runtime) startProxy(ctx context.Context, agentPath, dir string) error {
	logf, err := os.OpenFile(filepath.Join(dir, proxyLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	left := time.Until(deadline(ctx))
	cmd := exec.CommandContext(ctx, agentPath, launch.VMProxy, filepath.Join(dir, chanName), filepath.Join(dir, sockName), left.String())
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, logf
	cmd.Env = []string{channel.PIDFileVar + "=" + filepath.Join(dir, proxyPID)}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("agent channel: %w: %s", err, host.LastLine([]byte(host.Tail(filepath.Join(dir, proxyLog)))))
	}
	return nil
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

// Stop implements runtime.Runtime: the guest flushes its file systems, QEMU
// quits, and what the guest wrote goes back into the writable layer.
func (r *Runtime) Stop(ctx context.Context, id string, inst runtime.Instance) error {
	if r.Alive(inst) {
		// Best effort: a guest that does not answer loses what it had
		// not written, as a machine losing power does.
		r.guestSync(ctx, id)
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = qmpRun(qctx, r.file(id, qmpName), "quit", nil)
		cancel()
		waitExit(inst.PID, 10*time.Second)
		if r.Alive(inst) {
			_ = host.KillAndWait(inst.PID, 5*time.Second)
		}
	}
	if err := r.Cleanup(ctx, id); err != nil {
		return fmt.Errorf("stopping vm %s: %w", id, err)
	}
	return nil
}

// Cleanup implements runtime.Runtime: it kills what is left of QEMU and the
// proxy, copies a disk a guest wrote back into the writable layer (a crashed
// node's VMs' work is not lost), and removes the run directory.
func (r *Runtime) Cleanup(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("%w: sandbox id %q", errdefs.ErrInvalid, id)
	}
	dir := r.runDir(id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, name := range []string{pidName, proxyPID} {
		if pid, err := host.ReadPID(filepath.Join(dir, name)); err == nil && ownedBy(pid, dir) {
			if err := host.KillAndWait(pid, 10*time.Second); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("killing %s: %w", name, err))
			}
		}
	}
	disk := filepath.Join(dir, diskName)
	if _, err := os.Stat(filepath.Join(dir, bootedName)); err == nil {
		if w := r.writableOf(id); w != "" {
			if err := syncBack(ctx, disk, w, filepath.Join(dir, "sync")); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if from, err := os.ReadFile(filepath.Join(dir, "restored-from")); err == nil {
		if _, err := os.Stat(filepath.Join(dir, bootedName)); err != nil {
			// A restore that never ran: the checkpoint gets its disk back.
			_ = os.Rename(disk, filepath.Join(string(from), diskName))
		}
	}
	if err := r.removeCgroup(id); err != nil {
		errs = append(errs, err)
	}
	if netns, err := os.ReadFile(filepath.Join(dir, netnsName)); err == nil {
		if err := unplumb(string(netns)); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, host.RemoveDir(dir))
	return errors.Join(errs...)
}

// writableOf reads which writable layer sandbox id's disk came from.
func (r *Runtime) writableOf(id string) string {
	b, err := os.ReadFile(r.file(id, "writable"))
	if err != nil {
		return ""
	}
	return string(b)
}

// ownedBy reports whether pid is a process started for the run directory
// dir (QEMU or the proxy, whose command lines name files in it), so that a
// stale pid file never kills a process that reused the PID.
func ownedBy(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte(dir+"/"))
}

func waitExit(pid int, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if _, err := host.StartTime(pid); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pause implements runtime.Runtime: every vCPU stops; memory stays. A
// paused sandbox's files are in its writable layer as of the pause (the
// guest flushes, and the disk is copied back), so that what reads the layer
// of a frozen sandbox (a snapshot, a fork) sees what it holds.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	r.guestSync(ctx, id)
	qmpPath := r.file(id, qmpName)
	if _, err := qmpRun(ctx, qmpPath, "stop", nil); err != nil {
		return fmt.Errorf("pausing vm %s: %w", id, err)
	}
	if w := r.writableOf(id); w != "" {
		if err := syncBack(ctx, r.file(id, diskName), w, r.file(id, "sync")); err != nil {
			_, _ = qmpRun(context.WithoutCancel(ctx), qmpPath, "cont", nil)
			return fmt.Errorf("pausing vm %s: %w", id, err)
		}
	}
	return nil
}

// Resume implements runtime.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if _, err := qmpRun(ctx, r.file(id, qmpName), "cont", nil); err != nil {
		return fmt.Errorf("resuming vm %s: %w", id, err)
	}
	r.setClock(ctx, id)
	return nil
}

// guestSync has a running guest flush its file systems to its disks. A
// paused one cannot, and need not: it flushed when it was paused.
func (r *Runtime) guestSync(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := qmpRun(ctx, r.file(id, qmpName), "query-status", nil)
	if err != nil {
		return
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(out, &st) != nil || st.Status != "running" {
		return
	}
	if err := r.guestCall(ctx, id, http.MethodPost, vminit.SyncPath, nil, nil); err != nil {
		r.log.Info("flushing the guest's disks", "sandbox", id, "err", err)
	}
}

// setClock gives the guest the host's time: its clock stood still while
// the VM was stopped. Best effort; a guest that does not take it runs late.
func (r *Runtime) setClock(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.guestCall(ctx, id, http.MethodPut, vminit.ClockPath, time.Now().UnixNano(), nil); err != nil {
		r.log.Info("setting the guest's clock", "sandbox", id, "err", err)
	}
}

// Processes implements runtime.Runtime: the processes of the guest's
// sandbox cgroup, which holds the agent and everything it started.
func (r *Runtime) Processes(ctx context.Context, id string) (int, error) {
	var n int
	if err := r.guestCall(ctx, id, http.MethodGet, vminit.ProcessesPath, nil, &n); err != nil {
		return 0, fmt.Errorf("counting processes of vm %s: %w", id, err)
	}
	return n, nil
}

// Usage implements runtime.Meter by asking the guest: its sandbox cgroup
// holds what the sandbox's processes use, where QEMU's host cgroup would
// count the guest kernel, its caches and (under TCG) the emulator too; and
// the writable disk, which the host's writable layer catches up with only
// at stop, is the guest's to measure.
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	var u vminit.Usage
	if err := r.guestCall(ctx, id, http.MethodGet, vminit.UsagePath, nil, &u); err != nil {
		return runtime.Usage{}, fmt.Errorf("measuring vm %s: %w", id, err)
	}
	return runtime.Usage{
		CPU:         time.Duration(u.CPUUsec) * time.Microsecond,
		MemoryBytes: max(u.MemoryBytes-u.FileBytes, 0), CacheBytes: u.FileBytes,
		DiskBytes: u.DiskBytes, DiskTotalBytes: u.DiskTotal,
	}, nil
}

// Update implements runtime.Runtime in the guest's cgroup. The VM's memory
// and vCPUs are fixed at start: a higher memory limit than the sandbox
// started with is refused, more CPU than its vCPUs is not more.
func (r *Runtime) Update(ctx context.Context, id string, l runtime.Limits) error {
	var m machine
	if b, err := os.ReadFile(r.file(id, machineName)); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	if l.MemoryBytes > 0 && m.MemoryMB > 0 && memoryMB(l.MemoryBytes) > m.MemoryMB {
		return fmt.Errorf("%w: a vm's memory cannot grow past what it started with (%d MiB)", errdefs.ErrInvalid, m.MemoryMB-guestOverhead>>20)
	}
	gl := vminit.Limits{CPU: l.CPU, MemoryBytes: l.MemoryBytes, PIDs: l.PIDs}
	if err := r.guestCall(ctx, id, http.MethodPut, vminit.LimitsPath, gl, nil); err != nil {
		return fmt.Errorf("updating vm %s: %w", id, err)
	}
	cg, err := cgroup.Load(r.cgroupPath(id))
	if err != nil {
		return fmt.Errorf("updating vm %s: %w", id, err)
	}
	if err := cg.Update(hostResources(l)); err != nil {
		return fmt.Errorf("updating vm %s: %w", id, err)
	}
	return nil
}

// guestCall makes one request of vminit's own endpoints beside the agent.
func (r *Runtime) guestCall(ctx context.Context, id, method, path string, in, out any) error {
	sock := r.SocketPath(id)
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Alive implements runtime.Runtime: inst.PID is QEMU's, which lives exactly
// as long as the VM.
func (r *Runtime) Alive(inst runtime.Instance) bool {
	return host.Alive(inst.PID, inst.StartTime)
}

// Settle makes whole again a running sandbox whose Checkpoint a crash of
// the node cut short (runtime.CheckpointSettler): a VM left stopped, or
// stopped after saving its state, goes on.
func (r *Runtime) Settle(ctx context.Context, id string, inst runtime.Instance) error {
	if !r.Alive(inst) {
		return fmt.Errorf("settling vm %s: %w", id, errNotRunning)
	}
	out, err := qmpRun(ctx, r.file(id, qmpName), "query-status", nil)
	if err != nil {
		return fmt.Errorf("settling vm %s: %w", id, err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return err
	}
	if st.Status != "running" {
		if err := r.Resume(ctx, id); err != nil {
			return err
		}
	}
	return r.guestCall(ctx, id, http.MethodGet, "/health", nil, nil)
}

// Checkpoint implements runtime.Checkpointer: the guest flushes its file
// systems, the VM stops and migrates to dir/memory, QEMU quits, and the
// writable disk moves to dir beside it (restore needs the very disk the
// memory refers to) after its contents are copied back into the writable
// layer.
func (r *Runtime) Checkpoint(ctx context.Context, id string, inst runtime.Instance, dir string) error {
	if !validID(id) {
		return fmt.Errorf("%w: sandbox id %q", errdefs.ErrInvalid, id)
	}
	if !r.Alive(inst) {
		return fmt.Errorf("checkpointing vm %s: %w", id, errNotRunning)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	r.guestSync(ctx, id)
	q, err := dialQMP(ctx, r.file(id, qmpName))
	if err != nil {
		return fmt.Errorf("checkpointing vm %s: %w", id, err)
	}
	defer q.Close()
	q.conn.SetDeadline(time.Now().Add(10 * time.Minute))
	if _, err := q.do("stop", nil); err != nil {
		return fmt.Errorf("checkpointing vm %s: %w", id, err)
	}
	mem := filepath.Join(dir, memoryName)
	if err := q.migrate(ctx, "exec:cat > "+shellQuote(mem)); err != nil {
		_, _ = q.do("cont", nil)
		return fmt.Errorf("checkpointing vm %s: %w", id, err)
	}
	for _, f := range []string{initrdName, machineName} {
		if err := run(ctx, "cp", r.file(id, f), filepath.Join(dir, f)); err != nil {
			_, _ = q.do("cont", nil)
			return fmt.Errorf("checkpointing vm %s: %w", id, err)
		}
	}
	_, _ = q.do("quit", nil)
	waitExit(inst.PID, 10*time.Second)
	if r.Alive(inst) {
		_ = host.KillAndWait(inst.PID, 5*time.Second)
	}
	// The files go back to the writable layer from the disk, which then
	// moves into the checkpoint.
	var errs []error
	if w := r.writableOf(id); w != "" {
		if err := syncBack(ctx, r.file(id, diskName), w, r.file(id, "sync")); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Rename(r.file(id, diskName), filepath.Join(dir, diskName)); err != nil {
		errs = append(errs, err)
	}
	_ = os.Remove(r.file(id, bootedName))
	if err := r.Cleanup(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checkpointing vm %s: %w", id, err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// consoleError is what the guest's console says of a failed boot: the
// agent's own words as init (every "atoll-agent" line it printed) and the
// kernel's panic, without the trace that follows a panic, or else the
// console's last line.
func consoleError(path string) string {
	b, _ := host.TailBytes(path, 64<<10)
	var agent []string
	kernel := ""
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if m := kernelStamp.FindStringIndex(l); m != nil {
			l = l[m[1]:]
		}
		switch {
		case strings.HasPrefix(l, "atoll-agent "):
			agent = append(agent, l)
		case kernel == "" && strings.HasPrefix(l, "Kernel panic"):
			kernel = l
		}
	}
	if len(agent) > 3 {
		agent = agent[len(agent)-3:]
	}
	if kernel != "" {
		agent = append(agent, kernel)
	}
	if len(agent) == 0 {
		return host.LastLine(b)
	}
	return strings.Join(agent, "; ")
}

// kernelStamp is the time the kernel prefixes its console lines with.
var kernelStamp = regexp.MustCompile(`^\[\s*\d+\.\d+\]\s*`)

// shellQuote quotes s for the shell QEMU runs exec: migration URIs with.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
