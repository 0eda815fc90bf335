// Package node is the tier of atoll that runs sandboxes on one machine: its
// runtimes, its layer store, its sandbox networks, the agent binary every
// sandbox runs and the memory images of suspended ones. The control plane
// (internal/control, with internal/templates and internal/pools) decides
// what runs and records it; it runs it on a Node, through the control.Node
// interface it declares for what it asks of one.
//
// Today both tiers live in one process and a Node hands the control plane
// its parts directly. That interface is the seam cluster mode cuts: there,
// a scheduler picks a node and the node protocol carries the calls made on
// its parts here.
package node

import (
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// Config names a node's parts.
type Config struct {
	// Name is the node's name in a cluster (store.Node.Name), which its
	// sandboxes' rows carry; "" on a single machine.
	Name     string
	Runtimes []runtime.Runtime
	// Unavailable names runtimes this node knows but cannot offer, with
	// why (for clients: no host paths).
	Unavailable map[string]string
	Layers      *layers.Store
	// Network gives sandboxes networks, taken from NetworkPool if set;
	// nil runs them with loopback only.
	Network     *network.Manager
	NetworkPool *network.Pool
	// AgentPath is the host path of the agent binary.
	AgentPath string
	// CheckpointDir holds the memory images of suspended sandboxes; empty
	// refuses suspending.
	CheckpointDir string
}

// Node is one machine's sandbox-running parts.
type Node struct {
	cfg      Config
	runtimes map[string]runtime.Runtime
}

// New returns the node made of cfg's parts.
func New(cfg Config) *Node {
	n := &Node{cfg: cfg, runtimes: map[string]runtime.Runtime{}}
	for _, r := range cfg.Runtimes {
		n.runtimes[r.Name()] = r
	}
	return n
}

// Name is the node's name in its cluster; "" on a single machine.
func (n *Node) Name() string { return n.cfg.Name }

// Runtimes are the runtimes the node offers, by name.
func (n *Node) Runtimes() map[string]runtime.Runtime { return n.runtimes }

// Unavailable names the runtimes the node knows but cannot offer, with why.
func (n *Node) Unavailable() map[string]string { return n.cfg.Unavailable }

// Layers is the node's layer store.
func (n *Node) Layers() *layers.Store { return n.cfg.Layers }

// Network is the node's sandbox network manager and its pool of ready
// networks; either may be nil.
func (n *Node) Network() (*network.Manager, *network.Pool) { return n.cfg.Network, n.cfg.NetworkPool }

// AgentPath is the host path of the agent binary.
func (n *Node) AgentPath() string { return n.cfg.AgentPath }

// CheckpointDir holds the memory images of suspended sandboxes.
func (n *Node) CheckpointDir() string { return n.cfg.CheckpointDir }
