package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMountManyLayers stacks 200 layers whose paths together pass a page:
// each layer's file shows, the top one's copy of a shared file wins, a
// whiteout hides a bottom layer's file, and writes go to the upper layer.
func TestMountManyLayers(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	const n = 200
	var lower []string
	for i := range n {
		l := filepath.Join(dir, fmt.Sprintf("a-layer-with-a-name-long-enough-to-pass-a-page-%03d", i))
		if err := os.MkdirAll(l, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{fmt.Sprintf("f%d", i): "x", "both": fmt.Sprint(i)} {
			if err := os.WriteFile(filepath.Join(l, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		lower = append(lower, l)
	}
	if err := os.WriteFile(filepath.Join(lower[n-1], "gone"), []byte("bottom"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(lower[0], "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if len(strings.Join(lower, ":")) <= unix.Getpagesize() {
		t.Fatal("the layers' paths fit in a page: the test proves nothing")
	}
	upper, work, root := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "root")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := Mount(root, Options{Lower: lower, Upper: upper, Work: work, Xino: true, NoDev: true, NoSuid: true}); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	for i := range n {
		if _, err := os.Stat(filepath.Join(root, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatalf("layer %d's file: %v", i, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "both")); err != nil || string(b) != "0" {
		t.Errorf("the shared file: %q %v, want the top layer's", b, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "gone")); !os.IsNotExist(err) {
		t.Errorf("a whited-out file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "new"), []byte("w"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(upper, "new")); err != nil {
		t.Errorf("a write did not reach the upper layer: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Flags&unix.ST_NODEV == 0 || st.Flags&unix.ST_NOSUID == 0 {
		t.Errorf("the overlay's flags: %#x %v, want nodev and nosuid", st.Flags, err)
	}

	ro := filepath.Join(dir, "ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Mount(ro, Options{Lower: lower, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(ro, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); err == nil {
		t.Error("wrote to a read-only overlay")
	}

	// mount(2), as on a kernel before 6.8, says why it cannot.
	if err := mountOld(filepath.Join(dir, "ro"), Options{Lower: lower, ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "page") {
		t.Errorf("mount(2) of %d layers: %v", n, err)
	}
	many := make([]string, MaxLayers+1)
	for i := range many {
		many[i] = lower[i%n]
	}
	if err := Mount(ro, Options{Lower: many, ReadOnly: true}); err == nil {
		t.Errorf("%d layers mounted", len(many))
	}
	if err := Mount(ro, Options{Lower: []string{filepath.Join(dir, "missing")}, ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing layer: %v", err)
	}
}

// TestVolatileRemount mounts a volatile overlay again on the same work
// directory, which the kernel refuses while its mark of an earlier mount is
// there, with either mount API, and checks that each mount is volatile.
func TestVolatileRemount(t *testing.T) {
	testenv.RequireRoot(t)
	old := func(target string, o Options) error {
		if err := clearVolatileMark(o); err != nil {
			return err
		}
		return mountOld(target, o)
	}
	for name, mount := range map[string]func(string, Options) error{"fsconfig": Mount, "mount(2)": old} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			lower, upper, work, root := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "root")
			for _, d := range []string{lower, upper, work, root} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			o := Options{Lower: []string{lower}, Upper: upper, Work: work, Volatile: true}
			for i := range 3 {
				if i > 0 {
					if _, err := os.Stat(filepath.Join(work, volatileMark)); err != nil {
						t.Fatalf("no volatile mark after mount %d (%v): the test proves nothing", i, err)
					}
				}
				if err := mount(root, o); err != nil {
					t.Fatalf("mount %d: %v", i+1, err)
				}
				if err := os.WriteFile(filepath.Join(root, fmt.Sprint("f", i)), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				if line := mountLine(t, root); !testenv.MountedVolatile(line) {
					t.Errorf("mount %d is not volatile: %s", i+1, line)
				}
				if err := unix.Unmount(root, 0); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 3 {
				if _, err := os.Stat(filepath.Join(upper, fmt.Sprint("f", i))); err != nil {
					t.Errorf("mount %d's write: %v", i+1, err)
				}
			}
		})
	}
}

// mountLine is the line of /proc/self/mountinfo for the mount at target.
func mountLine(t *testing.T, target string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == target {
			return line
		}
	}
	t.Fatalf("%s is not mounted", target)
	return ""
}
