package layers_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWritableUsage: a writable layer's use grows with what is written into
// it, up to its quota, and the quota is the one it was given.
func TestWritableUsage(t *testing.T) {
	ls := newStore(t)
	w, err := ls.CreateWritable("sbusage", 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.RemoveWritable("sbusage") })
	sync := func() {
		t.Helper()
		// Quota groups count at the transaction commit, which syncfs
		// forces.
		f, err := os.Open(w)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Syncfs(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	before, quota, err := ls.WritableUsage("sbusage")
	if err != nil {
		t.Fatal(err)
	}
	if quota != 256<<20 {
		t.Errorf("quota %d, want %d", quota, 256<<20)
	}
	if err := os.WriteFile(filepath.Join(w, "upper", "big"), make([]byte, 32<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	sync()
	after, _, err := ls.WritableUsage("sbusage")
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 32<<20 || after > 64<<20 {
		t.Errorf("writing 32 MiB took the use from %d to %d", before, after)
	}
	if _, _, err := ls.WritableUsage("nosuchsandbox"); err == nil {
		t.Error("a missing layer's usage: no error")
	}
}
