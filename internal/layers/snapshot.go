package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
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

// RestoreWritable replaces sandbox sandboxID's writable layer with a writable
// copy of snapshot snapID in one step: the copy is made beside it and the two
// are exchanged atomically, so a crash leaves the old layer or the new one,
// and a spare (".restore") that the start-up sweep removes.
func (s *Store) RestoreWritable(snapID, sandboxID string, quota int64) error {
	spare := sandboxID + ".restore"
	_ = deleteSubvolume(s.WritableDir(spare))
	if _, err := s.cloneWritable(s.snapshotDir(snapID), spare, quota); err != nil {
		return err
	}
	err := unix.Renameat2(unix.AT_FDCWD, s.WritableDir(spare), unix.AT_FDCWD, s.WritableDir(sandboxID), unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) {
		err = os.Rename(s.WritableDir(spare), s.WritableDir(sandboxID))
	}
	if err != nil {
		_ = deleteSubvolume(s.WritableDir(spare))
		return fmt.Errorf("swapping in the restored layer: %w", err)
	}
	return deleteSubvolume(s.WritableDir(spare))
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
	ids, err := dirNames(filepath.Join(s.dir, "snapshots"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return ids, err
}

// SnapshotDir is snapshot id's directory: a read-only copy of a writable
// layer's (WritableDir).
func (s *Store) SnapshotDir(id string) string { return s.snapshotDir(id) }
