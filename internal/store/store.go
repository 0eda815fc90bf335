// Package store declares atoll's durable state and the contract every store
// of it keeps: sandboxes and their state transitions, snapshots, template
// versions and API keys (hashed), each sandbox, snapshot and key with its
// tenant. The control plane and the key check depend on this package only;
// an implementation lives in a package of its own (store/sqlite, embedded,
// for one machine; store/postgres, shared by the nodes of a cluster) and
// proves itself with the conformance suite in store/storetest.
package store

import (
	"context"
	"encoding/json"
)

// Store is the contract. The promises below hold for every implementation,
// and storetest checks each of them:
//
//   - Durable when acknowledged: a write that returns nil is committed, and
//     is there after Close and a reopen, or after a crash of the process or
//     the machine. A write that returns an error changed nothing, with one
//     exception no networked database can rule out: ErrUnavailable from a
//     store whose connection was lost during the commit itself (PostgreSQL)
//     may come from a write that was applied. Callers that retry such a
//     write must find its effect already there acceptable (creates carry
//     their IDs, so a retried one is ErrConflict, not a duplicate).
//   - Errors are errdefs kinds, checked with errors.Is: ErrNotFound for an ID,
//     name or hash the store does not hold (whatever its shape: an ID is only
//     ever compared, never parsed or spliced into a query); ErrConflict for a
//     refused compare-and-set and for a second row of an ID, name or hash
//     that must be unique; ErrInvalid for an argument of the wrong shape
//     where a method says so, and for a value the store cannot hold exactly
//     (it never stores a changed one).
//   - Lists are in a total order that each method names, the same on every
//     call, so that a caller paging over a list (the APIs do, by position
//     or by the last row seen) meets every row once. The store itself does
//     not page.
//   - Every sandbox, snapshot and key has a tenant; "" is written as
//     tenant.Default. Reads by ID are not scoped: the caller, which knows
//     the asking tenant, checks a row's Tenant. Methods that take a tenant
//     count only that tenant's rows.
//   - Times come back in UTC, to the microsecond at least.
//   - Safe for concurrent use; concurrent writes are each applied or
//     refused whole, as if one after another.
type Store interface {
	Sandboxes
	Snapshots
	Templates
	Keys
	Tenants
	Vaults
	Usage
	VaultSchedules
	Journal
	// TenantInUse reports whether tenant t has keys, sandboxes,
	// snapshots or vaults.
	TenantInUse(ctx context.Context, t string) (bool, error)
	// Close waits for the writes under way, then releases the store.
	Close() error
}

// Sandboxes are the sandbox rows and their recorded state changes.
type Sandboxes interface {
	// Create records a new sandbox and its first state (a transition from
	// ""). It chooses sb.Slot, the lowest slot no live sandbox of sb.Node
	// holds, and
	// writes "" tenant as tenant.Default into sb.Tenant; on error sb is as it
	// came. An ID already recorded is ErrConflict; a TemplateVersion the
	// store does not hold ("" is the built-in template, always held) is
	// ErrNotFound.
	Create(ctx context.Context, sb *Sandbox) error
	// Update writes sb if its stored state is one of from, checked and
	// written atomically, and records the transition if the state changed;
	// otherwise it changes nothing and returns ErrConflict (ErrNotFound if
	// there is no such sandbox). The slot stays as Create chose it, unless
	// sb.Node is another node than the stored one: then the sandbox moves
	// there and takes that node's lowest free slot, written into sb.Slot.
	Update(ctx context.Context, sb *Sandbox, from ...string) error
	// UpdateAll is Update of every sandbox of sbs, atomically: all are
	// written, or none.
	UpdateAll(ctx context.Context, sbs []*Sandbox, from ...string) error
	// Delete removes a sandbox if its stored state is one of from (any
	// state, if from is empty), records its transition to "deleted" and
	// returns the row it removed; its slot is free again. ErrNotFound if
	// there is none. A stored state not in from changes nothing and
	// returns ErrConflict with the stored row, so that the caller can say
	// which move was refused without reading it again.
	Delete(ctx context.Context, id string, from ...string) (Sandbox, error)
	// Get returns one sandbox, as last written.
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns every sandbox (of every tenant and node), by
	// CreatedAt, then ID.
	List(ctx context.Context) ([]Sandbox, error)
	// ListNode returns the sandboxes of node ("" on a single machine: all
	// of them), in List's order.
	ListNode(ctx context.Context, node string) ([]Sandbox, error)
	// Transitions returns a sandbox's recorded state changes in the order
	// they were made; they outlive the sandbox's row.
	Transitions(ctx context.Context, id string) ([]Transition, error)
	// SnapshotUsers counts the sandboxes created from each snapshot.
	SnapshotUsers(ctx context.Context) (map[string]int, error)
	// Placement returns sandbox id's placement record (Sandbox.Placement),
	// as Create or Place wrote it; nil if it has none. ErrNotFound if
	// there is no such sandbox.
	Placement(ctx context.Context, id string) (json.RawMessage, error)
}

// Snapshots are the snapshot rows.
type Snapshots interface {
	// PutSnapshot records a snapshot; an ID already recorded is
	// ErrConflict.
	PutSnapshot(ctx context.Context, sn Snapshot) error
	// SetSnapshotState moves snapshot id from state from to state to,
	// atomically; if it is not in state from it changes nothing and
	// returns ErrConflict.
	SetSnapshotState(ctx context.Context, id, from, to string) error
	// GetSnapshot returns one snapshot.
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns the snapshots of sandboxID, or all if it is
	// empty, by CreatedAt, then ID.
	ListSnapshots(ctx context.Context, sandboxID string) ([]Snapshot, error)
	// DeleteSnapshot removes a snapshot.
	DeleteSnapshot(ctx context.Context, id string) error
}

// Templates are names that point to immutable versions (see Template), and
// the count of what holds each version.
type Templates interface {
	// PutTemplate records t as a version of t.Name and points the name at
	// it, atomically. A version of the same ID (the same content) is reused
	// rather than recorded twice. It returns the version as recorded (ID,
	// Number: one more than the highest of the name's versions left) and
	// the ID of the version the name pointed to before ("" if none).
	PutTemplate(ctx context.Context, t Template) (Template, string, error)
	// PointTemplate points name at the existing version id (a second name
	// for it) and returns the ID of the version name pointed to before.
	PointTemplate(ctx context.Context, name, id string) (string, error)
	// GetTemplate returns the version name points to.
	GetTemplate(ctx context.Context, name string) (Template, error)
	// GetTemplateVersion returns the version of name that ref names: its
	// number, or its ID (of a version made under name or one name points
	// to). A ref that is neither a number from 1 (without leading zeros)
	// nor of ValidVersionID's shape is ErrInvalid.
	GetTemplateVersion(ctx context.Context, name, ref string) (Template, error)
	// TemplateVersion returns version id.
	TemplateVersion(ctx context.Context, id string) (Template, error)
	// ListTemplates returns every name with its current version, by name.
	ListTemplates(ctx context.Context) ([]TemplateName, error)
	// ListTemplateVersions returns every version, by name and number.
	ListTemplateVersions(ctx context.Context) ([]Template, error)
	// DeleteTemplate removes name; its versions stay while anything else
	// holds them.
	DeleteTemplate(ctx context.Context, name string) error
	// CollectTemplates deletes the versions nothing holds (only among ids,
	// if any are given) and returns them; atomically, so that a sandbox
	// recorded at the same time either holds its version or is refused.
	CollectTemplates(ctx context.Context, ids ...string) ([]Template, error)
	// VersionUsers counts the sandboxes (not pooled ones: StatePooled) and
	// snapshots made from each version: those of tenant t, or of every
	// tenant if t is empty.
	VersionUsers(ctx context.Context, t string) (map[string]VersionUse, error)
	// TemplateUsers counts the sandboxes (not pooled ones) made from each
	// template name: those of tenant t, or of every tenant if t is empty.
	TemplateUsers(ctx context.Context, t string) (map[string]int, error)
}

// Keys are the API keys, stored only as hashes (see Key).
type Keys interface {
	// AddKey stores the hash of an API key, its name and its tenant; a hash
	// already stored is ErrConflict.
	AddKey(ctx context.Context, hash, name, tenant string) error
	// LookupKey returns the key whose hash is hash.
	LookupKey(ctx context.Context, hash string) (Key, error)
	// ListKeys returns every key, by CreatedAt, then hash.
	ListKeys(ctx context.Context) ([]Key, error)
	// DeleteKey removes the key with ID id, unless it is the last key of
	// the default tenant (the admin's), which would leave nobody to issue
	// keys: that is ErrConflict.
	DeleteKey(ctx context.Context, id string) error
	// KeyCount is the number of stored keys.
	KeyCount(ctx context.Context) (int, error)
}

// StatePooled is the state of a sandbox started ahead of demand for a warm
// pool: it belongs to no user yet, so the use counts leave it out.
const StatePooled = "pooled"

// StatePrestarted is the state of a sandbox process started ahead of
// demand, not yet any create's: quotas leave it out (Charge).
const StatePrestarted = "prestarted"
