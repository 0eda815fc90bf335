package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Snapshots are read-only btrfs snapshots of writable layers. Taking one,
// forking a writable layer and starting a writable layer from a snapshot all
// cost the same whatever the layer holds: btrfs shares the data.

func (s *Store) snapshotDir(id string) string { return filepath.Join(s.dir, "snapshots", id) }

// SnapshotWritable takes snapshot snapID of sandbox sandboxID's writable layer.
// The caller makes sure nothing writes to it meanwhile (a frozen or stopped
// sandbox); btrfs flushes what was written before.
func (s *Store) SnapshotWritable(sandboxID, snapID string) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "snapshots"), 0o700); err != nil {
		return err
	}
	return snapshotSubvolume(s.WritableDir(sandboxID), s.snapshotDir(snapID), true)
}

// WritableFromSnapshot makes sandbox sandboxID's writable layer a writable
// copy of snapshot snapID, capped at quota bytes.
func (s *Store) WritableFromSnapshot(snapID, sandboxID string, quota int64) (string, error) {
	return s.cloneWritable(s.snapshotDir(snapID), sandboxID, quota)
}

// ForkWritable makes child's writable layer a copy of parent's.
func (s *Store) ForkWritable(parent, child string, quota int64) (string, error) {
	return s.cloneWritable(s.WritableDir(parent), child, quota)
}

func (s *Store) cloneWritable(src, sandboxID string, quota int64) (string, error) {
	dst := s.WritableDir(sandboxID)
	if _, err := os.Stat(dst); err == nil {
		return "", fmt.Errorf("writable layer of %s exists", sandboxID)
	}
	if err := snapshotSubvolume(src, dst, false); err != nil {
		return "", err
	}
	if err := limitSubvolume(dst, uint64(quota)); err != nil {
		return "", fmt.Errorf("setting disk quota: %w", err)
	}
	return dst, nil
}

// RemoveSnapshot deletes snapshot snapID.
func (s *Store) RemoveSnapshot(snapID string) error {
	return deleteSubvolume(s.snapshotDir(snapID))
}

// SnapshotIDs lists the snapshots on disk, for the start-up sweep.
func (s *Store) SnapshotIDs() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "snapshots"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids, nil
}
