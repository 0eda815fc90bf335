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
