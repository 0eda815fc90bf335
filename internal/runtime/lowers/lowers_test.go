package lowers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMount gives each of two layers (the top one hiding a file of the
// bottom one by an overlay whiteout) an image, mounts each once for every
// caller, shares the bottom one with another template over it, and prunes an
// image when its layer is gone.
func TestMount(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "mkfs.erofs")
	dir := t.TempDir()
	bottom, top, other := filepath.Join(dir, "bottom"), filepath.Join(dir, "top"), filepath.Join(dir, "other")
	for _, d := range []string{bottom, top, other} {
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
	write(filepath.Join(other, "etc", "both"), "other")
	// A whiteout as the layer store writes them: a 0/0 character device.
	if err := unix.Mknod(filepath.Join(top, "etc", "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	// An opaque directory: the top's var/ hides everything below it.
	for _, d := range []string{filepath.Join(bottom, "var"), filepath.Join(top, "var")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bottom, "var", "hidden"), "bottom")
	write(filepath.Join(top, "var", "fresh"), "top")
	if err := unix.Setxattr(filepath.Join(top, "var"), "user.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	// What a build killed half way leaves, which New removes.
	os.MkdirAll(filepath.Join(dir, "lowers"), 0o700)
	write(filepath.Join(dir, "lowers", "0123.erofs.tmp"), "half")
	im, err := lowers.New(filepath.Join(dir, "lowers"), nil)
	if _, err := os.Stat(filepath.Join(dir, "lowers", "0123.erofs.tmp")); err == nil {
		t.Error("New left an image a build of an earlier run left half written")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lower, err := im.Mount(ctx, []string{top, bottom})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lowers.Discard(filepath.Join(dir, "lowers")) })
	if len(lower) != 2 {
		t.Fatalf("Mount returned %q for two layers", lower)
	}
	if err := os.WriteFile(filepath.Join(lower[0], "x"), nil, 0o644); err == nil {
		t.Error("an image is writable")
	}
	// The sandbox's view: an overlay of the images.
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := overlay.Mount(root, overlay.Options{Lower: lower, UserXattr: true, Xino: true, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	for name, want := range map[string]string{"etc/kept": "bottom", "etc/both": "top", "var/fresh": "top"} {
		if b, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
	for _, name := range []string{"etc/gone", "var/hidden"} {
		if _, err := os.Lstat(filepath.Join(root, name)); !os.IsNotExist(err) {
			t.Errorf("%s, whited out or under an opaque directory, shows: %v", name, err)
		}
	}
	again, err := im.Mount(ctx, []string{top, bottom})
	if err != nil || strings.Join(again, ":") != strings.Join(lower, ":") {
		t.Errorf("second mount: %q %v, want %q", again, err, lower)
	}
	// Another template over the same bottom layer shares its image.
	shared, err := im.Mount(ctx, []string{other, bottom})
	if err != nil {
		t.Fatal(err)
	}
	if shared[1] != lower[1] || shared[0] == lower[0] {
		t.Errorf("images of other over bottom: %q, of top over bottom: %q", shared, lower)
	}
	if images, _ := filepath.Glob(filepath.Join(dir, "lowers", "*.erofs")); len(images) != 3 {
		t.Errorf("images for three layers: %v", images)
	}
	// A layer gone: the next node's start prunes its image alone.
	if err := os.RemoveAll(top); err != nil {
		t.Fatal(err)
	}
	if _, err := lowers.New(filepath.Join(dir, "lowers"), nil); err != nil {
		t.Fatal(err)
	}
	if images, _ := filepath.Glob(filepath.Join(dir, "lowers", "*.erofs")); len(images) != 2 {
		t.Errorf("images left after top went: %v", images)
	}
	if _, err := os.Stat(lower[0] + ".erofs"); !os.IsNotExist(err) {
		t.Errorf("the image of the gone layer: %v", err)
	}
}

// TestMountConcurrent has many sandboxes of a new template start at once:
// its layer's image is built and mounted once for all of them. A start that
// gives up does not stop the build the others wait for.
func TestMountConcurrent(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "mkfs.erofs")
	dir := t.TempDir()
	layer, late := filepath.Join(dir, "layer"), filepath.Join(dir, "late")
	for _, d := range []string{layer, late} {
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			if err := os.WriteFile(filepath.Join(d, "data", fmt.Sprint(i)), bytes.Repeat([]byte{byte(i)}, 4096), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	im, err := lowers.New(filepath.Join(dir, "lowers"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lowers.Discard(filepath.Join(dir, "lowers")) })
	ctx := context.Background()
	const n = 8
	got := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = im.Mount(ctx, []string{layer}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || len(got[i]) != 1 || got[i][0] != got[0][0] {
			t.Fatalf("start %d: %q %v (start 0: %q)", i, got[i], errs[i], got[0])
		}
	}
	if m := mountsAt(t, got[0][0]); m != 1 {
		t.Errorf("the layer's image is mounted %d times", m)
	}
	if b, err := os.ReadFile(filepath.Join(got[0][0], "data", "199")); err != nil || len(b) != 4096 || b[0] != 199 {
		t.Errorf("a file of the image: %d bytes, %v", len(b), err)
	}

	gaveUp, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = im.Mount(gaveUp, []string{late}) // returns at once or when built
	lower, err := im.Mount(ctx, []string{late})
	if err != nil {
		t.Fatal(err)
	}
	if m := mountsAt(t, lower[0]); m != 1 {
		t.Errorf("the image of a layer whose first start gave up is mounted %d times", m)
	}
	if entries, err := os.ReadDir(filepath.Join(lower[0], "data")); err != nil || len(entries) != 200 {
		t.Errorf("the image of a layer whose first start gave up: %d files, %v", len(entries), err)
	}
}

// mountsAt counts the mounts at dir.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}
