package runtimetest

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// What a runtime's Env.Leftovers and Env.Processes look for on the host.

// Mounts lists the mounts that name sandbox id, as "mount: <mountinfo
// line>".
func Mounts(id string) []string {
	var out []string
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), id) {
			out = append(out, "mount: "+sc.Text())
		}
	}
	return out
}

// CgroupPIDs lists the PIDs in cgroup group (a path below the cgroup root,
// "atoll/<id>"): the v1 pids hierarchy's or, failing that, the unified
// one's.
func CgroupPIDs(group string) []int {
	var pids []int
	for _, f := range []string{"/sys/fs/cgroup/pids/" + group + "/cgroup.procs", "/sys/fs/cgroup/" + group + "/cgroup.procs"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(l); err == nil {
				pids = append(pids, pid)
			}
		}
		break
	}
	return pids
}
