package store

import (
	"context"
	"time"
)

// Vaults are memory vaults (package vault): git repositories of a tenant's,
// whose objects are packs in the object store and whose refs are rows
// here. A push is acknowledged once UpdateVaultRefs has committed its refs
// and the names of its packs in one transaction, compare-and-set on the
// refs' old values, so that of two concurrent pushes from the same old
// value one wins whole and the other changes nothing.
type Vaults interface {
	// CreateVault records a vault; a second vault of the same tenant and
	// name, or of the same ID, is ErrConflict. "" tenant is
	// tenant.Default.
	CreateVault(ctx context.Context, v Vault) error
	// GetVault returns tenant t's vault name.
	GetVault(ctx context.Context, t, name string) (Vault, error)
	// ListVaults returns tenant t's vaults, by name.
	ListVaults(ctx context.Context, t string) ([]Vault, error)
	// DeleteVault removes vault id with its refs and pack names.
	DeleteVault(ctx context.Context, id string) error
	// VaultState returns vault id's refs (name to object ID) and the
	// names of its packs, in the order they were added.
	VaultState(ctx context.Context, id string) (map[string]string, []string, error)
	// UpdateVaultRefs applies updates to vault id's refs and appends packs
	// to its pack names, atomically: each update's Old must be the ref's
	// stored value ("" for a ref that does not exist), else nothing
	// changes and it is ErrConflict. An update whose New is "" deletes
	// the ref. A pack name already recorded is not recorded twice.
	UpdateVaultRefs(ctx context.Context, id string, updates []RefUpdate, packs []string) error
	// ReplaceVaultPacks records pack in place of the packs old of vault
	// id (a pack that holds all their objects), atomically: if one of old
	// is not recorded, nothing changes and it is ErrConflict. The packs
	// recorded besides old stay, after pack.
	ReplaceVaultPacks(ctx context.Context, id string, old []string, pack string) error
}

// Vault is one vault's record.
type Vault struct {
	ID     string
	Tenant string
	Name   string
	// Layout is the convention the vault was seeded with ("" or "agent").
	Layout string
	// AllowRewrite lets admin keys force-push and delete refs.
	AllowRewrite bool
	CreatedAt    time.Time
}

// RefUpdate moves one ref from Old to New (object IDs; "" for none).
type RefUpdate struct {
	Name, Old, New string
}

// VaultSchedules are the vaults' compaction schedules and their logs of
// events (package vault's compaction). The schedule of a cluster's
// vaults is run by one node at a time: every node looks for the due
// ones, and the one whose ClaimVaultSchedule moves the next run on is
// the one that runs it.
type VaultSchedules interface {
	// SetVaultSchedule sets vault sc.VaultID's schedule and summarizer,
	// replacing what it had; ErrNotFound without the vault.
	SetVaultSchedule(ctx context.Context, sc VaultSchedule) error
	// VaultSchedule returns vault id's schedule: Every "" and Summarizer
	// "" if it has none.
	VaultSchedule(ctx context.Context, id string) (VaultSchedule, error)
	// DueVaultSchedules returns up to limit schedules (Every not "")
	// whose Next is at or before now, earliest first, with their vault's
	// tenant and name.
	DueVaultSchedules(ctx context.Context, now time.Time, limit int) ([]VaultSchedule, error)
	// ClaimVaultSchedule moves vault id's Next from was to next if it is
	// still was, and reports whether it did: of the nodes that found the
	// schedule due, the one that claimed it runs it.
	ClaimVaultSchedule(ctx context.Context, id string, was, next time.Time) (bool, error)
	// AddVaultEvent appends e to its vault's events, of which the newest
	// MaxVaultEvents are kept.
	AddVaultEvent(ctx context.Context, e VaultEvent) error
	// VaultEvents returns vault id's newest events, at most limit, newest
	// first.
	VaultEvents(ctx context.Context, id string, limit int) ([]VaultEvent, error)
}

// MaxVaultEvents bounds the events kept per vault.
const MaxVaultEvents = 200

// VaultSchedule is a vault's compaction schedule.
type VaultSchedule struct {
	VaultID string
	// Tenant and Name are the vault's, filled in by DueVaultSchedules.
	Tenant, Name string
	// Every is "daily", "weekly" or "" (no scheduled compaction).
	Every string
	// Summarizer is the command that summarizes the vault's compactions
	// ("" for the default, deterministic one).
	Summarizer string
	// Next is when the next scheduled compaction is due.
	Next time.Time
}

// VaultEvent is one thing that happened to a vault outside a push: a
// compaction made, found nothing to do, or failed.
type VaultEvent struct {
	VaultID string
	At      time.Time
	Kind    string // "compact"
	// Trigger says who asked: "api" or "schedule".
	Trigger string
	Commit  string // the commit made, if any
	Error   string // why it failed, if it did
	Detail  string // what was rolled up, in a line
}
