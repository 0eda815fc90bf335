package ns_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.Dir(t)
	ls := testenv.Layers(t, dir)
	runRoot := filepath.Join(dir, "run")
	rt, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(runRoot) })
	runtimetest.Run(t, rt, runtimetest.Env{
		Layers:    ls,
		AgentPath: testenv.AgentBinary(t),
		Leftovers: func(id string) []string { return leftovers(runRoot, id) },
		Processes: processes,
		Network:   sandboxNetworks(t),
	})
}

// sandboxNetworks gives sandboxes networks from a network.Manager whose
// host is a private namespace, or nil when the kernel cannot.
func sandboxNetworks(t *testing.T) func(testing.TB, int) *runtime.Network {
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
		return nil
	}
	b := make([]byte, 3)
	rand.Read(b)
	id := "ns" + hex.EncodeToString(b)
	host := nettest.NewNetns(t, "atollt-"+id+"-host")
	m, err := network.New(network.Config{Bridge: id, HostNetns: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Teardown(context.Background()); err != nil {
			t.Errorf("network teardown: %v", err)
		}
		m.Close()
	})
	return func(t testing.TB, slot int) *runtime.Network {
		a, err := m.Attach(context.Background(), slot, egress.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Release(context.Background(), slot) })
		return &runtime.Network{Netns: a.Netns, Addrs: []netip.Addr{a.Addr4.Addr(), a.Addr6.Addr()}, Nameservers: a.Resolvers}
	}
}

// leftovers lists what a stopped sandbox might have left on the host.
func leftovers(runRoot, id string) []string {
	var out []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.Contains(sc.Text(), id) {
				out = append(out, "mount: "+sc.Text())
			}
		}
		f.Close()
	}
	for _, c := range []string{"/sys/fs/cgroup/memory/atoll/" + id, "/sys/fs/cgroup/pids/atoll/" + id, "/sys/fs/cgroup/atoll/" + id} {
		if _, err := os.Stat(c); err == nil {
			out = append(out, "cgroup: "+c)
		}
	}
	if _, err := os.Stat(filepath.Join(runRoot, id)); err == nil {
		out = append(out, "dir: "+filepath.Join(runRoot, id))
	}
	return out
}

// processes lists the PIDs in sandbox id's cgroup.
func processes(id string) []int {
	var pids []int
	for _, f := range []string{"/sys/fs/cgroup/pids/atoll/" + id + "/cgroup.procs", "/sys/fs/cgroup/atoll/" + id + "/cgroup.procs"} {
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

func unmountAll(dir string) {
	_ = exec("umount", "-l", dir)
}

func exec(name string, args ...string) error {
	return osexec.Command(name, args...).Run()
}
