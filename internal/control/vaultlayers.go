package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
)

// A sandbox's vaults can be read-only layers stacked over its template's
// (vault.LayerSpec, docs/vault.md): the sandbox's writable layer then
// holds only what the agent changes in them, so it needs them under it
// for as long as it lives. What they are is kept in the writable layer's
// directory, beside upper/ and work/ (VaultLayersFile): it goes wherever
// the writable layer goes (stop and start, fork, snapshot, archive and
// restore on another node), and every start stacks the layers it names,
// made again from the vaults where missing.

// VaultLayersFile is the file of a writable layer's directory that says
// which vault layers it stacks on.
const VaultLayersFile = "vault-layers.json"

// VaultLayers make and find vaults' layers for sandboxes.
type VaultLayers interface {
	// Plan chooses, at sb's create, the layers of its vaults over its
	// template's layers tmpl (top first), and sets the Commit of the
	// mounts it chose a layer for. It returns what the writable layer
	// keeps, nil for none (the vaults are cloned into it as before).
	Plan(ctx context.Context, sb *store.Sandbox, tmpl []string) ([]byte, error)
	// Layers returns the layers' directories of what Plan returned for a
	// sandbox of tenant, top first, made if missing. What a writable
	// layer keeps travels (snapshots, forks, archives, other nodes): it
	// refuses layers of another tenant's vaults.
	Layers(ctx context.Context, tenant string, kept []byte) ([]string, error)
}

// SetVaultLayers makes sandboxes created from now on stack vaults'
// layers; set before the service serves.
func (s *Service) SetVaultLayers(v VaultLayers) { s.vlayers = v }

// planVaultLayers plans sb's vault layers at its create and keeps the
// plan in its writable layer.
func (s *Service) planVaultLayers(ctx context.Context, sb *store.Sandbox, tmpl layers.Template) error {
	if s.vlayers == nil || len(sb.Vaults) == 0 {
		return nil
	}
	kept, err := s.vlayers.Plan(ctx, sb, tmpl.Layers)
	if err != nil || kept == nil {
		return err
	}
	dir, err := s.layers.CreateWritable(sb.ID, sb.DiskGiB<<30)
	if err != nil {
		return fmt.Errorf("preparing writable layer: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, VaultLayersFile), kept, 0o600)
}

// vaultLayers returns the lower layers of sandbox sb whose writable
// layer is writable: its vaults' layers, if it keeps any, over tmpl.
func (s *Service) vaultLayers(ctx context.Context, sb store.Sandbox, writable string, tmpl []string) ([]string, error) {
	kept, err := os.ReadFile(filepath.Join(writable, VaultLayersFile))
	if errors.Is(err, os.ErrNotExist) {
		return tmpl, nil
	}
	if err != nil {
		return nil, err
	}
	if s.vlayers == nil {
		return nil, fmt.Errorf("%w: the sandbox's vaults are layers, and this node keeps no vaults", errdefs.ErrUnavailable)
	}
	vl, err := s.vlayers.Layers(ctx, sb.Tenant, kept)
	if errors.Is(err, errdefs.ErrConflict) {
		// A vault deleted with its layer gone, or not the tenant's: no
		// retry helps.
		return nil, fmt.Errorf("the sandbox's vault layers: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: the sandbox's vault layers: %v", errdefs.ErrUnavailable, err)
	}
	return append(vl, slices.Clone(tmpl)...), nil
}

// PrepareVaultLayer has the node's default runtime make what its
// sandboxes over the vault layer dir share (its image), ahead of the
// create that stacks it.
func (s *Service) PrepareVaultLayer(ctx context.Context, dir string) {
	p, ok := s.runtimes[s.defaults.Runtime].(runtime.LayerPreparer)
	if !ok {
		return
	}
	if err := p.PrepareLayers(ctx, []string{dir}); err != nil {
		s.log.Debug("preparing a vault layer", "layer", dir, "err", err)
	}
}

// KeptVaultLayers returns what the writable layers and snapshots of this
// node keep of their vault layers (VaultLayersFile), one each that has.
func (s *Service) KeptVaultLayers() [][]byte {
	var dirs []string
	ids, _ := s.layers.WritableIDs()
	for _, id := range ids {
		dirs = append(dirs, s.layers.WritableDir(id))
	}
	ids, _ = s.layers.SnapshotIDs()
	for _, id := range ids {
		dirs = append(dirs, s.layers.SnapshotDir(id))
	}
	var out [][]byte
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, VaultLayersFile)); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// PruneLayerImages has the runtimes drop their images of layers that are
// gone (vault layers swept).
func (s *Service) PruneLayerImages() {
	for _, rt := range s.runtimes {
		if p, ok := rt.(runtime.LayerPruner); ok {
			p.PruneLayers()
		}
	}
}
