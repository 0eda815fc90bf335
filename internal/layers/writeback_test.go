package layers_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestWritebackBound checks that the store bounds its filesystem's dirty data
// (strict bdi limit, loop device with direct I/O), on the first open and on an
// open that finds the image already mounted, as after a server restart; and
// that a snapshot right after a large unsynced write then takes little time.
func TestWritebackBound(t *testing.T) {
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	fs, err := layers.BtrfsSysfs(ls.Dir())
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	loops, _ := filepath.Glob(filepath.Join(fs, "devices", "loop*"))
	if len(loops) != 1 {
		t.Fatalf("loop devices under the store: %v", loops)
	}
	dio := filepath.Join("/sys/block", filepath.Base(loops[0]), "loop", "dio")
	check := func(when string) {
		t.Helper()
		// The kernel keeps the limit as a ratio of its global one: it
		// reads back close to, not exactly, what was written.
		got, _ := strconv.ParseInt(read(filepath.Join(fs, "bdi", "max_bytes")), 10, 64)
		if got < layers.DefaultDirtyLimit*99/100 || got > layers.DefaultDirtyLimit*101/100 {
			t.Errorf("%s: bdi max_bytes %d, want about %d", when, got, layers.DefaultDirtyLimit)
		}
		if s := read(filepath.Join(fs, "bdi", "strict_limit")); s != "1" {
			t.Errorf("%s: bdi strict_limit %s, want 1", when, s)
		}
		if s := read(dio); s != "1" {
			t.Errorf("%s: loop device direct I/O %s, want 1", when, s)
		}
	}
	check("first open")

	// Undo both by hand, then open the mounted store again.
	if err := os.WriteFile(filepath.Join(fs, "bdi", "strict_limit"), []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fs, "bdi", "max_bytes"), []byte(strconv.Itoa(1<<30)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := layers.Open(layers.Config{Dir: ls.Dir()}); err != nil {
		t.Fatal(err)
	}
	check("open of the mounted image")

	// 512 MiB written and not synced: with the bound, the snapshot finds
	// little left to flush. (Without it, it flushes it all twice over, to
	// the image file's page cache and from there to the disk: seconds.)
	w, err := ls.CreateWritable("w", 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(w, "upper", "data"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for i := 0; i < 512; i++ {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	t0 := time.Now()
	if err := ls.SnapshotWritable("w", "s"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	t.Logf("snapshot right after 512 MiB written: %v", took)
	// Generous for a loaded machine: bounded, it is tens of milliseconds.
	if took > time.Second {
		t.Errorf("snapshot right after 512 MiB written took %v", took)
	}
	if err := ls.RemoveSnapshot("s"); err != nil {
		t.Error(err)
	}
	if err := ls.RemoveWritable("w"); err != nil {
		t.Error(err)
	}
}
