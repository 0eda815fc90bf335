package channel

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// port is a stand-in for a virtio-serial port and its QEMU chardev: the
// guest end is a file, the host end a connection that can be swapped for a
// new one while the guest end stays open, as a restored VM's port stays
// open while its proxy is a new one.
type port struct {
	guest *os.File
	host  *os.File
	mu    sync.Mutex
	cur   net.Conn
}

func newPort(t *testing.T) *port {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &port{guest: os.NewFile(uintptr(fds[0]), "guest"), host: os.NewFile(uintptr(fds[1]), "host")}
	t.Cleanup(func() { p.guest.Close(); p.host.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := p.host.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			c := p.cur
			p.mu.Unlock()
			if c != nil {
				c.Write(buf[:n])
			}
		}
	}()
	return p
}

// connect returns a new host-side connection; the old one no longer hears
// the guest.
func (p *port) connect() net.Conn {
	a, b := net.Pipe()
	p.mu.Lock()
	if p.cur != nil {
		p.cur.Close()
	}
	p.cur = a
	p.mu.Unlock()
	go io.Copy(p.host, a)
	return b
}

func echo(t *testing.T, ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
}

func roundTrip(t *testing.T, ctx context.Context, conn net.Conn, msg string) {
	t.Helper()
	sess, err := Dial(ctx, conn)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	st, err := sess.Open()
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	st.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(st, msg+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(st).ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// TestResync checks that a new proxy gets a session with a guest whose old
// session is still open, its first bytes lost in the old one, and that
// stale bytes before the handshake do not reach the new session.
func TestResync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := newPort(t)
	ln := Listen(p.guest)
	defer ln.Close()
	echo(t, ln)
	roundTrip(t, ctx, p.connect(), "first")
	// A new proxy, as after a restore: the old session hears nothing more.
	c := p.connect()
	roundTrip(t, ctx, c, "second")
	// Garbage, then a third proxy.
	c3 := p.connect()
	c3.Write([]byte("\x00\x01garbage\nATOLL-SYNC short\n"))
	roundTrip(t, ctx, c3, "third")
}
