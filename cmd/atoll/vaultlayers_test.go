package main

import (
	"context"
	"errors"
	"testing"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TestVaultLayersOtherTenant checks that a sandbox's kept vault layers
// (vault-layers.json, which travels with its files through snapshots,
// forks, archives and other nodes) naming another tenant's vault are
// refused before anything is made of them.
func TestVaultLayersOtherTenant(t *testing.T) {
	m := &vaultMounts{} // no vault service: reached, it would panic
	kept := []byte(`[{"vault":"v1","tenant":"other","name":"secrets","commit":"abc","path":"/home/user/secrets"}]`)
	if _, err := m.Layers(context.Background(), "acme", kept); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("layers of another tenant's vault: %v", err)
	}
}
