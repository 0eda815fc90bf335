package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent/launch"
)

func TestExec(t *testing.T) {
	e := startAgent(t, Config{DefaultEnv: map[string]string{"FOO": "default", "BAR": "bar"}})
	cwd := filepath.Join(e.dir, "work")
	os.Mkdir(cwd, 0o755)
	type result struct {
		Stdout, Stderr string
		ExitCode       int
		Signal         string
		TimedOut       bool
	}
	tests := []struct {
		name string
		req  api.ExecRequest
		want result
	}{
		{"argv", api.ExecRequest{Cmd: []string{"echo", "hello", "two words"}}, result{Stdout: "hello two words\n"}},
		{"argv keeps shell syntax", api.ExecRequest{Cmd: []string{"echo", "$HOME;", "|"}}, result{Stdout: "$HOME; |\n"}},
		{"shell", api.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, result{Stdout: "out\n", Stderr: "err\n", ExitCode: 3}},
		{"env", api.ExecRequest{Shell: `echo "$FOO $BAR $HOME $USER $LANG $PATH"`, Env: map[string]string{"FOO": "req"}},
			result{Stdout: "req bar /root root C.UTF-8 " + basePath + "\n"}},
		{"no TERM without a terminal", api.ExecRequest{Shell: `echo "${TERM-unset}"`}, result{Stdout: "unset\n"}},
		{"cwd", api.ExecRequest{Cmd: []string{"pwd"}, Cwd: cwd}, result{Stdout: cwd + "\n"}},
		{"relative argv0 in cwd", api.ExecRequest{Cmd: []string{"./run.sh"}, Cwd: cwd}, result{Stdout: "ran\n"}},
		{"stdin", api.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("piped\x00bytes")}, result{Stdout: "piped\x00bytes"}},
		{"stdin closed", api.ExecRequest{Cmd: []string{"cat"}}, result{}},
		{"user", api.ExecRequest{Shell: `id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; pwd`, User: "user"},
			result{Stdout: fmt.Sprintf("1000\n1000\n1000 1001\n%s user user\n%s\n", e.home, e.home)}},
		{"root", api.ExecRequest{Shell: `id -u`, User: "root"}, result{Stdout: "0\n"}},
		{"timeout", api.ExecRequest{Cmd: []string{"sleep", "10"}, TimeoutMs: 200}, result{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}},
		{"timeout not reached", api.ExecRequest{Cmd: []string{"true"}, TimeoutMs: 5000}, result{}},
		{"signalled", api.ExecRequest{Shell: `kill -TERM $$`}, result{ExitCode: -1, Signal: "SIGTERM"}},
		{"own process group", api.ExecRequest{Shell: `[ "$(ps -o pgid= $$ | tr -d ' ')" = $$ ] && echo leader`}, result{Stdout: "leader\n"}},
		{"pty", api.ExecRequest{Shell: `stty size; echo "$TERM"; [ -t 0 ] && echo tty`, PTY: &api.PTYSize{Rows: 24, Cols: 80}},
			result{Stdout: "24 80\r\nxterm-256color\r\ntty\r\n"}},
		{"pty stderr merged", api.ExecRequest{Shell: `echo err >&2`, PTY: &api.PTYSize{Rows: 5, Cols: 20}}, result{Stdout: "err\r\n"}},
		{"large output", api.ExecRequest{Shell: `head -c 1000000 /dev/zero; head -c 300000 /dev/zero >&2`},
			result{Stdout: strings.Repeat("\x00", 1000000), Stderr: strings.Repeat("\x00", 300000)}},
	}
	os.WriteFile(filepath.Join(cwd, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := e.c.Exec(context.Background(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			got := result{string(res.Stdout), string(res.Stderr), res.ExitCode, res.Signal, res.TimedOut}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if res.PID <= 0 {
				t.Errorf("no pid in start event")
			}
		})
	}
}

func TestExecStreamsLive(t *testing.T) {
	e := startAgent(t, Config{})
	s, err := e.c.ExecStream(context.Background(), api.ExecRequest{Shell: "echo first; read x; echo second", KeepStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, err := s.Next()
	if err != nil || start.Type != api.EventStart {
		t.Fatalf("first event %+v, %v", start, err)
	}
	// "first" must arrive while the process still waits for input.
	ev, err := s.Next()
	if err != nil || ev.Type != api.EventStdout || string(ev.Data) != "first\n" {
		t.Fatalf("got %+v, %v; want stdout first", ev, err)
	}
	if err := e.c.WriteStdin(context.Background(), start.PID, strings.NewReader("go\n")); err != nil {
		t.Fatal(err)
	}
	ev, _ = s.Next()
	if string(ev.Data) != "second\n" {
		t.Fatalf("got %+v", ev)
	}
	ev, _ = s.Next()
	if ev.Type != api.EventExit || *ev.ExitCode != 0 {
		t.Fatalf("got %+v", ev)
	}
	// A finished foreground process is not kept.
	_, err = e.c.Process(context.Background(), start.PID)
	wantStatus(t, err, 404, "not_found")
}

func TestExecDisconnectKills(t *testing.T) {
	e := startAgent(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.c.ExecStream(ctx, api.ExecRequest{Shell: "sleep 30 & sleep 30; wait"})
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if !alive(start.PID) {
		t.Fatal("process not running")
	}
	cancel()
	s.Close()
	waitGone(t, start.PID)
	// The whole group went, the backgrounded sleep too.
	// It was orphaned, so another process reaps it: wait.
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := exec.Command("pgrep", "-g", strconv.Itoa(start.PID)).Output()
		if len(bytes.TrimSpace(out)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has processes %s", start.PID, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A detached exec streams like a foreground one, but its process outlives
// the stream and stays listed with its exit code, for whoever attaches next.
func TestExecDetach(t *testing.T) {
	e := startAgent(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.c.ExecStream(ctx, api.ExecRequest{Shell: "echo first; read x; echo got $x; exit 3", KeepStdin: true, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, "first")
	cancel()
	s.Close()
	time.Sleep(100 * time.Millisecond)
	if !alive(start.PID) {
		t.Fatal("detached process died with its stream")
	}
	att, err := e.c.Attach(context.Background(), start.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if err := e.c.WriteStdin(context.Background(), start.PID, strings.NewReader("x\n")); err != nil {
		t.Fatal(err)
	}
	out, exit := collect(t, att)
	if out != "got x\n" || exit.ExitCode == nil || *exit.ExitCode != 3 {
		t.Errorf("after reattach: %q, %+v", out, exit)
	}
	p, err := e.c.Process(context.Background(), start.PID)
	if err != nil || p.Running || p.ExitCode == nil || *p.ExitCode != 3 {
		t.Errorf("exited detached process: %+v, %v", p, err)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: a zombie is not alive.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) < i+3 || b[i+2] != 'Z'
}

// waitGone waits for pid to be gone entirely: not running and not a zombie.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	t.Fatalf("process %d still there: %s", pid, st)
}

// collect reads a stream to its exit event.
func collect(t *testing.T, s *EventStream) (stdout string, exit api.ExecEvent) {
	t.Helper()
	var out strings.Builder
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("reading events: %v (output so far %q)", err, out.String())
		}
		switch ev.Type {
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventExit:
			return out.String(), ev
		}
	}
}

// readUntil reads a stream until its stdout contains want.
func readUntil(t *testing.T, s *EventStream, want string) {
	t.Helper()
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		ev, err := s.Next()
		if err != nil || ev.Type == api.EventExit {
			t.Fatalf("stream ended (%+v, %v) before %q; output %q", ev, err, want, out.String())
		}
		out.Write(ev.Data)
	}
}

func ptr[T any](v T) *T { return &v }

func TestBackground(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()

	p, err := e.c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "30"}, Tag: "sleeper"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Running || p.PID <= 0 || p.Tag != "sleeper" || !cmp.Equal(p.Cmd, []string{"sleep", "30"}) {
		t.Fatalf("got %+v", p)
	}
	list, err := e.c.Processes(ctx, "sleeper")
	if err != nil || len(list) != 1 || list[0].PID != p.PID {
		t.Fatalf("list by tag: %+v, %v", list, err)
	}
	if list, _ := e.c.Processes(ctx, "other"); len(list) != 0 {
		t.Fatalf("list by other tag: %+v", list)
	}
	err = e.c.Resize(ctx, p.PID, api.PTYSize{Rows: 10, Cols: 10})
	wantStatus(t, err, 409, "conflict")

	s, err := e.c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Signal(ctx, p.PID, "TERM"); err != nil {
		t.Fatal(err)
	}
	_, exit := collect(t, s)
	s.Close()
	want := api.ExecEvent{Type: api.EventExit, ExitCode: ptr(-1), Signal: "SIGTERM"}
	if diff := cmp.Diff(want, exit); diff != "" {
		t.Errorf("exit (-want +got):\n%s", diff)
	}

	// The exit code stays known.
	got, err := e.c.Process(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Running || got.ExitCode == nil || *got.ExitCode != -1 {
		t.Errorf("after exit: %+v", got)
	}
	// Attaching to it now gives just the exit.
	s, err = e.c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	_, exit = collect(t, s)
	s.Close()
	if diff := cmp.Diff(want, exit); diff != "" {
		t.Errorf("late attach (-want +got):\n%s", diff)
	}
	wantStatus(t, e.c.Signal(ctx, p.PID, "KILL"), 409, "conflict")
	wantStatus(t, e.c.WriteStdin(ctx, p.PID, strings.NewReader("x")), 409, "conflict")

	t.Run("stdin", func(t *testing.T) {
		p, s := startAttached(t, e.c, api.ExecRequest{Shell: "read x; echo got:$x; exit 7", KeepStdin: true})
		if err := e.c.WriteStdin(ctx, p.PID, strings.NewReader("hello\n")); err != nil {
			t.Fatal(err)
		}
		out, exit := collect(t, s)
		if out != "got:hello\n" || *exit.ExitCode != 7 {
			t.Errorf("got %q, %+v", out, exit)
		}
	})
	t.Run("stdin close", func(t *testing.T) {
		p, s := startAttached(t, e.c, api.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("first,"), KeepStdin: true})
		e.c.WriteStdin(ctx, p.PID, strings.NewReader("second"))
		if err := e.c.CloseStdin(ctx, p.PID); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, e.c.WriteStdin(ctx, p.PID, strings.NewReader("x")), 409, "conflict")
		out, exit := collect(t, s)
		// Attached after start: "first," may or may not have been echoed yet.
		if !strings.HasSuffix(out, "second") || *exit.ExitCode != 0 {
			t.Errorf("got %q, %+v", out, exit)
		}
	})
	t.Run("signal names", func(t *testing.T) {
		for _, sig := range []string{"SIGKILL", "kill", "9"} {
			p, err := e.c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "30"}})
			if err != nil {
				t.Fatal(err)
			}
			s, _ := e.c.Attach(ctx, p.PID)
			if err := e.c.Signal(ctx, p.PID, sig); err != nil {
				t.Fatal(err)
			}
			// Killed means gone, reaped, when the answer comes.
			if err := syscall.Kill(p.PID, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("%s: kill -0 right after the answer: %v, want ESRCH", sig, err)
			}
			if _, exit := collect(t, s); exit.Signal != "SIGKILL" {
				t.Errorf("%s: got %+v", sig, exit)
			}
			s.Close()
		}
		for _, sig := range []string{"", "SIGNOPE", "0", "65", "-9"} {
			wantStatus(t, e.c.Signal(ctx, p.PID, sig), 400, "invalid")
		}
	})
	t.Run("timeout", func(t *testing.T) {
		p, err := e.c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "30"}, TimeoutMs: 100})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := e.c.Attach(ctx, p.PID)
		defer s.Close()
		if _, exit := collect(t, s); !exit.TimedOut || exit.Signal != "SIGKILL" {
			t.Errorf("got %+v", exit)
		}
	})
}

func TestExitedAreBounded(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	var first int
	for i := range keepExited + 10 {
		p, err := e.c.Start(ctx, api.ExecRequest{Cmd: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = p.PID
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := e.c.Processes(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range list {
			if p.Running {
				running++
			}
		}
		// A process is shown finished a moment before it is retired (and
		// the oldest dropped): the count settles once all are retired.
		if running == 0 && len(list) == keepExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d still running, %d processes listed, want %d", running, len(list), keepExited)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := e.c.Process(ctx, first)
	wantStatus(t, err, 404, "not_found")
}

func TestPTYResize(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	p, err := e.c.Start(ctx, api.ExecRequest{Shell: "read x; stty size; read x; stty size", PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.PTY {
		t.Errorf("process not marked pty: %+v", p)
	}
	s, err := e.c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, size := range []api.PTYSize{{Rows: 30, Cols: 100}, {Rows: 40, Cols: 120}} {
		if err := e.c.Resize(ctx, p.PID, size); err != nil {
			t.Fatal(err)
		}
		if err := e.c.WriteStdin(ctx, p.PID, strings.NewReader("\n")); err != nil {
			t.Fatal(err)
		}
		readUntil(t, s, fmt.Sprintf("%d %d", size.Rows, size.Cols))
	}
	wantStatus(t, e.c.Resize(ctx, p.PID, api.PTYSize{Rows: 0, Cols: 10}), 400, "invalid")
}

// TestPTYBacklog: what a terminal printed while nobody was attached (a
// shell's first prompt, before the browser's websocket is open) is given
// to the next to attach, the newest maxBacklog bytes of it; also after
// the process has exited. A pipe's output is not kept so.
func TestPTYBacklog(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	backlog := func(pid int) int {
		p, err := e.a.process(strconv.Itoa(pid))
		if err != nil {
			return -1
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.backlog)
	}
	// waitBacklog waits until pid's backlog holds want.
	waitBacklog := func(pid int, want string) {
		t.Helper()
		has := func() bool {
			p, err := e.a.process(strconv.Itoa(pid))
			if err != nil {
				return false
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			return bytes.Contains(p.backlog, []byte(want))
		}
		for deadline := time.Now().Add(10 * time.Second); !has(); {
			if time.Now().After(deadline) {
				t.Fatalf("process %d: backlog of %d bytes without %q", pid, backlog(pid), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// 100 KiB before the first attach: the newest 64 KiB are kept.
	p, err := e.c.Start(ctx, api.ExecRequest{Shell: "head -c 102400 /dev/zero | tr '\\0' a; echo early; read x; echo late:$x", PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	waitBacklog(p.PID, "early")
	s, err := e.c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next()
	if err != nil || len(ev.Data) != maxBacklog || !strings.HasSuffix(strings.TrimRight(string(ev.Data), "\r\n"), "aaaearly") {
		t.Fatalf("first event after attaching: %d bytes ending %q, %v; want the newest %d bytes", len(ev.Data), tail(ev.Data), err, maxBacklog)
	}
	if err := e.c.WriteStdin(ctx, p.PID, strings.NewReader("x\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, "late:x")
	s.Close()

	// Printed, exited, then attached: the output, then the exit.
	p, err = e.c.Start(ctx, api.ExecRequest{Shell: "echo bye; exit 3", PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	waitExit := func(pid int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if pp, err := e.c.Process(ctx, pid); err != nil || !pp.Running {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("process %d still runs", pid)
			}
		}
	}
	waitExit(p.PID)
	s, err = e.c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, "bye")
	if ev, err := s.Next(); err != nil || ev.Type != api.EventExit || ev.ExitCode == nil || *ev.ExitCode != 3 {
		t.Errorf("after the backlog: %+v, %v; want the exit, 3", ev, err)
	}
	s.Close()

	// A pipe's output before attaching is not kept.
	p, err = e.c.Start(ctx, api.ExecRequest{Shell: "echo early"})
	if err != nil {
		t.Fatal(err)
	}
	waitExit(p.PID)
	if n := backlog(p.PID); n > 0 {
		t.Errorf("a pipe's process kept %d bytes", n)
	}
}

func tail(b []byte) string { return string(b[max(0, len(b)-20):]) }

func TestWebsocket(t *testing.T) {
	e := startAgent(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := e.c.Start(ctx, api.ExecRequest{Shell: "read line; stty size; echo got:$line; exit 4", PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://agent/processes/%d/ws", p.PID), &websocket.DialOptions{HTTPClient: e.c.HTTPClient()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":50,"cols":132}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading: %v (output %q)", err, out.String())
		}
		if typ == websocket.MessageBinary {
			out.Write(data)
			continue
		}
		var ev api.ExecEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(api.ExecEvent{Type: api.EventExit, ExitCode: ptr(4)}, ev); diff != "" {
			t.Errorf("exit (-want +got):\n%s", diff)
		}
		break
	}
	for _, want := range []string{"50 132", "got:hello"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("after exit: %v, want a normal close", err)
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want unix.Signal
	}{
		{"SIGTERM", unix.SIGTERM}, {"TERM", unix.SIGTERM}, {"term", unix.SIGTERM}, {"15", unix.SIGTERM},
		{"SIGUSR1", unix.SIGUSR1}, {"HUP", unix.SIGHUP}, {"bogus", 0}, {"SIG", 0}, {"100", 0},
	}
	for _, tt := range tests {
		got, err := parseSignal(tt.in)
		if got != tt.want || (err != nil) != (tt.want == 0) {
			t.Errorf("parseSignal(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// startAgentProcess runs Main in a child process, as the node runs the real
// binary: listener on fd 3, default env in ATOLL_AGENT_ENV.
func startAgentProcess(t *testing.T, env map[string]string) (*Client, *exec.Cmd) {
	t.Helper()
	needRoot(t)
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	envJSON, _ := json.Marshal(env)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", launch.EnvVar+"="+string(envJSON), "ATOLL_TEST_LEAK=leak")
	cmd.ExtraFiles = []*os.File{f}
	c := runAgent(t, cmd, sock)
	f.Close()
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c, cmd
}

func TestAgentProcess(t *testing.T) {
	c, cmd := startAgentProcess(t, map[string]string{"SANDBOX": "sb1"})
	ctx := context.Background()

	t.Run("environment", func(t *testing.T) {
		res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"env"}})
		if err != nil {
			t.Fatal(err)
		}
		env := string(res.Stdout)
		if !strings.Contains(env, "SANDBOX=sb1\n") {
			t.Errorf("default env missing:\n%s", env)
		}
		for _, leak := range []string{"ATOLL_TEST_LEAK", launch.EnvVar, helperEnv} {
			if strings.Contains(env, leak) {
				t.Errorf("agent's own %s leaked:\n%s", leak, env)
			}
		}
	})
	t.Run("orphans are reaped", func(t *testing.T) {
		res, err := c.Exec(ctx, api.ExecRequest{Shell: "sleep 0.3 </dev/null >/dev/null 2>&1 & echo $!"})
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		if err != nil {
			t.Fatalf("pid %q: %v", res.Stdout, err)
		}
		waitGone(t, pid)
	})
	t.Run("statuses reach the right process", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				res, err := c.Exec(ctx, api.ExecRequest{Shell: fmt.Sprintf("true & exit %d", i)})
				if err != nil {
					t.Error(err)
					return
				}
				if res.ExitCode != i {
					t.Errorf("exit %d, want %d", res.ExitCode, i)
				}
			})
		}
		wg.Wait()
	})
	t.Run("no zombies", func(t *testing.T) {
		time.Sleep(100 * time.Millisecond)
		if z := zombieChildren(t, cmd.Process.Pid); len(z) > 0 {
			t.Errorf("zombie children: %v", z)
		}
	})

	// SIGTERM shuts the agent down cleanly, killing what it started.
	p, err := c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop on SIGTERM")
	}
	waitGone(t, p.PID)
}

// zombieChildren lists the zombie children of pid.
func zombieChildren(t *testing.T, pid int) []string {
	t.Helper()
	var zombies []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(pid) {
			zombies = append(zombies, string(b[:i+1]))
		}
	}
	return zombies
}

// startAttached starts the process req asks for and attaches to it until
// t ends.
func startAttached(t *testing.T, c *Client, req api.ExecRequest) (api.Process, *EventStream) {
	t.Helper()
	ctx := context.Background()
	p, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Attach(ctx, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return p, s
}

// runAgent starts cmd, an agent that serves on sock, and returns a client
// of it; t's end kills it and, if t failed, logs what it wrote.
func runAgent(t *testing.T, cmd *exec.Cmd, sock string) *Client {
	t.Helper()
	var logs bytes.Buffer
	cmd.Stderr = &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	return NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// TestAgentProcessListenPath checks the agent that binds its own socket
// ($ATOLL_AGENT_LISTEN): it serves there, lets go of the socket (file and
// connections) on ReleaseSignal while its processes run on, and takes it up
// again on ListenSignal.
func TestAgentProcessListenPath(t *testing.T) {
	needRoot(t)
	sock := filepath.Join(shortTempDir(t), "agent.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", launch.ListenVar+"="+sock)
	c := runAgent(t, cmd, sock)
	ctx := context.Background()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the agent", func() bool { _, err := c.Health(ctx); return err == nil })
	p, err := c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "30"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(ReleaseSignal); err != nil {
		t.Fatal(err)
	}
	waitFor("the socket to go", func() bool {
		_, err := os.Stat(sock)
		return errors.Is(err, os.ErrNotExist)
	})
	if err := syscall.Kill(p.PID, 0); err != nil {
		t.Errorf("the background process ended with the socket: %v", err)
	}

	if err := cmd.Process.Signal(ListenSignal); err != nil {
		t.Fatal(err)
	}
	waitFor("the agent again", func() bool { _, err := c.Health(ctx); return err == nil })
	got, err := c.Process(ctx, p.PID)
	if err != nil || !got.Running {
		t.Errorf("background process after the socket came back: %+v, %v", got, err)
	}
}
