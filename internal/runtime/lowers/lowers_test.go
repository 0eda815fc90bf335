package lowers_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMount merges two layers (the top one hiding a file of the bottom one
// by an overlay whiteout) into one image, mounts it once for every caller,
// and prunes it when a layer is gone.
func TestMount(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "mkfs.erofs")
	dir := t.TempDir()
	bottom, top := filepath.Join(dir, "bottom"), filepath.Join(dir, "top")
	for _, d := range []string{bottom, top} {
		if err := os.MkdirAll(filepath.Join(d, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bottom, "etc", "kept"), "bottom")
	write(filepath.Join(bottom, "etc", "gone"), "bottom")
	write(filepath.Join(bottom, "etc", "both"), "bottom")
	write(filepath.Join(top, "etc", "both"), "top")
	// A whiteout as the layer store writes them: a 0/0 character device.
	if err := unix.Mknod(filepath.Join(top, "etc", "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	im, err := lowers.New(filepath.Join(dir, "lowers"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mnt, err := im.Mount(ctx, []string{top, bottom})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	for name, want := range map[string]string{"kept": "bottom", "both": "top"} {
		if b, err := os.ReadFile(filepath.Join(mnt, "etc", name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(mnt, "etc", "gone")); !os.IsNotExist(err) {
		t.Errorf("a whited-out file is in the image: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644); err == nil {
		t.Error("the image is writable")
	}
	again, err := im.Mount(ctx, []string{top, bottom})
	if err != nil || again != mnt {
		t.Errorf("second mount: %q %v, want %q", again, err, mnt)
	}
	// A layer gone: the next node's start prunes the image.
	if err := os.RemoveAll(top); err != nil {
		t.Fatal(err)
	}
	if _, err := lowers.New(filepath.Join(dir, "lowers"), nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "lowers", "*")); len(left) > 0 {
		t.Errorf("left after prune: %v", left)
	}
}
