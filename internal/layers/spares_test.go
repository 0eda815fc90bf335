package layers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestRecycleWritable: a small writable layer is emptied and kept, and the
// next sandbox's layer is that one, empty and under its own quota; a big
// one is deleted; a new store deletes the spares of the one before.
func TestRecycleWritable(t *testing.T) {
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	w, err := ls.CreateWritable("sbold", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	up := filepath.Join(w, "upper")
	// What a sandbox leaves: files, a locked directory, a symlink out, a
	// whiteout, a FIFO, and overlay's own work directory.
	must(t, os.MkdirAll(filepath.Join(up, "etc/secret"), 0o755))
	must(t, os.WriteFile(filepath.Join(up, "etc/secret/key"), []byte("tenant A"), 0o600))
	must(t, os.Chmod(filepath.Join(up, "etc/secret"), 0))
	must(t, os.Symlink("/etc/passwd", filepath.Join(up, "link")))
	must(t, unix.Mknod(filepath.Join(up, "gone"), unix.S_IFCHR, 0))
	must(t, unix.Mkfifo(filepath.Join(up, "fifo"), 0o600))
	must(t, os.Mkdir(filepath.Join(w, "work", "work"), 0))
	outside := filepath.Join(dir, "outside")
	must(t, os.WriteFile(outside, []byte("x"), 0o600))
	must(t, os.Symlink(outside, filepath.Join(up, "escape")))

	if err := ls.RecycleWritable("sbold"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(w); !os.IsNotExist(err) {
		t.Fatalf("the recycled layer is still at %s: %v", w, err)
	}
	if n := ls.SparesForTest(); n != 1 {
		t.Fatalf("%d spares after recycling a small layer, want 1", n)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("emptying the layer followed a symlink out: %v", err)
	}

	w2, err := ls.CreateWritable("sbnew", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.RemoveWritable("sbnew") })
	if n := ls.SparesForTest(); n != 0 {
		t.Errorf("%d spares after a create, want the spare taken", n)
	}
	for _, sub := range []string{"", "upper", "work"} {
		names := listDir(t, filepath.Join(w2, sub))
		want := 0
		if sub == "" {
			want = 2 // upper and work
		}
		if len(names) != want {
			t.Errorf("the new layer's %q holds %v", sub, names)
		}
	}
	if _, quota, err := ls.WritableUsage("sbnew"); err != nil || quota != 32<<20 {
		t.Errorf("the reused layer's quota is %d (%v), want %d", quota, err, 32<<20)
	}

	// A layer holding many files is deleted, not kept.
	wb, err := ls.CreateWritable("sbbig", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		must(t, os.WriteFile(filepath.Join(wb, "upper", fmt.Sprint(i)), nil, 0o644))
	}
	if err := ls.RecycleWritable("sbbig"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wb); !os.IsNotExist(err) {
		t.Errorf("the big layer is still there: %v", err)
	}
	if n := ls.SparesForTest(); n != 0 {
		t.Errorf("a big layer became a spare (%d)", n)
	}
	// Nor is a layer with a big file.
	wf, err := ls.CreateWritable("sbfile", 0)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(wf, "upper", "big"), make([]byte, 8<<20), 0o644))
	must(t, ls.RecycleWritable("sbfile"))
	if n := ls.SparesForTest(); n != 0 {
		t.Errorf("a layer with 8 MiB became a spare (%d)", n)
	}

	// Spares do not outlive the store.
	if _, err := ls.CreateWritable("sbspare", 0); err != nil {
		t.Fatal(err)
	}
	must(t, ls.RecycleWritable("sbspare"))
	if n := ls.SparesForTest(); n != 1 {
		t.Fatalf("%d spares, want 1", n)
	}
	ls2, err := layers.Open(layers.Config{Dir: ls.Dir(), DirtyLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	if names := listDir(t, filepath.Join(ls2.Dir(), "spares")); len(names) != 0 {
		t.Errorf("a new store kept the old spares %v", names)
	}
	// Recycling what is not there is not an error.
	if err := ls2.RecycleWritable("nosuchsandbox"); err != nil {
		t.Errorf("recycling a missing layer: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
