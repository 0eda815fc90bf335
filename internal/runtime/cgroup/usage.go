package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// Usage is what the processes of a cgroup have used.
type Usage struct {
	// CPU is their CPU time since the cgroup was made.
	CPU time.Duration
	// MemoryBytes is all the memory charged to the cgroup; FileBytes the
	// part of it that is page cache, which counts shared memory and tmpfs
	// files (ShmemBytes) too. Runtimes make different figures of them: in
	// gVisor the sandbox's own memory is shared memory the sentry maps.
	MemoryBytes int64
	FileBytes   int64
	ShmemBytes  int64
}

// ReadUsage reads the usage of the cgroup at path (below the hierarchy's
// root) on either hierarchy. It reads a handful of files rather than
// containerd's Stat, which reads every controller's every file: a sampler
// calls it for each sandbox every few seconds.
func ReadUsage(path string) (Usage, error) {
	if Unified() {
		return readUsageV2(filepath.Join("/sys/fs/cgroup", path))
	}
	dirs, err := v1Dirs()
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	ns, err := readInt(filepath.Join(dirs[cgroup1.Cpuacct], path, "cpuacct.usage"))
	if err != nil {
		return Usage{}, err
	}
	u.CPU = time.Duration(ns)
	// The total_ keys count the cgroups below too (a sandbox may make its
	// own); cache is the page cache, shmem and tmpfs included.
	if err := readMemory(&u, filepath.Join(dirs[cgroup1.Memory], path), "memory.usage_in_bytes", "total_cache", "total_shmem"); err != nil {
		return Usage{}, err
	}
	return u, nil
}

// readMemory reads into u the memory a cgroup uses, from its directory
// mem: all of it from file current, the page cache and shmem from the
// keys file and shmem of its memory.stat.
func readMemory(u *Usage, mem, current, file, shmem string) error {
	cur, err := readInt(filepath.Join(mem, current))
	if err != nil {
		return err
	}
	stat, err := readKeyed(filepath.Join(mem, "memory.stat"), file, shmem)
	if err != nil {
		return err
	}
	u.MemoryBytes, u.FileBytes, u.ShmemBytes = cur, stat[file], stat[shmem]
	return nil
}

// readUsageV2 reads the usage of the v2 cgroup at dir, a full path.
func readUsageV2(dir string) (Usage, error) {
	var u Usage
	cpu, err := readKeyed(filepath.Join(dir, "cpu.stat"), "usage_usec")
	if err != nil {
		return Usage{}, err
	}
	u.CPU = time.Duration(cpu["usage_usec"]) * time.Microsecond
	// file is v2's page cache, shmem and tmpfs included, as v1's cache.
	if err := readMemory(&u, dir, "memory.current", "file", "shmem"); err != nil {
		return Usage{}, err
	}
	return u, nil
}

// v1Dirs is where the v1 cpuacct and memory hierarchies are mounted.
func v1Dirs() (map[cgroup1.Name]string, error) {
	subs, err := v1Hierarchy()
	if err != nil {
		return nil, err
	}
	dirs := map[cgroup1.Name]string{}
	for _, s := range subs {
		if p, ok := s.(interface{ Path(string) string }); ok {
			dirs[s.Name()] = p.Path("/")
		}
	}
	for _, n := range []cgroup1.Name{cgroup1.Cpuacct, cgroup1.Memory} {
		if dirs[n] == "" {
			return nil, fmt.Errorf("no %s cgroup hierarchy", n)
		}
	}
	return dirs, nil
}

func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", filepath.Base(file), err)
	}
	return n, nil
}

// readKeyed reads the "key value" lines of file and returns the values of
// keys, all of which it must have.
func readKeyed(file string, keys ...string) (map[string]int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte{' '})
		if !ok || !want[string(k)] {
			continue
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %s: %w", filepath.Base(file), k, err)
		}
		out[string(k)] = n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			return nil, errors.New(filepath.Base(file) + " has no " + k)
		}
	}
	return out, nil
}
