package ns

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime/confine"
)

// A sandbox with no network made for it (runtime.Spec.Network nil) still
// has a network namespace of its own, holding only lo, so that nothing it
// listens on is reachable from the host or from another sandbox. Making a
// network namespace costs the kernel about half a millisecond, and
// destroying one more, on a kernel worker (every per-namespace subsystem,
// its sysctl tables, RCU grace periods): some 5% of the machine when
// sandboxes come and go in bulk.
//
// So the node makes these namespaces and reuses them. It owns them (the
// initial user namespace does), like package network's, so that the
// sandbox's root has no power over its network: it cannot change lo, add
// devices or routes, or load firewall rules, and the namespace is as the
// node made it when the sandbox ends. A namespace is reused only once it
// holds no socket: a sandbox's sockets close with its processes, but a TCP
// connection leaves a TIME_WAIT behind for a minute (the next sandbox could
// not bind its port), and such a namespace is dropped instead.
type loNets struct {
	mu   sync.Mutex
	free []*os.File
	used map[string]*os.File // by sandbox ID
}

// maxFreeLoNets bounds the namespaces kept for reuse.
const maxFreeLoNets = 32

func newLoNets() *loNets { return &loNets{used: map[string]*os.File{}} }

// get gives sandbox id a namespace: a free one if there is one, else a new
// one. Its path, for the process to join, is path(f).
func (l *loNets) get(id string) (*os.File, error) {
	l.mu.Lock()
	if old := l.used[id]; old != nil {
		delete(l.used, id)
		old.Close()
	}
	var f *os.File
	if n := len(l.free); n > 0 {
		f, l.free = l.free[n-1], l.free[:n-1]
	}
	l.mu.Unlock()
	if f == nil {
		var err error
		if f, err = newLoNet(); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	l.used[id] = f
	l.mu.Unlock()
	return f, nil
}

// of is sandbox id's namespace, nil if it has none from here (it was started
// by another run of the node, or with a network).
func (l *loNets) of(id string) *os.File {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used[id]
}

// release takes sandbox id's namespace back. ended says every process of
// the sandbox is gone; only then, and only if it holds no socket, is the
// namespace kept for another sandbox.
func (l *loNets) release(id string, ended bool) {
	l.mu.Lock()
	f := l.used[id]
	delete(l.used, id)
	full := len(l.free) >= maxFreeLoNets
	l.mu.Unlock()
	if f == nil {
		return
	}
	if !ended || full || !socketless(f) {
		f.Close()
		return
	}
	l.mu.Lock()
	l.free = append(l.free, f)
	l.mu.Unlock()
}

// close drops the free namespaces; those in use stay with their sandboxes.
func (l *loNets) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.free {
		f.Close()
	}
	l.free = nil
}

// loNetPath is the path at which another process (the spawn helper) opens
// namespace f while the node holds it open.
func loNetPath(f *os.File) string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
}

// newLoNet makes a network namespace with lo up, in which, as in one the
// sandbox owned, any user may bind low ports and ping.
func newLoNet() (*os.File, error) {
	fd, err := netns.Temp()
	if err != nil {
		return nil, fmt.Errorf("making a network namespace: %w", err)
	}
	f := os.NewFile(uintptr(fd), "netns")
	err = netns.RunFd(fd, func() error {
		if err := confine.Loopback(); err != nil {
			return err
		}
		for name, value := range map[string]string{
			"ipv4/ip_unprivileged_port_start": "0",
			"ipv4/ping_group_range":           "0 2147483647",
		} {
			if err := os.WriteFile("/proc/sys/net/"+name, []byte(value), 0o644); err != nil {
				return fmt.Errorf("setting net.%s: %w", strings.ReplaceAll(name, "/", "."), err)
			}
		}
		return nil
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// socketless reports whether namespace f holds no socket at all, TCP's
// TIME_WAIT included (/proc/net/sockstat counts per namespace).
func socketless(f *os.File) bool {
	var b []byte
	err := netns.RunFd(int(f.Fd()), func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/sockstat")
		return err
	})
	if err != nil {
		return false
	}
	used, tw, ok := sockstat(b)
	return ok && used == 0 && tw == 0
}

// sockstat reads the sockets in use and TCP's TIME_WAITs from
// /proc/net/sockstat's "sockets: used N" and "TCP: ... tw N".
func sockstat(b []byte) (used, tw int, ok bool) {
	var seenUsed, seenTW bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		for i := 1; i+1 < len(f); i++ {
			n, err := strconv.Atoi(f[i+1])
			switch {
			case err != nil:
			case f[0] == "sockets:" && f[i] == "used":
				used, seenUsed = n, true
			case f[0] == "TCP:" && f[i] == "tw":
				tw, seenTW = n, true
			}
		}
	}
	return used, tw, seenUsed && seenTW
}
