package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestTerminalAndWatch drives a PTY shell over the websocket and a directory
// watch through the real server and agent.
func TestTerminalAndWatch(t *testing.T) {
	_, _, c := startRooted(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/bin/bash", "--norc", "-i"}, Background: true, PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	term, err := c.Terminal(ctx, sb.ID, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if err := term.Resize(33, 111); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := term.Write([]byte("stty size; tty; exit 3\n")); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(term)
	if !strings.Contains(string(out), "33 111") || !strings.Contains(string(out), "/dev/pts/") {
		t.Errorf("terminal output %q lacks the resized size or a pty", out)
	}
	if code, err := term.Wait(); err != nil || code != 3 {
		t.Errorf("terminal exit: %d %v", code, err)
	}

	w, err := c.Watch(ctx, sb.ID, "/root", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	time.Sleep(100 * time.Millisecond)
	sh(t, c, sb.ID, "mkdir /root/d && echo x > /root/d/f")
	seen := map[string]bool{}
	for w.Next() {
		ev := w.Event()
		seen[ev.Type+" "+ev.Path] = true
		if seen["create /root/d/f"] {
			break
		}
	}
	if !seen["create /root/d"] || !seen["create /root/d/f"] {
		t.Errorf("watch events %v lack the new directory and file", seen)
	}
}

// TestShellCommand runs `atoll shell` on a real terminal (a pty) against the
// server, types into it and reads what the sandbox's shell printed.
func TestShellCommand(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	sb, err := d.client().CreateSandbox(context.Background(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(d.bin, "shell", sb.ID)
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key, "TERM=xterm")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, tty); close(done) }()
	time.Sleep(500 * time.Millisecond)
	tty.Write([]byte("echo $((6*7)); stty size; exit 5\n"))
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err = <-errc:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("atoll shell did not exit; output %q", out.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Errorf("atoll shell exit: %v", err)
	}
	tty.Close()
	<-done
	if !strings.Contains(out.String(), "42") || !strings.Contains(out.String(), "30 100") {
		t.Errorf("shell output %q lacks 42 and the terminal size 30 100", out.String())
	}
}
