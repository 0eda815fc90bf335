package netns_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// inode is the calling thread's network namespace, as its nsfs inode.
func inode(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestLifecycle makes a namespace, runs in it, renames and removes it.
func TestLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root")
	}
	dir := t.TempDir()
	if err := netns.PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	host := inode(t)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	var made uint64
	if err := netns.Create(a, func() error { made = inode(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if made == 0 || made == host {
		t.Fatalf("setup ran in namespace %d, the host's is %d", made, host)
	}
	if !netns.Mounted(a) {
		t.Fatal("Create's namespace is not mounted")
	}
	if err := netns.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if netns.Mounted(a) || !netns.Mounted(b) {
		t.Fatalf("after Rename: old mounted %v, new mounted %v", netns.Mounted(a), netns.Mounted(b))
	}
	var in uint64
	boom := errors.New("boom")
	err := netns.Run(b, func() error { in = inode(t); return boom })
	if !errors.Is(err, boom) {
		t.Errorf("Run returned %v, want fn's error", err)
	}
	if in != made {
		t.Errorf("Run ran in namespace %d, want %d", in, made)
	}
	if got := inode(t); got != host {
		t.Errorf("caller's namespace is %d after Run, want %d", got, host)
	}
	if err := netns.Remove(b); err != nil {
		t.Fatal(err)
	}
	if netns.Mounted(b) {
		t.Error("Remove left the namespace mounted")
	}
	if err := netns.Remove(b); err != nil {
		t.Errorf("Remove of a gone namespace: %v", err)
	}
	// A failed setup leaves nothing at the path.
	if err := netns.Create(a, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Create with a failing setup returned %v", err)
	}
	if _, err := os.Lstat(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Create left %s: %v", a, err)
	}
	if err := netns.Run(filepath.Join(dir, "missing"), func() error { return nil }); err == nil {
		t.Error("Run in a missing namespace succeeded")
	}
}
