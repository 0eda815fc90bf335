package layers_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotArchiveRoundTrip packs a snapshot, removes it and unpacks it:
// contents, a whiteout and an opaque directory come back, read-only, and a
// writable layer can be made from it again.
func TestSnapshotArchiveRoundTrip(t *testing.T) {
	ls := newStore(t)
	w, err := ls.CreateWritable("sb1", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(w, "upper")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(upper, "root", "opaque"), 0o755))
	must(os.WriteFile(filepath.Join(upper, "root", "file"), []byte("kept"), 0o640))
	must(os.Chown(filepath.Join(upper, "root", "file"), 1000, 1000))
	must(unix.Mknod(filepath.Join(upper, "root", "gone"), unix.S_IFCHR, 0))
	must(unix.Setxattr(filepath.Join(upper, "root", "opaque"), "user.overlay.opaque", []byte("y"), 0))
	must(ls.SnapshotWritable("sb1", "snap1"))

	var buf bytes.Buffer
	must(ls.PackSnapshot("snap1", &buf))
	must(ls.RemoveSnapshot("snap1"))
	if ls.SnapshotExists("snap1") {
		t.Fatal("snapshot still there after RemoveSnapshot")
	}
	must(ls.UnpackSnapshot("snap1", &buf))
	t.Cleanup(func() { ls.RemoveSnapshot("snap1"); ls.RemoveWritable("sb1"); ls.RemoveWritable("sb2") })

	w2, err := ls.WritableFromSnapshot("snap1", "sb2", 1<<30)
	must(err)
	up2 := filepath.Join(w2, "upper", "root")
	if b, err := os.ReadFile(filepath.Join(up2, "file")); err != nil || string(b) != "kept" {
		t.Errorf("file: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(up2, "file"), &st); err != nil || st.Uid != 1000 || st.Mode&0o777 != 0o640 {
		t.Errorf("owner/mode of file: uid %d mode %o %v", st.Uid, st.Mode&0o777, err)
	}
	if err := unix.Lstat(filepath.Join(up2, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
	}
	val := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(up2, "opaque"), "user.overlay.opaque", val); err != nil || string(val[:n]) != "y" {
		t.Errorf("opaque xattr: %q %v", val[:n], err)
	}
	err = os.WriteFile(filepath.Join(ls.SnapshotDirForTest("snap1"), "upper", "new"), nil, 0o644)
	if !errors.Is(err, unix.EROFS) {
		t.Errorf("writing into an unpacked snapshot: %v, want EROFS", err)
	}
}

// TestRestoreWritable swaps a writable layer for a copy of a snapshot and
// leaves no spare behind.
func TestRestoreWritable(t *testing.T) {
	ls := newStore(t)
	w, err := ls.CreateWritable("sbr", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.RemoveSnapshot("snapr"); ls.RemoveWritable("sbr") })
	if err := os.WriteFile(filepath.Join(w, "upper", "old"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ls.SnapshotWritable("sbr", "snapr"); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(w, "upper", "old"))
	os.WriteFile(filepath.Join(w, "upper", "new"), []byte("2"), 0o644)
	if err := ls.RestoreWritable("snapr", "sbr", 1<<30); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(w, "upper", "old")); err != nil {
		t.Errorf("restored layer lacks the snapshot's file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(w, "upper", "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restored layer keeps a file written after the snapshot: %v", err)
	}
	if ids, _ := ls.WritableIDs(); len(ids) != 1 || ids[0] != "sbr" {
		t.Errorf("writable layers after the restore: %v", ids)
	}
}

// TestLayerPackRoundTrip packs a template layer twice (the same bytes: a
// layer published twice is one object), and adds it under its ID to
// another store: contents, owner, a whiteout and an opaque directory come
// back. A layer that is not there cannot be packed.
func TestLayerPackRoundTrip(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	dir, err := src.NewLayerDir()
	must(err)
	must(os.MkdirAll(filepath.Join(dir, "opt", "opaque"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "opt", "file"), []byte("kept"), 0o640))
	must(os.Chown(filepath.Join(dir, "opt", "file"), 1000, 1000))
	must(unix.Mknod(filepath.Join(dir, "opt", "gone"), unix.S_IFCHR, 0))
	must(unix.Setxattr(filepath.Join(dir, "opt", "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(src.CommitLayer(id, dir))

	var a, b bytes.Buffer
	must(src.PackLayer(id, &a))
	must(src.PackLayer(id, &b))
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("two packs of one layer differ (%d and %d bytes)", a.Len(), b.Len())
	}
	must(dst.AddPackedLayer(id, &a))
	if !dst.HasLayer(id) {
		t.Fatal("added layer missing")
	}
	got := filepath.Join(dst.LayerDir(id), "opt")
	var st unix.Stat_t
	if b, err := os.ReadFile(filepath.Join(got, "file")); err != nil || string(b) != "kept" {
		t.Errorf("file: %q %v", b, err)
	}
	if err := unix.Lstat(filepath.Join(got, "file"), &st); err != nil || st.Uid != 1000 || st.Mode&0o777 != 0o640 {
		t.Errorf("owner/mode of file: uid %d mode %o %v", st.Uid, st.Mode&0o777, err)
	}
	if err := unix.Lstat(filepath.Join(got, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
	}
	val := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(got, "opaque"), "trusted.overlay.opaque", val); err != nil || string(val[:n]) != "y" {
		t.Errorf("opaque xattr: %q %v", val[:n], err)
	}
	// Adding it again is a no-op; a bad ID or a missing layer is refused.
	must(dst.AddPackedLayer(id, bytes.NewReader(nil)))
	if err := dst.AddPackedLayer("../x", bytes.NewReader(nil)); err == nil {
		t.Error("AddPackedLayer took a malformed ID")
	}
	if err := src.PackLayer("ab"+id[2:], &b); err == nil {
		t.Error("PackLayer of a missing layer")
	}
}
