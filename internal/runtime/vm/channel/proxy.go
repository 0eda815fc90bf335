package channel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-dev/atoll/internal/agent/launch"
)

// PIDFileVar, if set, names the file the detached proxy writes its PID to.
const PIDFileVar = "ATOLL_VM_PROXY_PIDFILE"

// childVar marks the detached second stage of the proxy.
const childVar = "ATOLL_VM_PROXY_CHILD"

// ProxyMain runs the proxy for args (after launch.VMProxy) and exits. The first
// stage starts the second detached, in a session of its own, and exits 0
// once that one has a session with the guest and listens, so that the
// proxy outlives the node that started it (a restarted node re-adopts the
// sandbox by its socket), and is nobody's zombie when it ends.
func ProxyMain(args []string) {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: atoll-agent vm-proxy CHARDEV-SOCKET LISTEN-SOCKET TIMEOUT")
		os.Exit(2)
	}
	timeout, err := time.ParseDuration(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "vm-proxy:", err)
		os.Exit(2)
	}
	if os.Getenv(childVar) == "1" {
		if p := os.Getenv(PIDFileVar); p != "" {
			_ = os.WriteFile(p, []byte(strconv.Itoa(os.Getpid())), 0o600)
		}
		ready := os.NewFile(3, "ready")
		err := proxy(args[0], args[1], timeout, func() { ready.WriteString("ok\n"); ready.Close() })
		if err != nil {
			fmt.Fprintln(ready, err)
			fmt.Fprintln(os.Stderr, "vm-proxy:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := detach(args); err != nil {
		fmt.Fprintln(os.Stderr, "vm-proxy:", err)
		os.Exit(1)
	}
}

func detach(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{launch.VMProxy}, args...)...)
	cmd.Env = append(os.Environ(), childVar+"=1")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr // the runtime's log file
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line == "ok\n" {
		return nil
	}
	_ = cmd.Wait()
	if line = strings.TrimSpace(line); line == "" {
		line = "exited before it was ready"
	}
	return errors.New(line)
}

// proxy makes a session with the guest over the chardev socket at chardev,
// waiting up to timeout for the guest to answer, then listens on listen and
// carries each connection over a stream of its own until the session ends.
func proxy(chardev, listen string, timeout time.Duration, ready func()) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", chardev)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connecting to the guest's channel: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	sess, err := Dial(ctx, conn)
	if err != nil {
		return fmt.Errorf("waiting for the guest's agent: %w", err)
	}
	defer sess.Close()
	_ = os.Remove(listen)
	ln, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		<-sess.CloseChan()
		ln.Close()
	}()
	ready()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if sess.IsClosed() {
				return nil
			}
			return err
		}
		st, err := sess.Open()
		if err != nil {
			c.Close()
			if sess.IsClosed() {
				return nil
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			splice(c, st)
		}()
	}
}

// splice copies between a and b until both directions end.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}
