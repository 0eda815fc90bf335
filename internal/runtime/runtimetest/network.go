package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// NetworkManager is a network.Manager whose host is a private namespace,
// torn down (and checked to be) when t ends; it skips where the kernel
// cannot make one.
func NetworkManager(t *testing.T) *network.Manager {
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
		return nil
	}
	b := make([]byte, 3)
	rand.Read(b)
	id := "rt" + hex.EncodeToString(b)
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
	return m
}

// Networks gives sandboxes networks from a NetworkManager, for
// Env.Network; each is released when its test ends.
func Networks(t *testing.T) func(testing.TB, int) *runtime.Network {
	m := NetworkManager(t)
	if m == nil {
		return nil
	}
	return func(t testing.TB, slot int) *runtime.Network {
		n := Attach(t, m, slot)
		t.Cleanup(func() { m.Release(context.Background(), slot) })
		return n
	}
}

// Attach gives slot a network from m under the default policy.
func Attach(t testing.TB, m *network.Manager, slot int) *runtime.Network {
	a, err := m.Attach(context.Background(), slot, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	return &runtime.Network{Netns: a.Netns, Addrs: []netip.Addr{a.Addr4.Addr(), a.Addr6.Addr()}, Nameservers: a.Resolvers}
}

// testNetworkCheckpoint checks that packets flow between a sandbox and its
// network, and flow again after a checkpoint restored into a namespace made
// anew for another slot: other addresses and another eth0, as a suspended
// sandbox resumes into or a memory fork's child starts in. The restored
// sandbox must have taken up the new addresses, not kept the old, and the
// hostname it was restored with.
func testNetworkCheckpoint(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	sb := newSandbox(t, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	sb.Spec.Network = env.Network(t, sb.slot)
	sb.start(t, rt)
	probeNetwork(t, sb)
	img := filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	old := sb.Spec.Network.Addrs[0]
	other := newSandbox(t, rt, env, runtime.Limits{}, 1<<30)
	sb.Spec.Network = env.Network(t, other.slot)
	mac := linkMAC(t, sb.Spec.Network.Netns)
	// As a memory fork's child is restored: its own hostname too.
	sb.Spec.Hostname = other.ID
	inst, err := cp.Restore(ctx, sb.Spec, img)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	sb.connect(inst)
	probeNetwork(t, sb)
	if out := sb.MustSh(t, "hostname"); out != other.ID+"\n" {
		t.Errorf("the restored sandbox's hostname: %q, want %s", out, other.ID)
	}
	// The new namespace's MAC (its slot's), not the saved one: sandboxes
	// restored from one checkpoint must not share a MAC on the bridge.
	if out := sb.MustSh(t, macScript); out != mac+"\n" {
		t.Errorf("the restored sandbox's MAC: %q, want its namespace's eth0's %s", out, mac)
	}
	if got := linkMAC(t, sb.Spec.Network.Netns); got != mac {
		t.Errorf("the namespace's eth0 has %s after the restore, had %s", got, mac)
	}
	script := fmt.Sprintf("python3 -c 'import socket; s = socket.socket(); s.bind((\"%s\", 0)); print(\"bound\")' 2>/dev/null", old)
	if out, _, _ := sb.Sh(t, script); out == "bound\n" {
		t.Errorf("the restored sandbox still has its old address %s", old)
	}
}

// macScript prints eth0's MAC as the sandbox sees it (SIOCGIFHWADDR).
const macScript = `python3 -c 'import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
b = fcntl.ioctl(s.fileno(), 0x8927, struct.pack("256s", b"eth0"))
print(":".join("%02x" % x for x in b[18:24]))'`

// linkMAC is the MAC of eth0 in the network namespace at path.
func linkMAC(t *testing.T, path string) string {
	t.Helper()
	var mac string
	err := netns.Run(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			mac = l.Attrs().HardwareAddr.String()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// family is a's address family, as python's socket module names it.
func family(a netip.Addr) string {
	if a.Is6() {
		return "AF_INET6"
	}
	return "AF_INET"
}

// checkBinds checks that sb can bind each of its network's addresses.
func checkBinds(t testing.TB, sb *Sandbox) {
	t.Helper()
	for _, a := range sb.Spec.Network.Addrs {
		script := fmt.Sprintf("python3 -c 'import socket; s = socket.socket(socket.%s); s.bind((\"%s\", 0)); print(\"bound\")'", family(a), a)
		if out, errOut, code := sb.Sh(t, script); code != 0 || out != "bound\n" {
			t.Errorf("binding its address %s: %q %q", a, out, errOut)
		}
	}
}

// probeNetwork checks that sb binds each of its addresses, and that a DNS
// question to each gateway resolver gets an answer or a refusal (ICMP port
// unreachable), not silence.
func probeNetwork(t *testing.T, sb *Sandbox) {
	t.Helper()
	checkBinds(t, sb)
	for _, ns := range sb.Spec.Network.Nameservers {
		out, errOut, _ := sb.Sh(t, fmt.Sprintf(`python3 -c '
import socket
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
s = socket.socket(socket.%s, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect(("%s", 53))
s.send(q)
try:
    d = s.recv(512)
    print("answered" if d[:2] == b"\x12\x34" else "odd")
except ConnectionRefusedError:
    print("refused")
except socket.timeout:
    print("silence")
'`, family(ns), ns))
		if out != "answered\n" && out != "refused\n" {
			t.Errorf("DNS to %s from the sandbox: %q %q", ns, out, errOut)
		}
	}
}
