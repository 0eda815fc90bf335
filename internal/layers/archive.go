package layers

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Archives are tar streams of a writable layer or snapshot that keep what
// overlay needs: owners, modes, device-node whiteouts and extended attributes
// (opaque directories). They are atoll's own, from its archive store; GNU tar
// still refuses member names that leave the directory.

// PackWritable writes sandbox id's writable layer to w.
func (s *Store) PackWritable(id string, w io.Writer) error { return pack(s.WritableDir(id), w) }

// PackSnapshot writes snapshot id to w.
func (s *Store) PackSnapshot(id string, w io.Writer) error { return pack(s.snapshotDir(id), w) }

// UnpackWritable makes sandbox id's writable layer from a PackWritable
// stream, capped at quota bytes.
func (s *Store) UnpackWritable(id string, r io.Reader, quota int64) error {
	dir := s.WritableDir(id)
	if err := createSubvolume(dir); err != nil {
		return err
	}
	if err := limitSubvolume(dir, uint64(quota)); err != nil {
		return err
	}
	return unpack(dir, r)
}

// UnpackSnapshot makes snapshot id from a PackSnapshot stream, read-only as
// snapshots are. On failure the caller removes what was made with
// RemoveSnapshot.
func (s *Store) UnpackSnapshot(id string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "snapshots"), 0o700); err != nil {
		return err
	}
	dir := s.snapshotDir(id)
	if err := createSubvolume(dir); err != nil {
		return err
	}
	if err := unpack(dir, r); err != nil {
		return err
	}
	return setReadOnly(dir)
}

// SnapshotExists reports whether snapshot id is on local disk.
func (s *Store) SnapshotExists(id string) bool {
	_, err := os.Stat(s.snapshotDir(id))
	return err == nil
}

func pack(dir string, w io.Writer) error {
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", dir, "-cf", "-", ".")
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("packing %s: %v: %s", filepath.Base(dir), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

func unpack(dir string, r io.Reader) error {
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-p", "-C", dir, "-xf", "-")
	cmd.Stdin = r
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("unpacking %s: %v: %s", filepath.Base(dir), err, bytes.TrimSpace(stderr.Bytes()))
	}
	if _, err := os.Stat(filepath.Join(dir, "upper")); err != nil {
		return fmt.Errorf("unpacked archive has no upper layer")
	}
	// On disk before the caller deletes the archive.
	return syncFS(dir)
}

// A template layer moves between the nodes of a cluster as a tar of its
// directory in the same form: overlay whiteouts and opaque markers as they
// are on disk. PackLayer makes the same bytes for the same tree (entries
// sorted, no access or change times), so that a layer published twice is
// one object.

// PackLayer writes template layer id to w.
func (s *Store) PackLayer(id string, w io.Writer) error {
	if !s.HasLayer(id) {
		return fmt.Errorf("%w: layer %s", errdefs.ErrNotFound, shortID(id))
	}
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "--sort=name",
		"--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
		"-C", s.LayerDir(id), "-cf", "-", ".")
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("packing layer %s: %v: %s", shortID(id), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// AddPackedLayer makes template layer id from a PackLayer stream, which
// the caller has checked (its digest is the one recorded for it): the
// layer appears whole, once unpacked and on disk, or not at all. Adding a
// layer the store has is a no-op, and of concurrent adds the first to
// finish wins.
func (s *Store) AddPackedLayer(id string, r io.Reader) error {
	if !validLayerID(id) {
		return fmt.Errorf("%w: layer id %q", errdefs.ErrInvalid, id)
	}
	if s.HasLayer(id) {
		return nil
	}
	tmp, err := os.MkdirTemp(s.layersDir(), tmpPrefix+"pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-p", "-C", tmp, "-xf", "-")
	cmd.Stdin = r
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("unpacking layer %s: %v: %s", shortID(id), err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := syncFS(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.LayerDir(id)); err != nil && !s.HasLayer(id) {
		return fmt.Errorf("adding layer %s: %w", shortID(id), err)
	}
	return nil
}
