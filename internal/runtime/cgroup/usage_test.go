package cgroup

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReadUsageV2 reads a v2 cgroup's files as the kernel writes them. The
// hosts here are hybrid (v1 controllers), so the live reads of the runtime
// conformance suite take the v1 path; this keeps the v2 one honest.
func TestReadUsageV2(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
		"memory.current": "157286400\n",
		"memory.stat":    "anon 134217728\nfile 20971520\nkernel 2097152\nshmem 4194304\nfile_mapped 0\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := readUsageV2(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{CPU: 2500 * time.Millisecond, MemoryBytes: 157286400, FileBytes: 20971520, ShmemBytes: 4194304}
	if u != want {
		t.Errorf("got %+v, want %+v", u, want)
	}
	// A file without the key is an error, not a zero.
	os.WriteFile(filepath.Join(dir, "memory.stat"), []byte("anon 1\n"), 0o644)
	if _, err := readUsageV2(dir); err == nil {
		t.Error("memory.stat without file: no error")
	}
	if _, err := readUsageV2(filepath.Join(dir, "gone")); err == nil {
		t.Error("a missing cgroup: no error")
	}
}
