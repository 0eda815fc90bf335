// Package spawn starts the ns runtime's sandbox processes from a small
// helper process (the agent binary in its spawn role, launch.Spawn) instead
// of from the server.
//
// Why: a clone that creates a user namespace cannot be a vfork, so Go copies
// the forking process's page tables for it, and until the child's exec the
// parent takes a copy-on-write fault, with a TLB shootdown across CPUs, for
// every page it writes; the exec then frees the copy. For the server, a
// large and busy process, that was about a third of its CPU in a burst of
// creates (docs/benchmarks.md, issue #13). The helper's address space is
// small and quiet, so the same clone costs it little; and on amd64 it does
// not copy it at all: its child shares it and runs system calls alone up to
// its exec (clone_amd64.go).
//
// The server sends each start over a SOCK_SEQPACKET socket: the command as
// JSON, its files as SCM_RIGHTS, with first a socket for the answer (the
// child's PID, and a pidfd). The helper is the child's parent and reaps it.
// The helper dies with the server (Pdeathsig), and a child that has not
// cleared its own parent-death signal (a prestarted process, not yet
// configured) dies with the helper: so with the server, as before.
package spawn

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime/host"
)

// request is one process to start. Files index the descriptors that came
// with it (after the answer socket, which is first).
type request struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Stdout, Stderr and Extra are indexes into the files; -1 for none.
	Stdout int   `json:"stdout"`
	Stderr int   `json:"stderr"`
	Extra  []int `json:"extra"`
	// CgroupDir, if not -1, is the v2 cgroup directory the child is born
	// in (CLONE_INTO_CGROUP).
	CgroupDir int `json:"cgroup_dir"`
	// Netns, if set, is the network namespace the child is born in.
	Netns string `json:"netns,omitempty"`
	Attr  attr   `json:"attr"`
}

// attr is what the ns runtime sets of syscall.SysProcAttr.
type attr struct {
	Cloneflags                 uintptr                `json:"cloneflags"`
	UidMappings                []syscall.SysProcIDMap `json:"uid_mappings,omitempty"`
	GidMappings                []syscall.SysProcIDMap `json:"gid_mappings,omitempty"`
	GidMappingsEnableSetgroups bool                   `json:"setgroups,omitempty"`
	Credential                 *syscall.Credential    `json:"credential,omitempty"`
	Setsid                     bool                   `json:"setsid,omitempty"`
	Pdeathsig                  syscall.Signal         `json:"pdeathsig,omitempty"`
}

// answer is the helper's reply; a pidfd of the child comes with it.
type answer struct {
	Pid   int    `json:"pid"`
	Error string `json:"error,omitempty"`
}

// maxRequest bounds a request's JSON, maxFiles its descriptors.
const (
	maxRequest = 64 << 10
	maxFiles   = 16
)

// Spawner is the server's side: a helper process and the socket to it.
type Spawner struct {
	path string // the agent binary

	mu   sync.Mutex
	sock *os.File // nil until started, and after the helper died
	proc *os.Process
}

// New returns a Spawner that runs agentPath in its spawn role, started on
// first use and again if it dies.
func New(agentPath string) *Spawner { return &Spawner{path: agentPath} }

// helper returns the socket to a running helper, starting one if needed.
func (s *Spawner) helper() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sock != nil {
		return s.sock, nil
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "spawner"), os.NewFile(uintptr(pair[1]), "spawner-helper")
	defer theirs.Close()
	cmd := exec.Command(s.path, launch.Spawn)
	cmd.Args[0] = launch.Name
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{theirs} // launch.SpawnFD
	// It dies with the server. Pdeathsig follows the thread that forked,
	// so the fork happens on a thread that never ends (below).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := onLastingThread(cmd.Start); err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting the spawner: %w", err)
	}
	go func() {
		_ = cmd.Wait()
		s.mu.Lock()
		if s.sock == ours {
			s.sock = nil
		}
		s.mu.Unlock()
		ours.Close()
	}()
	s.sock, s.proc = ours, cmd.Process
	return ours, nil
}

// lasting is a thread locked to a goroutine that never returns: the parent
// thread of the helper, whose end would kill it (Pdeathsig).
var lasting = sync.OnceValue(func() chan func() {
	c := make(chan func())
	go func() {
		goruntime.LockOSThread()
		for f := range c {
			f()
		}
	}()
	return c
})

func onLastingThread(f func() error) error {
	errc := make(chan error, 1)
	lasting() <- func() { errc <- f() }
	return <-errc
}

// Close ends the helper; prestarted children die with it.
func (s *Spawner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sock == nil {
		return nil
	}
	err := s.sock.Close()
	s.sock = nil
	return err
}

// Child is a process the helper started.
type Child struct {
	Pid   int
	pidfd *os.File
}

// Signal sends sig to the child through its pidfd, so never to a process
// that later took its PID.
func (c *Child) Signal(sig syscall.Signal) error {
	return unix.PidfdSendSignal(int(c.pidfd.Fd()), sig, nil, 0)
}

// Kill kills the child.
func (c *Child) Kill() error { return c.Signal(syscall.SIGKILL) }

// Release closes the pidfd.
func (c *Child) Release() error { return c.pidfd.Close() }

// Wait waits up to timeout (0: not at all) for the child to exit, and
// reports whether it has (host.WaitPidfd).
func (c *Child) Wait(timeout time.Duration) (exited bool) {
	exited, _ = host.WaitPidfd(int(c.pidfd.Fd()), timeout)
	return exited
}

// Start starts cmd from the helper, in the network namespace at netns if
// set and, if cgroupDir is not nil, in that v2 cgroup from birth. cmd's
// Stdin must be nil and its Stdout, Stderr and ExtraFiles *os.File or nil;
// of its SysProcAttr, what attr holds is used. cmd itself is not started
// (its Process stays nil).
func (s *Spawner) Start(cmd *exec.Cmd, netns string, cgroupDir *os.File) (*Child, error) {
	if cmd.Stdin != nil {
		return nil, errors.New("spawn: stdin is not passed")
	}
	var files []*os.File
	index := func(w any) (int, error) {
		if w == nil {
			return -1, nil
		}
		f, ok := w.(*os.File)
		if !ok {
			return -1, fmt.Errorf("spawn: %T is not a file", w)
		}
		if f == nil {
			return -1, nil
		}
		files = append(files, f)
		return len(files) - 1, nil
	}
	req := request{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Netns: netns, CgroupDir: -1}
	if req.Env == nil {
		req.Env = []string{}
	}
	var err error
	if req.Stdout, err = index(cmd.Stdout); err != nil {
		return nil, err
	}
	if req.Stderr, err = index(cmd.Stderr); err != nil {
		return nil, err
	}
	for _, f := range cmd.ExtraFiles {
		i, err := index(f)
		if err != nil {
			return nil, err
		}
		req.Extra = append(req.Extra, i)
	}
	if cgroupDir != nil {
		req.CgroupDir, _ = index(cgroupDir)
	}
	if a := cmd.SysProcAttr; a != nil {
		req.Attr = attr{Cloneflags: a.Cloneflags, UidMappings: a.UidMappings, GidMappings: a.GidMappings,
			GidMappingsEnableSetgroups: a.GidMappingsEnableSetgroups, Credential: a.Credential,
			Setsid: a.Setsid, Pdeathsig: a.Pdeathsig}
	}
	if len(files)+1 > maxFiles {
		return nil, fmt.Errorf("spawn: %d files, at most %d", len(files), maxFiles-1)
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if len(msg) > maxRequest {
		return nil, fmt.Errorf("spawn: request of %d bytes, at most %d", len(msg), maxRequest)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	reply, theirs := pair[0], pair[1]
	defer unix.Close(reply)
	fds := []int{theirs}
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	sent := false
	for attempt := 0; attempt < 2 && !sent; attempt++ {
		sock, err := s.helper()
		if err != nil {
			unix.Close(theirs)
			return nil, err
		}
		err = sendmsg(int(sock.Fd()), msg, unix.UnixRights(fds...))
		goruntime.KeepAlive(files)
		switch {
		case err == nil:
			sent = true
		case errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET):
			// The helper died (it is started again); once more.
			s.mu.Lock()
			if s.sock == sock {
				s.sock = nil
			}
			s.mu.Unlock()
		default:
			unix.Close(theirs)
			return nil, fmt.Errorf("spawn: sending: %w", err)
		}
	}
	unix.Close(theirs)
	if !sent {
		return nil, errors.New("spawn: the spawner is not running")
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := recvmsg(reply, buf, oob)
	if err != nil {
		return nil, fmt.Errorf("spawn: reading the answer: %w", err)
	}
	var pidfd *os.File
	if oobn > 0 {
		if fds, err := parseRights(oob[:oobn]); err == nil && len(fds) > 0 {
			pidfd = os.NewFile(uintptr(fds[0]), "pidfd")
			for _, fd := range fds[1:] {
				unix.Close(fd)
			}
		}
	}
	if n == 0 {
		if pidfd != nil {
			pidfd.Close()
		}
		return nil, errors.New("spawn: the spawner ended without answering")
	}
	var a answer
	if err := json.Unmarshal(buf[:n], &a); err != nil {
		if pidfd != nil {
			pidfd.Close()
		}
		return nil, fmt.Errorf("spawn: answer: %w", err)
	}
	if a.Error != "" {
		if pidfd != nil {
			pidfd.Close()
		}
		return nil, errors.New(a.Error)
	}
	if pidfd == nil {
		return nil, errors.New("spawn: no pidfd came with the answer")
	}
	return &Child{Pid: a.Pid, pidfd: pidfd}, nil
}

// sendmsg is unix.Sendmsg, again on EINTR; a peer gone is EPIPE, with no
// SIGPIPE.
func sendmsg(fd int, msg, oob []byte) error {
	for {
		err := unix.Sendmsg(fd, msg, oob, nil, unix.MSG_NOSIGNAL)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// recvmsg is unix.Recvmsg, again on EINTR, with the received descriptors
// close-on-exec.
func recvmsg(fd int, buf, oob []byte) (n, oobn, flags int, from unix.Sockaddr, err error) {
	for {
		n, oobn, flags, from, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// parseRights returns the descriptors in control messages oob.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

// Main is the helper (launch.Spawn): it serves starts on launch.SpawnFD
// until the server closes its end, then exits.
func Main([]string) {
	if err := serve(launch.SpawnFD); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-agent spawn:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serve(sock int) error {
	// What this process inherited must not pass on to the sandboxes
	// (its socket, above all: a way to start processes as root).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return err
	}
	buf := make([]byte, maxRequest)
	oob := make([]byte, unix.CmsgSpace(4*maxFiles))
	for {
		n, oobn, flags, _, err := recvmsg(sock, buf, oob)
		if err != nil {
			return err
		}
		var fds []int
		if oobn > 0 {
			fds, _ = parseRights(oob[:oobn])
		}
		if n == 0 && len(fds) == 0 {
			return nil // the server closed its end
		}
		if len(fds) == 0 {
			continue // nowhere to answer
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			answerErr(fds[0], "spawn: request too large")
			closeAll(fds)
			continue
		}
		var req request
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			answerErr(fds[0], "spawn: bad request: "+err.Error())
			closeAll(fds)
			continue
		}
		go start(req, fds)
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func answerErr(reply int, msg string) {
	b, _ := json.Marshal(answer{Error: msg})
	_ = sendmsg(reply, b, nil)
}

// start starts req's process, answers on fds[0] and reaps the process.
func start(req request, fds []int) {
	reply, files := fds[0], make([]*os.File, len(fds)-1)
	for i, fd := range fds[1:] {
		files[i] = os.NewFile(uintptr(fd), fmt.Sprint("file", i))
	}
	defer unix.Close(reply)
	file := func(i int) (*os.File, error) {
		if i == -1 {
			return nil, nil
		}
		if i < 0 || i >= len(files) {
			return nil, fmt.Errorf("spawn: no file %d", i)
		}
		return files[i], nil
	}
	cmd, err := command(req, file)
	pid, pidfd := 0, -1
	if err == nil {
		run := func() (err error) {
			if haveFastStart {
				pid, pidfd, err = fastStart(cmd)
				return err
			}
			cmd.SysProcAttr.PidFD = &pidfd
			if err := cmd.Start(); err != nil {
				return err
			}
			pid = cmd.Process.Pid
			return nil
		}
		if req.Netns != "" {
			err = netns.Run(req.Netns, run)
		} else {
			err = run()
		}
	}
	// The child holds its own copies now.
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		answerErr(reply, err.Error())
		return
	}
	b, _ := json.Marshal(answer{Pid: pid})
	var rights []byte
	if pidfd >= 0 {
		rights = unix.UnixRights(pidfd)
	}
	_ = sendmsg(reply, b, rights)
	if pidfd >= 0 {
		unix.Close(pidfd)
	}
	if haveFastStart {
		reap(pid)
	} else {
		_ = cmd.Wait()
	}
}

// command is req as an exec.Cmd, its files from file.
func command(req request, file func(int) (*os.File, error)) (*exec.Cmd, error) {
	if req.Path == "" || len(req.Args) == 0 {
		return nil, errors.New("spawn: no command")
	}
	cmd := &exec.Cmd{Path: req.Path, Args: req.Args, Env: req.Env, Dir: req.Dir}
	var err error
	var out, errf *os.File
	if out, err = file(req.Stdout); err != nil {
		return nil, err
	}
	if errf, err = file(req.Stderr); err != nil {
		return nil, err
	}
	// Set only when present: a nil *os.File in the interface is not nil.
	if out != nil {
		cmd.Stdout = out
	}
	if errf != nil {
		cmd.Stderr = errf
	}
	for _, i := range req.Extra {
		f, err := file(i)
		if err != nil {
			return nil, err
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	a := req.Attr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: a.Cloneflags, UidMappings: a.UidMappings, GidMappings: a.GidMappings,
		GidMappingsEnableSetgroups: a.GidMappingsEnableSetgroups, Credential: a.Credential,
		Setsid: a.Setsid, Pdeathsig: a.Pdeathsig}
	if req.CgroupDir != -1 {
		dir, err := file(req.CgroupDir)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dir.Fd())
	}
	return cmd, nil
}
