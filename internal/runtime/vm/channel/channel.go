// Package channel carries the agent protocol's many connections over the one
// byte stream of a virtio-serial port, between a vm sandbox's guest and the
// host. The node dials a unix socket per request, as it does for every
// runtime; a small proxy on the host (the agent binary run as "atoll-agent
// vm-proxy") accepts there and opens a yamux stream per connection over the
// port's QEMU chardev socket; in the guest, Listen turns the port into a
// net.Listener the agent serves.
//
// Either end may start over while the other runs on: a proxy exits with its
// QEMU, and a guest restored from a memory snapshot wakes up in the middle of
// a session whose host half is gone. So every session begins with a
// handshake the proxy repeats until the guest answers it, "ATOLL-SYNC
// <nonce>" answered (once per nonce) by "ATOLL-ACK <nonce>", after which the
// proxy sends "ATOLL-START <nonce>" and the session's first byte. Each side
// skips whatever comes before the marker it waits for: what is left of an
// old session never reaches a new one.
package channel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

const (
	syncPrefix  = "\nATOLL-SYNC "
	ackPrefix   = "\nATOLL-ACK "
	startPrefix = "\nATOLL-START "
	nonceLen    = 16 // hex digits
	// syncEvery is how often the proxy repeats its handshake until the
	// guest answers.
	syncEvery = 200 * time.Millisecond
)

// yamuxConfig has no keepalives and no write deadline that a paused VM could
// miss: a session ends only when either end goes away.
func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = 24 * time.Hour
	c.StreamOpenTimeout = 0
	c.LogOutput = io.Discard
	return c
}

// Listen serves sessions on port, a guest's virtio-serial device, one after
// another. Accept returns the streams of the current session.
func Listen(port *os.File) net.Listener {
	l := &listener{port: port, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.run()
	return l
}

type listener struct {
	port  *os.File
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *listener) Addr() net.Addr { return addr{} }

type addr struct{}

func (addr) Network() string { return "virtio-serial" }
func (addr) String() string  { return "atoll" }

// run reads the port for ever: between sessions it looks for a handshake;
// during one it feeds the session's reader.
func (l *listener) run() {
	var (
		scan    []byte // bytes seen while looking for a handshake
		acked   string // the nonce answered and awaiting its start
		sess    *session
		buf     = make([]byte, 64<<10)
		writeMu sync.Mutex
	)
	for {
		select {
		case <-l.done:
			return
		default:
		}
		n, err := l.port.Read(buf)
		if n == 0 || err != nil {
			// Nothing connected on the host side reads as end of file
			// until something is.
			if sess != nil {
				sess.end()
				sess = nil
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		data := buf[:n]
		if sess != nil {
			if sess.feed(data) {
				continue
			}
			sess = nil
		}
		scan = append(scan, data...)
		for sess == nil {
			kind, nonce, rest, ok := nextMarker(scan)
			if !ok {
				// Keep only what could begin a marker.
				if keep := len(startPrefix) + nonceLen + 1; len(scan) > 4096 {
					scan = append([]byte(nil), scan[len(scan)-keep:]...)
				}
				break
			}
			scan = rest
			switch {
			case kind == syncPrefix && nonce != acked:
				writeMu.Lock()
				_, err = l.port.Write([]byte(ackPrefix + nonce + "\n"))
				writeMu.Unlock()
				if err == nil {
					acked = nonce
				}
			case kind == startPrefix && nonce == acked:
				acked = ""
				s := newSession(l.port, &writeMu)
				ys, err := yamux.Server(s, yamuxConfig())
				if err != nil {
					continue
				}
				sess = s
				go l.serve(ys)
				if len(scan) > 0 && !sess.feed(scan) {
					sess = nil
				}
				scan = nil
			}
		}
	}
}

// nextMarker finds the first complete handshake marker in b: its kind
// (syncPrefix or startPrefix), nonce and the bytes after it.
func nextMarker(b []byte) (kind, nonce string, rest []byte, ok bool) {
	best := -1
	for _, k := range []string{syncPrefix, startPrefix} {
		i := bytes.Index(b, []byte(k))
		if i >= 0 && (best < 0 || i < best) {
			best, kind = i, k
		}
	}
	if best < 0 {
		return "", "", nil, false
	}
	end := best + len(kind) + nonceLen + 1
	if len(b) < end {
		return "", "", nil, false
	}
	return kind, string(b[best+len(kind) : end-1]), b[end:], true
}

func (l *listener) serve(ys *yamux.Session) {
	defer ys.Close()
	for {
		c, err := ys.Accept()
		if err != nil {
			return
		}
		select {
		case l.conns <- c:
		case <-l.done:
			c.Close()
			return
		}
	}
}

// session is one yamux session's view of the port: it reads what run feeds
// it and writes to the port directly.
type session struct {
	port    *os.File
	writeMu *sync.Mutex
	pr      *io.PipeReader
	pw      *io.PipeWriter
	mu      sync.Mutex
	closed  bool
}

func newSession(port *os.File, writeMu *sync.Mutex) *session {
	pr, pw := io.Pipe()
	return &session{port: port, writeMu: writeMu, pr: pr, pw: pw}
}

// feed hands data to the session and reports whether it is still open.
func (s *session) feed(data []byte) bool {
	_, err := s.pw.Write(data)
	return err == nil
}

func (s *session) end() { s.pw.CloseWithError(io.EOF) }

func (s *session) Read(p []byte) (int, error) { return s.pr.Read(p) }

func (s *session) Write(p []byte) (int, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return 0, io.ErrClosedPipe
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.port.Write(p)
}

func (s *session) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.pr.CloseWithError(io.ErrClosedPipe)
	return nil
}

// Dial makes a session with the guest over conn, QEMU's chardev socket for
// the port: it repeats the handshake until the guest answers or ctx ends.
func Dial(ctx context.Context, conn net.Conn) (*yamux.Session, error) {
	b := make([]byte, nonceLen/2)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	ack := []byte(ackPrefix + nonce + "\n")
	found := make(chan *bufio.Reader, 1)
	go func() {
		// Read until the answer, keeping what follows it.
		br := bufio.NewReaderSize(conn, 64<<10)
		var seen []byte
		for {
			c, err := br.ReadByte()
			if err != nil {
				close(found)
				return
			}
			seen = append(seen, c)
			if bytes.HasSuffix(seen, ack) {
				found <- br
				return
			}
			if len(seen) > 8192 {
				seen = seen[len(seen)-len(ack):]
			}
		}
	}()
	t := time.NewTicker(syncEvery)
	defer t.Stop()
	for {
		if _, err := conn.Write([]byte(syncPrefix + nonce + "\n")); err != nil {
			return nil, fmt.Errorf("writing handshake: %w", err)
		}
		select {
		case br, ok := <-found:
			if !ok {
				return nil, errors.New("the guest closed the channel before answering")
			}
			// The guest answers each nonce once, and sends nothing
			// but the session after the start.
			if _, err := conn.Write([]byte(startPrefix + nonce + "\n")); err != nil {
				return nil, fmt.Errorf("writing handshake: %w", err)
			}
			return yamux.Client(&bufConn{Conn: conn, r: br}, yamuxConfig())
		case <-ctx.Done():
			conn.Close()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
