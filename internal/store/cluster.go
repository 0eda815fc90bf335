package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Cluster is what a store shared by the nodes of a cluster (store/postgres)
// keeps besides Store: the nodes, their leases and epochs, placements, and
// the cluster's shared secrets. storetest.Cluster checks its promises.
//
// Leases and epochs. A node joins under a new epoch, one more than its last,
// and holds a lease it renews by heartbeat. Once its lease has run out,
// Expire fences it: its sandboxes are marked lost, and nothing written under
// that epoch is accepted again (ErrFenced), even if the node comes back from
// a partition still believing it owns them. A node that restarts joins again
// under a new epoch and re-adopts the sandboxes still recorded as its own.
//
// Sandboxes carry the Node that runs them. Writes a node makes go through
// As(node, epoch), which refuses every write once that epoch is no longer
// the node's current, live one; and a node writes only its own sandboxes.
type Cluster interface {
	Store
	// Leases are times of the caller's clock (Join, Renew), compared with
	// Expire's now: the nodes' clocks must agree to well within a lease.
	//
	// Join records node n (Name, Address, Version, Runtimes, Labels,
	// Capacity) as live under a new epoch, returned, with a lease until
	// now+ttl. A node joining again keeps its Schedule (cordoned,
	// draining) and its sandboxes; its earlier epoch is fenced from now on.
	Join(ctx context.Context, n Node, ttl time.Duration) (epoch int64, err error)
	// Renew extends node name's lease to now+ttl and records st, if epoch
	// is its current epoch and it is live; else ErrFenced.
	Renew(ctx context.Context, name string, epoch int64, ttl time.Duration, st NodeStatus) error
	// Nodes returns every node, by name, each with Committed: what its
	// sandboxes hold now (see Holds).
	Nodes(ctx context.Context) ([]Node, error)
	// SetSchedule sets node name's Schedule ("", NodeCordoned,
	// NodeDraining). ErrNotFound for no such node.
	SetSchedule(ctx context.Context, name, schedule string) error
	// Expire fences every live node whose lease ran out before now: the
	// node becomes NodeFenced, and each of its sandboxes (not those
	// deleting) becomes api.StateLost, recording the state it was in as
	// LostFrom, with a transition whose reason is cause; its Error says
	// its node was fenced and why (cause), its StoppedAt when. It returns the
	// nodes fenced. Several nodes expiring at once fence each node once.
	Expire(ctx context.Context, now time.Time, cause string) ([]Node, error)
	// Place records each placement's sandbox on its Node (sb.Node set by
	// the caller), as Create does (slot: the lowest its node's live
	// sandboxes leave free), if that node is live, schedulable
	// (Schedule ""), offers sb.Runtime, and has room: its Committed plus
	// sb's resources within its Capacity; else ErrNoRoom for that
	// placement. Each placement is applied or refused on its own, and
	// concurrent Places never commit a node beyond its capacity. errs[i]
	// is placement i's.
	//
	// A warm placement (sb.Warm) reserves one of its node's pooled
	// sandboxes of sb.TemplateVersion (state StatePooled): those not yet
	// reserved by warm placements still creating there. It needs room
	// only for what it holds beyond the pooled sandbox it replaces. With
	// none left, ErrNoWarm: concurrent Places never count on one pooled
	// sandbox twice.
	Place(ctx context.Context, sbs []*Sandbox) (errs []error)
	// Move hands sandbox id, recorded on node from in api.StateArchived or
	// api.StateLost (the states whose files are in object storage, none on
	// a node), to node to, archived: the caller has made sure its files
	// are under its archive key. Node to must be live, schedulable, offer
	// the sandbox's runtime and have room to run it (Place's check, with
	// the sandbox counted as running), else ErrNoRoom. The transition is
	// recorded with reason, which the sandbox's Error shows too. A sandbox
	// on another node or in another state is ErrConflict; none,
	// ErrNotFound. It returns the sandbox as recorded (see move.go).
	Move(ctx context.Context, id, from, to, reason string) (Sandbox, error)
	// As is the view node name writes through under epoch: its Create
	// places on the node (as Place, schedulable or not: forks and pools
	// are the node's own business), and every write through it (sandbox,
	// snapshot) is refused with ErrFenced unless epoch is the node's
	// current epoch and the node is live. A sandbox write through it of a
	// sandbox of another node is ErrFenced too. Reads are the Store's.
	As(name string, epoch int64) Store
	// Demand sums the creates a minute by template version that the live
	// nodes last reported (NodeStatus.Demand), and counts the live,
	// schedulable nodes that share them: what sizes the warm pools.
	Demand(ctx context.Context) (Demand, error)
	// TakeCreates counts n creates of tenant t against its rate of
	// creates a second, in a bucket kept in the store that every node
	// shares and refilled by the store's one clock, holding at most burst.
	// A bucket with a create left takes all n (it may run below zero, which
	// later creates wait for), and wait is 0; an emptier one takes none, and
	// wait is how long until it has a create again. Concurrent takes through
	// any nodes are applied one after another.
	TakeCreates(ctx context.Context, t string, n int, rate, burst float64) (wait time.Duration, err error)
	BlobPins
	// Secret returns the value kept under name, first storing make()'s if
	// there is none; when several nodes ask at once, every one gets the
	// same value (the first stored).
	Secret(ctx context.Context, name string, make func() ([]byte, error)) ([]byte, error)
}

// BlobPins order the making of template versions against the deletion of
// their layers' objects, which versions share by content: without them a
// node could find an object there, and record a version naming it, just as
// another node that had seen no version name it any more deleted it.
type BlobPins interface {
	// PinBlob keeps object key from DropBlob for d, by the store's
	// clock, or until Unpin(pin): a node pins each object a version it
	// makes will name, under one name of its own, before it looks for the
	// object or writes it, and unpins once the version is recorded. A
	// DropBlob of key under way finishes first (the object is then gone,
	// and the node writes it again).
	PinBlob(ctx context.Context, key, pin string, d time.Duration) error
	// Unpin ends every pin named pin.
	Unpin(ctx context.Context, pin string) error
	// DropBlob deletes object key by calling del, unless it is pinned:
	// then it calls nothing and reports false. PinBlobs of key wait
	// meanwhile. A del that fails leaves the object the caller's to try
	// again.
	DropBlob(ctx context.Context, key string, del func(context.Context) error) (dropped bool, err error)
}

// ErrFenced is a write under an epoch that is no longer its node's current,
// live one, or of a sandbox of another node. The node must stop acting on
// what it believed it owned.
var ErrFenced = fmt.Errorf("node fenced: its lease expired or another node owns this: %w", errdefs.ErrUnavailable)

// ErrNoRoom is a placement on a node that cannot take it: not live, not
// schedulable, without the runtime, or without the capacity. The scheduler
// tries another node.
var ErrNoRoom = fmt.Errorf("node has no room for the sandbox: %w", errdefs.ErrUnavailable)

// ErrNoWarm is a warm placement (Sandbox.Warm) on a node whose pooled
// sandboxes of its template version are all reserved, or gone: the
// scheduler places it again, cold.
var ErrNoWarm = fmt.Errorf("node has no warm sandbox of the template left: %w", errdefs.ErrUnavailable)

// IsFenced reports whether err is ErrFenced.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// Node states and schedules.
const (
	NodeLive   = "live"
	NodeFenced = "fenced" // lease expired; its sandboxes are lost

	NodeCordoned = "cordoned" // takes no new placements
	NodeDraining = "draining" // takes none, and its sandboxes move away
)

// Resources are what a node has, or what sandboxes hold.
type Resources struct {
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskGiB   int64   `json:"disk_gib"`
	Sandboxes int     `json:"sandboxes"`
}

// Node is a member of a cluster.
type Node struct {
	Name     string // unique; chosen by the operator
	Address  string // host:port of its node-to-node listener
	Version  string
	Runtimes []string
	Labels   map[string]string
	Capacity Resources
	// Committed is what the node's sandboxes hold (Nodes fills it; a pooled
	// sandbox reserved by a warm placement counts once).
	Committed Resources
	Epoch     int64
	State     string // NodeLive, NodeFenced
	Schedule  string // "", NodeCordoned, NodeDraining
	JoinedAt  time.Time
	// Heartbeat is the last renewal; LeaseExpires when the lease runs out.
	Heartbeat, LeaseExpires time.Time
	// Status is what the node last reported.
	Status NodeStatus
	// PooledHolds is what one of its pooled sandboxes holds, which a warm
	// placement replaces, and PooledRuntime their runtime (the node's
	// default): Nodes fills them, when the node has some.
	PooledHolds   Resources
	PooledRuntime string
}

// NodeStatus is what a node reports with each heartbeat.
type NodeStatus struct {
	// Templates are the template version IDs whose layers the node holds,
	// for locality.
	Templates []string `json:"templates,omitempty"`
	// Pooled counts the warm sandboxes the node holds, by template
	// version ID ("" the built-in).
	Pooled map[string]int `json:"pooled,omitempty"`
	// Demand is how many creates a minute of each template version ("" the
	// built-in) the node placed lately, as an API node: the cluster's
	// demand is the sum over the live nodes (Demand), which sizes the
	// nodes' warm pools.
	Demand map[string]float64 `json:"demand,omitempty"`
	// Drain is how the node's drain went, while its schedule is draining.
	Drain *DrainStatus `json:"drain,omitempty"`
}

// Demand is the cluster's recent creates (Cluster.Demand).
type Demand struct {
	// Rates are creates a minute, by template version ("" the built-in).
	Rates map[string]float64
	// Nodes are the live, schedulable nodes; at least 1.
	Nodes int
}

// DrainStatus is what a draining node reports of its last drain round.
type DrainStatus struct {
	Moved int       `json:"moved"` // sandboxes moved away since the drain began
	At    time.Time `json:"at"`    // of the last round
	// Left are the sandboxes still on the node, by ID, each with why:
	// the drain is complete when there are none.
	Left  map[string]string `json:"left,omitempty"`
	Error string            `json:"error,omitempty"`
}

// Holds reports what a sandbox in state holds on its node: compute (its CPU
// and memory) while it has processes or may have them soon, and a slot (its
// disk and one of the node's sandbox count) while its files are on the node.
// Place and Nodes count sandboxes by it.
func Holds(state string) (compute, slot bool) {
	switch state {
	case api.StateStopped, api.StateStopping, api.StateError, api.StateArchiving, api.StateSuspended, api.StateShelved:
		return false, true
	case api.StateArchived, api.StateLost, api.StateDeleting:
		return false, false
	}
	return true, true
}

// Add adds to c what sandboxes in state, holding r between them (r's
// Sandboxes their count), hold on their node (Holds).
func (c *Resources) Add(state string, r Resources) {
	compute, slot := Holds(state)
	if compute {
		c.CPU += r.CPU
		c.MemoryMiB += r.MemoryMiB
	}
	if slot {
		c.DiskGiB += r.DiskGiB
		c.Sandboxes += r.Sandboxes
	}
}
