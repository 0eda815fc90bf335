package vault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Every push adds a pack to its vault, so a vault an agent pushes to
// every few minutes for weeks holds thousands: each one a blob to fetch
// for a node that makes the cache anew, and a file git opens on reads.
// Past consolidateAt packs, the packs are made one (consolidate): git
// repack in the cache, the new pack to the object store, then recorded in
// place of the packs it holds, in one store transaction. Packs that no
// vault records any more (those consolidated, those of a push that failed
// after storing its pack) are deleted from the object store once they
// have been seen unrecorded for packGrace (sweepPacks): a node that read
// the vault's packs just before the consolidation may still be fetching
// one.

// consolidateAt is the number of packs past which a vault's packs are made
// one; a variable for tests.
var consolidateAt = 32

// packGrace is how long a pack is seen unrecorded before it is deleted; a
// variable for tests.
var packGrace = 10 * time.Minute

// packSweeps keeps, per pack key, when a sweep first saw it unrecorded,
// and per vault when it was last swept.
type packSweeps struct {
	mu        sync.Mutex
	unseen    map[string]time.Time // pack key → first seen unrecorded
	lastSwept map[string]time.Time // vault ID → last sweep
}

// packsSoon consolidates v's packs in the background if they are past
// consolidateAt, and sweeps its unrecorded ones now and then.
func (s *Service) packsSoon(v store.Vault) {
	s.background(func(ctx context.Context) {
		if err := s.consolidate(ctx, v); err != nil && ctx.Err() == nil {
			s.log.Warn("consolidating a vault's packs", "vault", v.ID, "err", err)
		}
		s.sweeps.mu.Lock()
		due := time.Since(s.sweeps.lastSwept[v.ID]) >= packGrace
		if due {
			s.sweeps.lastSwept[v.ID] = time.Now()
		}
		s.sweeps.mu.Unlock()
		if due {
			if err := s.sweepPacks(ctx, v); err != nil && ctx.Err() == nil {
				s.log.Warn("sweeping a vault's packs", "vault", v.ID, "err", err)
			}
		}
	})
}

// consolidate makes v's packs one if there are more than consolidateAt.
func (s *Service) consolidate(ctx context.Context, v store.Vault) error {
	// Most pushes leave fewer: they neither wait for the vault's lock nor
	// bring the cache up to the store for nothing.
	if _, packs, err := s.cfg.Store.VaultState(ctx, v.ID); err != nil || len(packs) <= consolidateAt {
		return err
	}
	unlock := s.lock(v.ID)
	defer unlock()
	dir, err := s.ensure(ctx, v)
	if err != nil {
		return err
	}
	_, packs, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil || len(packs) <= consolidateAt {
		return err
	}
	// -a: every object of every pack (the cache holds the store's packs
	// and nothing else, ensure saw to it), into one pack; -d: the packs it
	// holds removed. The cache is the store's: git writes no objects it
	// does not hold.
	if _, err := s.run(ctx, dir, nil, nil, "repack", "-a", "-d", "-q", "--no-write-bitmap-index"); err != nil {
		return err
	}
	local, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "pack-*.pack"))
	if err != nil {
		return err
	}
	if len(local) != 1 {
		return fmt.Errorf("git repack left %d packs, want 1", len(local))
	}
	name, err := s.storePack(ctx, v, local[0])
	if err != nil {
		return err
	}
	if slices.Contains(packs, name) {
		return nil // the one pack it made is one of the vault's already
	}
	if err := s.cfg.Store.ReplaceVaultPacks(ctx, v.ID, packs, name); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			// Another node consolidated meanwhile: its pack is the
			// vault's, this one will be swept.
			return nil
		}
		return err
	}
	s.log.Info("vault packs consolidated", "vault", v.ID, "packs", len(packs), "into", name)
	return nil
}

// sweepPacks deletes from the object store v's packs that the store no
// longer records, once a sweep has seen them so for packGrace.
func (s *Service) sweepPacks(ctx context.Context, v store.Vault) error {
	keys, err := s.cfg.Blob.List(ctx, objectPrefix(v.ID)+"packs/")
	if err != nil {
		return err
	}
	_, packs, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return err
	}
	recorded := map[string]bool{}
	for _, p := range packs {
		recorded[packKey(v.ID, p)] = true
	}
	now := time.Now()
	var gone []string
	s.sweeps.mu.Lock()
	for _, k := range keys {
		if recorded[k] {
			delete(s.sweeps.unseen, k)
			continue
		}
		first, ok := s.sweeps.unseen[k]
		switch {
		case !ok:
			s.sweeps.unseen[k] = now
			if packGrace <= 0 {
				gone = append(gone, k)
			}
		case now.Sub(first) >= packGrace:
			gone = append(gone, k)
		}
	}
	s.sweeps.mu.Unlock()
	for _, k := range gone {
		if err := s.cfg.Blob.Delete(ctx, k); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		s.sweeps.mu.Lock()
		delete(s.sweeps.unseen, k)
		s.sweeps.mu.Unlock()
	}
	if len(gone) > 0 {
		s.log.Info("vault packs swept", "vault", v.ID, "deleted", len(gone))
	}
	return nil
}

// pruneLocal removes from the cache at dir the packs the store no longer
// records (consolidated into one it does, on this node or another), once
// ensure has fetched every pack the store records. The caller holds the
// vault's lock.
func pruneLocal(dir string, packs []string) error {
	if len(packs) == 0 {
		return nil // a vault without packs has nothing to prune
	}
	recorded := map[string]bool{}
	for _, p := range packs {
		recorded[p] = true
	}
	local, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "pack-*.pack"))
	if err != nil {
		return err
	}
	for _, p := range local {
		if recorded[filepath.Base(p)] {
			continue
		}
		// The index first: git takes a pack by its index.
		if err := os.Remove(strings.TrimSuffix(p, ".pack") + ".idx"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
