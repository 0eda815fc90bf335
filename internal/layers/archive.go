package layers

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// PackWritable writes sandbox id's writable layer to w as a tar stream that
// keeps what overlay needs: owners, modes, device-node whiteouts and
// extended attributes (opaque directories).
func (s *Store) PackWritable(id string, w io.Writer) error {
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", s.WritableDir(id), "-cf", "-", ".")
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("packing writable layer: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// UnpackWritable makes sandbox id's writable layer from a PackWritable stream,
// capped at quota bytes. The stream is atoll's own, from its archive store;
// GNU tar still refuses member names that leave the directory.
func (s *Store) UnpackWritable(id string, r io.Reader, quota int64) error {
	dir := s.WritableDir(id)
	if err := createSubvolume(dir); err != nil {
		return err
	}
	if err := limitSubvolume(dir, uint64(quota)); err != nil {
		return err
	}
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-p", "-C", dir, "-xf", "-")
	cmd.Stdin = r
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("unpacking writable layer: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if _, err := os.Stat(filepath.Join(dir, "upper")); err != nil {
		return fmt.Errorf("unpacked archive has no upper layer")
	}
	// On disk before the caller deletes the archive.
	return syncFS(dir)
}
