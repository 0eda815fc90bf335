package spawn

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// started starts `sh -c script` through s with a pipe as its fd 3 and the
// given clone flags and parent-death signal, and returns the child and the
// pipe's reading end.
func started(t *testing.T, s *Spawner, script string, attr *syscall.SysProcAttr) (*Child, *bufio.Reader) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"GREETING=hello", "PATH=/usr/bin:/bin"}
	cmd.Dir = "/tmp"
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = attr
	child, err := s.Start(cmd, "", nil)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Process != nil {
		t.Error("the command was started here, not by the spawner")
	}
	return child, bufio.NewReader(r)
}

// gone waits until the child has exited (its pidfd polls readable).
func gone(t *testing.T, c *Child) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(c.pidfd.Fd()), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("child %d still running (%v)", c.Pid, err)
		}
		return
	}
}

// TestStart: a process started by the helper is its child, not this
// process's, gets its arguments, environment, directory and files, and is
// killed through its pidfd; a user namespace with mappings is made as
// exec.Cmd makes it.
func TestStart(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(testenv.AgentBinary(t))
	defer s.Close()
	child, out := started(t, s, `echo "$GREETING $(pwd) $PPID $(cat /proc/self/uid_map | tr -s ' ')" >&3; exec sleep 100`,
		&syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWUTS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
			Credential:  &syscall.Credential{}, Setsid: true})
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "hello" || f[1] != "/tmp" || f[3] != "0" || f[4] != "100000" || f[5] != "1" {
		t.Fatalf("child saw %q, want hello, /tmp, its parent and uid map 0 100000 1", line)
	}
	if f[2] != strconv.Itoa(s.proc.Pid) {
		t.Errorf("child's parent is %s, want the spawner %d", f[2], s.proc.Pid)
	}
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	gone(t, child)
	child.Release()
}

// TestChildState: the child starts as os/exec would start it: stdin from
// /dev/null, only the descriptors it was given, no signal blocked or
// ignored, and os/exec's RLIMIT_NOFILE; in a user namespace, with
// supplementary groups cleared.
func TestChildState(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(testenv.AgentBinary(t))
	defer s.Close()
	script := `read x; echo "read=$? $(ls /proc/self/fd | tr '\n' ' ')" >&3
grep -E '^(SigBlk|SigIgn|Groups):' /proc/self/status | tr -d '\t' >&3
echo "nofile=$(ulimit -Sn)" >&3; echo end >&3`
	child, out := started(t, s, script, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappingsEnableSetgroups: true, Credential: &syscall.Credential{}, Setsid: true, Pdeathsig: syscall.SIGKILL})
	defer child.Release()
	got := map[string]string{}
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		line = strings.TrimSpace(line)
		if line == "end" {
			break
		}
		k, v, _ := strings.Cut(line, "=")
		if k2, v2, ok := strings.Cut(line, ":"); ok && !strings.Contains(k, " ") && !strings.HasPrefix(line, "read") && !strings.HasPrefix(line, "nofile") {
			k, v = k2, v2
		}
		got[k] = v
	}
	// sh's own descriptors for ls come and go; 0-3 are the child's.
	if !strings.HasPrefix(got["read"], "1 0 1 2 3 ") {
		t.Errorf("stdin read and descriptors: %q, want EOF (1) and 0 1 2 3 then ls's own", got["read"])
	}
	if got["SigBlk"] != "0000000000000000" || got["SigIgn"] != "0000000000000000" {
		t.Errorf("signals blocked %q, ignored %q; want none", got["SigBlk"], got["SigIgn"])
	}
	if got["Groups"] != "" {
		t.Errorf("supplementary groups %q, want none", got["Groups"])
	}
	// What os/exec gives a child of this process, but for the helper's
	// Go having raised its own limit at start: then Linux's default.
	want, err := exec.Command("/bin/sh", "-c", "ulimit -Sn; ulimit -Hn").Output()
	if err != nil {
		t.Fatal(err)
	}
	lim := strings.Fields(string(want))
	soft, _ := strconv.Atoi(lim[0])
	hard, _ := strconv.Atoi(lim[1])
	if lim[1] != "unlimited" && soft < hard-1 {
		soft = min(1024, hard)
	}
	if got["nofile"] != strconv.Itoa(soft) {
		t.Errorf("RLIMIT_NOFILE %s, want %d", got["nofile"], soft)
	}
}

// TestDiesWithServer: a child with a parent-death signal dies when the
// helper ends (the server's end closed, or the server gone), as the ns
// runtime's prestarted processes must; a child that cleared it lives on.
func TestDiesWithServer(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(testenv.AgentBinary(t))
	prestarted, out1 := started(t, s, `echo up >&3; exec sleep 100`, &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL})
	lasting, out2 := started(t, s, `echo up >&3; exec sleep 100`, &syscall.SysProcAttr{})
	for _, r := range []*bufio.Reader{out1, out2} {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	gone(t, prestarted)
	if err := lasting.Signal(0); err != nil {
		t.Errorf("a child without a parent-death signal died with the helper: %v", err)
	}
	lasting.Kill()
	gone(t, lasting)
}

// TestHelperRestarts: when the helper dies, the next start makes another.
func TestHelperRestarts(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(testenv.AgentBinary(t))
	defer s.Close()
	c, _ := started(t, s, `exit 0`, nil)
	c.Release()
	s.mu.Lock()
	first := s.proc
	s.mu.Unlock()
	first.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		dead := s.sock == nil
		s.mu.Unlock()
		if dead || time.Now().After(deadline) {
			break
		}
		// Until the reaper saw it die, a start may meet the dead socket
		// and must then start another helper itself.
		if c, err := s.Start(exec.Command("/bin/true"), "", nil); err == nil {
			c.Release()
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, out := started(t, s, `echo again >&3`, nil)
	defer c.Release()
	if line, _ := out.ReadString('\n'); line != "again\n" {
		t.Fatalf("after the helper died: %q", line)
	}
	if s.proc.Pid == first.Pid {
		t.Error("no new helper")
	}
}

// TestBadRequests: what the helper cannot use is answered with an error or
// dropped, and it goes on serving.
func TestBadRequests(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(testenv.AgentBinary(t))
	defer s.Close()
	sock, err := s.helper()
	if err != nil {
		t.Fatal(err)
	}
	ask := func(msg []byte, withReply bool) string {
		t.Helper()
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pair[0])
		var oob []byte
		if withReply {
			oob = unix.UnixRights(pair[1])
		}
		if err := unix.Sendmsg(int(sock.Fd()), msg, oob, nil, 0); err != nil {
			t.Fatal(err)
		}
		unix.Close(pair[1])
		if !withReply {
			return ""
		}
		buf := make([]byte, 4096)
		n, _, _, _, err := unix.Recvmsg(pair[0], buf, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
	for name, msg := range map[string]string{
		"not JSON":        `{{{`,
		"no command":      `{"path":"","args":[],"stdout":-1,"stderr":-1,"cgroup_dir":-1}`,
		"file it lacks":   `{"path":"/bin/true","args":["true"],"stdout":5,"stderr":-1,"cgroup_dir":-1}`,
		"negative file":   `{"path":"/bin/true","args":["true"],"stdout":-7,"stderr":-1,"cgroup_dir":-1}`,
		"no such program": `{"path":"/nonexistent","args":["x"],"stdout":-1,"stderr":-1,"cgroup_dir":-1}`,
		"no such netns":   `{"path":"/bin/true","args":["true"],"stdout":-1,"stderr":-1,"cgroup_dir":-1,"netns":"/nonexistent"}`,
		"no such dir":     `{"path":"/bin/true","args":["true"],"dir":"/nonexistent","stdout":-1,"stderr":-1,"cgroup_dir":-1}`,
		"not a program":   `{"path":"/etc/hostname","args":["x"],"stdout":-1,"stderr":-1,"cgroup_dir":-1}`,
	} {
		var a answer
		if got := ask([]byte(msg), true); json.Unmarshal([]byte(got), &a) != nil || a.Error == "" || a.Pid != 0 {
			t.Errorf("%s: answered %q, want an error", name, got)
		}
	}
	// A call of the child that failed is named, with what it was about.
	var a answer
	if got := ask([]byte(`{"path":"/bin/true","args":["true"],"dir":"/nonexistent","stdout":-1,"stderr":-1,"cgroup_dir":-1}`), true); json.Unmarshal([]byte(got), &a) != nil || !strings.Contains(a.Error, "chdir") {
		t.Errorf("a missing directory: answered %q, want the chdir named", got)
	}
	if got := ask([]byte(`{"path":"/etc/hostname","args":["x"],"stdout":-1,"stderr":-1,"cgroup_dir":-1}`), true); json.Unmarshal([]byte(got), &a) != nil || !strings.Contains(a.Error, "exec /etc/hostname") {
		t.Errorf("not a program: answered %q, want the exec and its path named", got)
	}
	// Without a socket to answer on: dropped.
	ask([]byte(`{"path":"/bin/true","args":["true"]}`), false)
	// Larger than a request may be.
	big := make([]byte, maxRequest+100)
	for i := range big {
		big[i] = 'x'
	}
	if got := ask(big, true); !strings.Contains(got, "too large") {
		t.Errorf("an oversized request: %q", got)
	}
	c, out := started(t, s, `echo still >&3`, nil)
	defer c.Release()
	if line, _ := out.ReadString('\n'); line != "still\n" {
		t.Fatalf("after bad requests: %q", line)
	}
}
