package main

import (
	"bufio"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
)

// nodeCapacity is what this node offers a cluster: the flag's figures
// (--node-capacity cpu=8,memory=16Gi,disk=200Gi,sandboxes=500), and for
// those it leaves out, the host's: its cores, its memory less what the
// host keeps for itself, the free space of the data directory, and a
// sandbox count those allow.
func nodeCapacity(flag, dataDir string) (store.Resources, error) {
	c := store.Resources{CPU: float64(goruntime.NumCPU())}
	if mem, err := memTotalMiB(); err == nil {
		c.MemoryMiB = mem - min(mem/8, 2048) // the host's own share
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dataDir, &st); err == nil {
		c.DiskGiB = int64(st.Bavail) * st.Bsize >> 30
	}
	c.Sandboxes = 1000
	if flag == "" {
		return c, nil
	}
	for _, kv := range strings.Split(flag, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return c, fmt.Errorf("--node-capacity %q: want KEY=VALUE pairs (cpu, memory, disk, sandboxes)", kv)
		}
		var err error
		switch k {
		case "cpu":
			c.CPU, err = strconv.ParseFloat(v, 64)
			if err == nil && !(c.CPU > 0 && c.CPU <= 1<<16) {
				err = fmt.Errorf("out of range")
			}
		case "memory":
			c.MemoryMiB, err = parseSize(v, 20)
		case "disk":
			c.DiskGiB, err = parseSize(v, 30)
		case "sandboxes":
			c.Sandboxes, err = strconv.Atoi(v)
			if err == nil && (c.Sandboxes < 1 || c.Sandboxes > 1<<20) {
				err = fmt.Errorf("out of range")
			}
		default:
			err = fmt.Errorf("unknown key (want cpu, memory, disk, sandboxes)")
		}
		if err != nil {
			return c, fmt.Errorf("--node-capacity %s: %w", kv, err)
		}
	}
	return c, nil
}

// parseSize reads a size with an optional Ki/Mi/Gi/Ti suffix (a bare
// number is in the unit, 2^shift bytes) and returns it in that unit.
func parseSize(v string, shift uint) (int64, error) {
	mult := map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}
	unit := shift
	for suf, sh := range mult {
		if n, ok := strings.CutSuffix(v, suf); ok {
			v, unit = n, sh
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > 1<<40 {
		return 0, fmt.Errorf("%q: want a positive size such as 16Gi", v)
	}
	if unit >= shift {
		return n << (unit - shift), nil
	}
	return n >> (shift - unit), nil
}

// memTotalMiB is the host's memory, from /proc/meminfo.
func memTotalMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb >> 10, err
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}

// nodeLabels reads --node-label KEY=VALUE flags.
func nodeLabels(flags []string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range flags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || len(k) > 63 || len(v) > 63 {
			return nil, fmt.Errorf("--node-label %q: want KEY=VALUE (each at most 63 bytes)", kv)
		}
		if k == api.NodeNameLabel {
			return nil, fmt.Errorf("--node-label %q: %s is the node's name, set by atoll", kv, api.NodeNameLabel)
		}
		labels[k] = v
	}
	return labels, nil
}
