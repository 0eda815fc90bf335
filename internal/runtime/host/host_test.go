package host

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMain runs the helper process of TestInMountNamespaceKilled when asked.
func TestMain(m *testing.M) {
	if dir := os.Getenv("ATOLL_TEST_MOUNT_AND_WAIT"); dir != "" {
		InMountNamespace(func() error {
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
				os.Stdout.WriteString("mount: " + err.Error() + "\n")
				os.Exit(1)
			}
			os.Stdout.WriteString("mounted\n")
			time.Sleep(time.Hour) // until killed
			return nil
		})
	}
	os.Exit(m.Run())
}

func TestInMountNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	err := InMountNamespace(func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
			return err
		}
		// Seen by this thread and what it starts, not by the process's
		// other threads (the host's namespace).
		out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE", dir).Output()
		if err != nil || strings.TrimSpace(string(out)) != "tmpfs" {
			t.Errorf("a command started inside does not see the mount: %q %v", out, err)
		}
		if m := MountsUnder(dir); len(m) > 0 {
			t.Errorf("the host sees %v", m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m := MountsUnder(dir); len(m) > 0 {
		t.Errorf("left on the host: %v", m)
	}
}

// TestInMountNamespaceKilled: the mounts go when the process that made them
// is killed mid-way, without any clean-up of its own.
func TestInMountNamespaceKilled(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_TEST_MOUNT_AND_WAIT="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if string(buf[:n]) != "mounted\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %q", buf[:n])
	}
	if !mountedAnywhere(dir) {
		t.Fatal("the helper's mount is not seen in its own namespace")
	}
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if len(MountsUnder(dir)) == 0 && !mountedAnywhere(dir) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("mount under %s outlived the process that made it", dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountedAnywhere reports whether any thread of any process sees a mount at
// dir, in whatever mount namespace.
func mountedAnywhere(dir string) bool {
	infos, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/mountinfo")
	for _, p := range infos {
		b, _ := os.ReadFile(p)
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && unescapeMountinfo(f[4]) == dir {
				return true
			}
		}
	}
	return false
}

// TestRemoveDir removes a run directory without mounts, and one with a
// directory and a file bound into it: the binds are unmounted, what they
// showed is left alone, and the directory is gone.
func TestRemoveDir(t *testing.T) {
	testenv.RequireRoot(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bind := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.MkdirAll(filepath.Join(dir, "mnt", "l0"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "mnt", "f"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if noMounts(dir) != true {
			t.Errorf("noMounts of a directory without mounts: false")
		}
		if bind {
			if err := unix.Mount(outside, filepath.Join(dir, "mnt", "l0"), "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount(filepath.Join(outside, "keep"), filepath.Join(dir, "mnt", "f"), "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			if noMounts(dir) {
				t.Errorf("noMounts of a directory with binds: true")
			}
		}
		if err := RemoveDir(dir); err != nil {
			t.Fatalf("bind %v: %v", bind, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("bind %v: %s after RemoveDir: %v", bind, dir, err)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "x" {
			t.Errorf("bind %v: the bound directory's file after RemoveDir: %q %v", bind, b, err)
		}
		if m := MountsUnder(dir); len(m) > 0 {
			t.Errorf("bind %v: left mounted: %v", bind, m)
		}
	}
}

// TestPrivateTmpfs: an empty state directory becomes a private tmpfs, once;
// one holding an earlier version's state stays on its file system, bound
// privately on itself.
func TestPrivateTmpfs(t *testing.T) {
	testenv.RequireRoot(t)
	fsType := func(dir string) int64 {
		t.Helper()
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Type
	}
	mounts := func(dir string) (n int, private bool) {
		t.Helper()
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		private = true
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 6 && f[4] == dir {
				n++
				private = private && !strings.Contains(line, "shared:")
			}
		}
		return n, private
	}

	empty := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(empty, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(empty, unix.MNT_DETACH) })
	for range 2 {
		if err := PrivateTmpfs(empty); err != nil {
			t.Fatal(err)
		}
	}
	if fsType(empty) != unix.TMPFS_MAGIC {
		t.Error("an empty state directory is not a tmpfs")
	}
	if n, private := mounts(empty); n != 1 || !private {
		t.Errorf("%d mounts at the state directory, private %v; want one, private", n, private)
	}
	if fi, err := os.Stat(empty); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("the tmpfs's mode: %v %v, want 0711", fi.Mode(), err)
	}

	used := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(filepath.Join(used, "sandbox1"), 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(used, unix.MNT_DETACH) })
	before := fsType(used)
	if err := PrivateTmpfs(used); err != nil {
		t.Fatal(err)
	}
	if fsType(used) != before {
		t.Error("a state directory holding state was mounted over")
	}
	if _, err := os.Stat(filepath.Join(used, "sandbox1")); err != nil {
		t.Errorf("its state is hidden: %v", err)
	}
	if n, private := mounts(used); n != 1 || !private {
		t.Errorf("%d mounts at the used state directory, private %v; want one, private", n, private)
	}
}
