// Package runtime is the contract between the node and the backends that run
// sandboxes (ns, gvisor and vm). A backend turns a Spec (layers, limits,
// identity) into a running sandbox whose PID 1 is atoll-agent, reachable on a unix
// socket, and tears it down again. The layer store owns a sandbox's files and
// the control plane its lifecycle bookkeeping; a runtime may still derive
// storage of its own from the layers it is given, which it keeps and prunes
// itself (lowers' erofs images of template layers, the vm's erofs disks,
// kernel and initramfs).
// runtimetest holds the conformance suite every backend passes.
package runtime

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/layers"
)

// Spec is everything a backend needs to start one sandbox.
type Spec struct {
	ID       string
	Hostname string
	Rootfs   Rootfs
	Limits   Limits
	IDMap    IDMap
	// Env is the default environment of every process the agent starts.
	Env map[string]string
	// User and Workdir are the defaults for processes that name none (an
	// image's USER and WORKDIR); empty means root in its home directory.
	User, Workdir string
	// Setuid lets setuid and file-capability programs (sudo) raise a
	// process's privileges, up to what the sandbox's root holds: no
	// no_new_privs, and setuid bits honoured on the template's layers.
	// Off, nothing in the sandbox gains privileges by exec.
	Setuid bool
	// AgentPath is the host path of the atoll-agent binary. It runs as the
	// sandbox's PID 1 and is neither copied nor mounted into the sandbox.
	AgentPath string
	// Network, if set, is the sandbox's network, made by package network.
	// Without it the sandbox has a network namespace of its own with only
	// loopback.
	Network *Network
}

// Network is a network namespace made for the sandbox outside it, owned by
// the host: the sandbox's first process starts in it rather than in one of
// its own, so that root in the sandbox's user namespace has no power over
// it (its interfaces, routes and firewall). The runtime writes
// /etc/resolv.conf and /etc/hosts for it and mounts them read-only over the
// sandbox's own.
type Network struct {
	// Netns is the path of the namespace (a bind mount of its nsfs file).
	Netns string
	// Addrs are the sandbox's addresses, which /etc/hosts gives its
	// hostname.
	Addrs []netip.Addr
	// Nameservers go into /etc/resolv.conf.
	Nameservers []netip.Addr
}

// ResolvConf is the /etc/resolv.conf a sandbox on n sees: the resolvers on
// its gateway.
func (n *Network) ResolvConf() string {
	var b strings.Builder
	b.WriteString("# Written by atoll: the resolver on the sandbox's gateway.\n")
	for _, a := range n.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options edns0\n")
	return b.String()
}

// Hosts is the /etc/hosts a sandbox on n sees: localhost, and hostname at
// each of its addresses.
func (n *Network) Hosts(hostname string) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, a := range n.Addrs {
		fmt.Fprintf(&b, "%s\t%s\n", a, hostname)
	}
	return b.String()
}

// Rootfs describes the sandbox's file system.
type Rootfs struct {
	// Layers are read-only directories stacked as overlay lower layers, top first.
	Layers []string
	// Writable is a directory holding upper/ and work/ for the overlay; it is
	// what persists across stop and start.
	Writable string
	// Binds are host directories mounted read-only at Target inside the sandbox.
	Binds []layers.Bind
}

// Limits bound a sandbox's resources. Zero means unlimited.
type Limits struct {
	CPU         float64 // cores
	MemoryBytes int64   // no swap on top
	PIDs        int64
	// CPUWeight is the sandbox's share of contended CPU, 1 to 10000 as in
	// cgroup v2's cpu.weight; 0 means the default, 100.
	CPUWeight uint64
}

// IDMap maps uid/gid 0..Size-1 inside the sandbox to HostID..HostID+Size-1.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// Instance identifies a running sandbox well enough to find it again after the
// node restarts.
type Instance struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // of PID, from /proc/PID/stat, guards against PID reuse
	Socket    string `json:"socket"`     // host path of the agent's unix socket
}

// Runtime is one sandbox backend.
type Runtime interface {
	// Name is the value of the API's runtime field ("ns").
	Name() string
	// Start runs the sandbox described by spec and returns once its agent
	// answers on Instance.Socket.
	Start(ctx context.Context, spec Spec) (Instance, error)
	// Stop ends every process of the sandbox and releases what Start took
	// (cgroups, namespaces, mounts), but not the writable layer. Stopping a
	// sandbox that is not running is not an error.
	Stop(ctx context.Context, id string, inst Instance) error
	// Pause freezes every process of a running sandbox (memory kept, CPU
	// released); Resume thaws them.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Processes counts the processes of a running sandbox, its init included.
	Processes(ctx context.Context, id string) (int, error)
	// Update changes the limits of a running sandbox.
	Update(ctx context.Context, id string, l Limits) error
	// Alive reports whether inst still runs.
	Alive(inst Instance) bool
	// Cleanup releases anything a crashed Start may have left for id.
	Cleanup(ctx context.Context, id string) error
}

// Preparer is a Runtime that can do the part of a start that does not depend
// on the sandbox's files ahead of time, so that a later Start of the same ID
// is quicker. Prepare uses spec's ID, IDMap, Limits, AgentPath and
// Network.Netns only; Start may change the limits. (A Start whose network
// namespace differs starts afresh.) Cleanup releases a prepared sandbox that is never
// started. Prepared sandboxes do not survive the node.
type Preparer interface {
	Prepare(ctx context.Context, spec Spec) error
}

// LayerPreparer is a Runtime that makes something of a template's read-only
// layers for its sandboxes to share (images of them), on their first start
// unless PrepareLayers made it ahead: a node calls it when a template is
// made, so that the template's first sandbox starts as quickly as the rest.
// layers are as in Rootfs.Layers, top first.
type LayerPreparer interface {
	PrepareLayers(ctx context.Context, layers []string) error
}

// LayerPruner is a LayerPreparer that drops what it made of layers that are
// gone (a sandbox still running over one keeps it until it stops): a node
// calls it after it deletes layers no template uses.
type LayerPruner interface {
	PruneLayers()
}

// Caps says what a backend can do beyond the Runtime contract's minimum, so
// that the API can report it and the conformance suite skips, by name, what a
// backend does not claim. The zero value claims nothing.
type Caps struct {
	// Pause: Pause and Resume freeze and thaw a sandbox in memory.
	Pause bool `json:"pause"`
	// MemorySnapshot: the Runtime is a Checkpointer, saving a sandbox's
	// memory to disk and restoring it with its processes running on.
	MemorySnapshot bool `json:"memory_snapshot"`
	// MemoryFork: a fork's children start from the parent's memory, not
	// only its files: the Runtime is a Checkpointer whose Restore takes an
	// image of another sandbox (another ID, a copy of its files).
	MemoryFork bool `json:"memory_fork"`
	// ProcessOOM: a process that exceeds the memory limit is killed alone
	// and the sandbox lives on. Without it the whole sandbox stops (its
	// files are kept), as gVisor's does when its host cgroup runs out.
	ProcessOOM bool `json:"process_oom"`
	// SharedKernel: the sandbox's processes call the host kernel directly,
	// confined by namespaces, a seccomp filter, dropped capabilities and
	// masked paths. Without it a user-space kernel or a VM stands between
	// them and the host, and those host-kernel confinements are not what
	// isolates the sandbox.
	SharedKernel bool `json:"shared_kernel"`
	// Network: the sandbox joins the network namespace of Spec.Network
	// (addresses, egress policy, ports). Without it Spec.Network is never
	// set and the sandbox has loopback only.
	Network bool `json:"network"`
	// Emulated: the sandbox runs under CPU emulation (a VM under TCG, where
	// KVM does not work): slow, and no security boundary, since the
	// emulator's bugs are reachable from inside. Such a backend claims no
	// isolation: the escape and exhaustion tests do not hold it to any.
	Emulated bool `json:"emulated"`
}

// Capabler is a Runtime that reports its Caps. A Runtime that is not one
// claims nothing beyond the contract.
type Capabler interface {
	Capabilities() Caps
}

// CapsOf returns rt's Caps, the zero value for a Runtime that reports none.
func CapsOf(rt Runtime) Caps {
	if c, ok := rt.(Capabler); ok {
		return c.Capabilities()
	}
	return Caps{}
}

// Usage is what a running sandbox has used, as its runtime measures it.
type Usage struct {
	// CPU is the CPU time its processes used since it started.
	CPU time.Duration
	// MemoryBytes is the memory it uses less the page cache, CacheBytes
	// the page cache (tmpfs files included), as E2B's envd reports them.
	MemoryBytes, CacheBytes int64
	// DiskBytes and DiskTotalBytes are its writable disk's use and size
	// where the runtime keeps that disk while the sandbox runs (vm: an
	// ext4 image the guest writes); both 0 leave them to the layer store.
	DiskBytes, DiskTotalBytes int64
}

// Meter is a Runtime that measures what a running sandbox uses: its CPU
// time and memory, as its cgroup (or its guest) counts them, so that the
// figures are the sandbox's own, not the host's.
type Meter interface {
	Usage(ctx context.Context, id string) (Usage, error)
}

// Checkpointer is a Runtime that can pause a sandbox to disk: Checkpoint
// saves its memory and processes into dir and stops it (what Stop releases is
// released; the files stay in the writable layer), and Restore starts it from
// dir again over the same files, its processes going on where they were. dir
// belongs to the caller, who keeps it across node restarts and removes it
// once restored.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id string, inst Instance, dir string) error
	Restore(ctx context.Context, spec Spec, dir string) (Instance, error)
}

// CheckpointSettler is a Checkpointer that can make whole again a running
// sandbox whose Checkpoint a crash of the node cut short (its agent may have
// let go of its socket for the checkpoint): Settle leaves it running as
// before, its agent answering on inst.Socket.
type CheckpointSettler interface {
	Settle(ctx context.Context, id string, inst Instance) error
}

// AgentTimeout bounds how long Start waits for the agent to answer.
const AgentTimeout = 10 * time.Second
