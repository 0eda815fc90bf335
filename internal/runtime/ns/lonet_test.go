package ns

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestLoNets: a sandbox's namespace has lo up and lets anyone bind low ports
// and ping; it is reused only when its sandbox ended and left no socket,
// TIME_WAIT included.
func TestLoNets(t *testing.T) {
	testenv.RequireRoot(t)
	l := newLoNets()
	t.Cleanup(l.close)
	ino := func(f *os.File) uint64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	get := func(id string) *os.File {
		t.Helper()
		f, err := l.get(id)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	in := func(f *os.File, fn func() error) {
		t.Helper()
		if err := netns.RunFd(int(f.Fd()), fn); err != nil {
			t.Fatal(err)
		}
	}

	a := get("a")
	var host unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	if ino(a) == host.Ino {
		t.Fatal("the sandbox's namespace is the host's")
	}
	if l.of("a") != a {
		t.Error("of does not give the namespace get gave")
	}
	in(a, func() error {
		for name, want := range map[string]string{
			"/proc/sys/net/ipv4/ip_unprivileged_port_start": "0",
			"/proc/sys/net/ipv4/ping_group_range":           "0\t2147483647",
		} {
			b, err := os.ReadFile(name)
			if got := strings.TrimSpace(string(b)); err != nil || got != want {
				t.Errorf("%s = %q (%v), want %q", name, got, err, want)
			}
		}
		ifs, err := net.Interfaces()
		if err != nil || len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
			t.Errorf("interfaces %v (%v), want lo, up", ifs, err)
		}
		return nil
	})

	// Ended, with no socket left: reused. (Some sockets, netlink's and
	// UDP's, are counted until an RCU grace period after their close.)
	waitClean := func(f *os.File) {
		t.Helper()
		for i := 0; !socketless(f); i++ {
			if i == 200 {
				t.Fatal("the namespace's closed sockets are still counted after 2 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitClean(a)
	first := ino(a)
	l.release("a", true)
	if l.of("a") != nil {
		t.Error("a released namespace is still the sandbox's")
	}
	b := get("b")
	if ino(b) != first {
		t.Error("an ended sandbox's clean namespace was not reused")
	}

	// A TCP connection over lo leaves a TIME_WAIT: not reused.
	in(b, func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		s, err := ln.Accept()
		if err != nil {
			return err
		}
		s.Close() // the side that closes first keeps the TIME_WAIT
		buf := make([]byte, 1)
		c.Read(buf)
		c.Close()
		return ln.Close()
	})
	l.release("b", true)
	c := get("c")
	if ino(c) == first {
		t.Error("a namespace holding a TIME_WAIT was reused")
	}

	// A sandbox not known to have ended: not reused either.
	second := ino(c)
	l.release("c", false)
	d := get("d")
	if ino(d) == second {
		t.Error("the namespace of a sandbox that may still run was reused")
	}
	// A namespace with an open socket is not clean.
	var sock int
	in(d, func() (err error) {
		sock, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		return err
	})
	if socketless(d) {
		t.Error("a namespace with an open socket counts as clean")
	}
	unix.Close(sock)
	waitClean(d)
	l.release("d", true)
	l.release("nosuch", true) // not an error
}

func TestSockstat(t *testing.T) {
	for in, want := range map[string][3]int{
		"sockets: used 0\nTCP: inuse 0 orphan 0 tw 0 alloc 61 mem 122\nUDP: inuse 0 mem 0\n": {0, 0, 1},
		"sockets: used 2\nTCP: inuse 1 orphan 0 tw 3 alloc 62 mem 122\n":                     {2, 3, 1},
		"TCP: inuse 1 orphan 0 tw 3\n":                                                       {0, 3, 0},
		"sockets: used x\nTCP: tw\n":                                                         {0, 0, 0},
		"":                                                                                   {0, 0, 0},
	} {
		used, tw, ok := sockstat([]byte(in))
		okn := 0
		if ok {
			okn = 1
		}
		if [3]int{used, tw, okn} != want {
			t.Errorf("sockstat(%q) = %d %d %v, want %v", in, used, tw, ok, want)
		}
	}
}
