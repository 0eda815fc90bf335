package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// drainDelay bounds how long a process's exit event waits for its output
// after it exits: a grandchild left running may hold the pipes open forever.
const drainDelay = 500 * time.Millisecond

const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// spec is a validated ExecRequest.
type spec struct {
	argv  []string // as the client gave it
	path  string   // the executable argv[0] resolves to
	env   []string
	dir   string
	acct  account
	pty   *api.PTYSize
	stdin []byte
	keep  bool
	tmo   time.Duration
	bg    bool
	// detach: streamed, but the process outlives its stream.
	detach bool
	tag    string
}

func checkEnv(k, v string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
		return errorf(errdefs.ErrInvalid, "bad environment variable %q", k)
	}
	return nil
}

func (a *Agent) prepare(req *api.ExecRequest) (*spec, error) {
	var argv []string
	switch {
	case len(req.Cmd) > 0 && req.Shell != "":
		return nil, errorf(errdefs.ErrInvalid, "set only one of cmd and shell")
	case len(req.Cmd) > 0:
		argv = req.Cmd
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	default:
		return nil, errorf(errdefs.ErrInvalid, "set cmd or shell")
	}
	for _, s := range argv {
		if strings.ContainsRune(s, 0) {
			return nil, errorf(errdefs.ErrInvalid, "command contains NUL")
		}
	}
	if argv[0] == "" {
		return nil, errorf(errdefs.ErrInvalid, "empty command name")
	}
	if req.TimeoutMs < 0 {
		return nil, errorf(errdefs.ErrInvalid, "negative timeout_ms")
	}
	if req.PTY != nil && (req.PTY.Rows == 0 || req.PTY.Cols == 0) {
		return nil, errorf(errdefs.ErrInvalid, "pty rows and cols must be positive")
	}
	acct, err := a.lookupUser(req.User)
	if err != nil {
		return nil, err
	}

	env := map[string]string{
		"PATH":    basePath,
		"HOME":    acct.home,
		"USER":    acct.name,
		"LOGNAME": acct.name,
		"LANG":    "C.UTF-8",
	}
	if req.PTY != nil {
		env["TERM"] = "xterm-256color"
	}
	a.envMu.Lock()
	maps.Copy(env, a.defaultEnv)
	a.envMu.Unlock()
	for k, v := range req.Env {
		if err := checkEnv(k, v); err != nil {
			return nil, err
		}
		env[k] = v
	}

	dir := req.Cwd
	if dir == "" && a.cfg.DefaultCwd != "" {
		if fi, err := os.Stat(a.cfg.DefaultCwd); err == nil && fi.IsDir() {
			dir = a.cfg.DefaultCwd
		}
	}
	if dir == "" {
		dir = acct.home
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			dir = "/"
		}
	} else {
		if dir, err = cleanPath(dir); err != nil {
			return nil, fmt.Errorf("cwd: %w", err)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, errorf(errdefs.ErrInvalid, "cwd %s does not exist", dir)
		}
		if !fi.IsDir() {
			return nil, errorf(errdefs.ErrInvalid, "cwd %s is not a directory", dir)
		}
	}

	path, err := lookPath(argv[0], env["PATH"], dir)
	if err != nil {
		return nil, err
	}
	s := &spec{
		argv:  argv,
		path:  path,
		dir:   dir,
		acct:  acct,
		pty:   req.PTY,
		stdin: req.Stdin,
		// A terminal's input stays open: ^D on it would end an interactive shell.
		keep:   req.KeepStdin || req.PTY != nil,
		tmo:    time.Duration(req.TimeoutMs) * time.Millisecond,
		bg:     req.Background,
		detach: req.Detach && !req.Background,
		tag:    req.Tag,
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		s.env = append(s.env, k+"="+env[k])
	}
	return s, nil
}

// lookPath resolves name as the child would: the agent's own environment is
// empty, so exec.LookPath cannot.
func lookPath(name, pathEnv, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := isExecutable(p); err != nil {
			return "", errorf(errdefs.ErrInvalid, "%s: %v", name, err)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", errorf(errdefs.ErrInvalid, "%s: executable file not found in PATH", name)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return errors.Unwrap(err) // the errno, without the path again
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// process is a process the agent started.
//
// Lock order: stdinMu and mu are never held together; stdinMu may be held
// for as long as a write to the process's stdin blocks, so nothing waits
// for it while holding mu. Agent.procMu comes before mu.
type process struct {
	pid        int
	argv       []string
	tag        string
	isPTY      bool
	background bool
	startedAt  time.Time

	ptmx    *os.File   // PTY only: stdin and output
	outputs []*os.File // read ends of the output pipes (or ptmx)
	stdinF  *os.File   // write end of stdin (or ptmx)

	status   chan unix.WaitStatus // from the waiter; buffered
	timedOut atomic.Bool
	readers  sync.WaitGroup
	closing  <-chan struct{} // the agent's

	// stdinMu serialises writers; held across a write so bytes stay in order.
	stdinMu     sync.Mutex
	stdinClosed bool

	mu     sync.Mutex
	exited bool           // reaped: the pid may be reused, never signal it
	reaped chan struct{}  // closed once exited is set
	exit   *api.ExecEvent // the final event, once output is drained
	subs   map[*subscriber]struct{}
	// backlog is a terminal's output while nobody was attached (the
	// newest maxBacklog bytes), given to the next to attach: what a shell
	// printed before the terminal's websocket was open (its prompt) is
	// not lost, as a terminal multiplexer keeps it. PTY only: a pipe's
	// output goes to whoever is attached, and a background process's
	// lines to the sandbox's log.
	backlog []byte
}

// maxBacklog bounds a terminal's backlog.
const maxBacklog = 64 << 10

// subscriber receives a process's events until ch is closed after the exit
// event.
type subscriber struct {
	ch   chan api.ExecEvent
	gone chan struct{} // closed when the subscriber stops listening
}

func (p *process) info() api.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	ap := api.Process{PID: p.pid, Cmd: p.argv, Tag: p.tag, PTY: p.isPTY, Running: p.exit == nil, StartedAt: p.startedAt}
	if p.exit != nil {
		ap.ExitCode = p.exit.ExitCode
	}
	return ap
}

// subscribe registers for events from now on. If the process has already
// finished it returns the exit event instead.
//
// A terminal's backlog comes first: the subscriber's first event, or,
// if the process has exited meanwhile, the first of the two its
// subscriber holds (then closed), the exit the second.
func (p *process) subscribe() (*subscriber, *api.ExecEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil && len(p.backlog) == 0 {
		return nil, p.exit
	}
	s := &subscriber{ch: make(chan api.ExecEvent, 16), gone: make(chan struct{})}
	if len(p.backlog) > 0 {
		s.ch <- api.ExecEvent{Type: api.EventStdout, Data: p.backlog}
		p.backlog = nil
	}
	if p.exit != nil {
		s.ch <- *p.exit
		close(s.ch)
		return s, nil
	}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *process) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// broadcast hands ev to every subscriber. A slow subscriber slows the process
// down (backpressure through the pipe) rather than losing output.
func (p *process) broadcast(ev api.ExecEvent) {
	p.mu.Lock()
	if p.isPTY && len(p.subs) == 0 {
		p.backlog = append(p.backlog, ev.Data...)
		if n := len(p.backlog) - maxBacklog; n > 0 {
			p.backlog = append(p.backlog[:0], p.backlog[n:]...)
		}
		p.mu.Unlock()
		return
	}
	subs := slices.Collect(maps.Keys(p.subs))
	p.mu.Unlock()
	for _, s := range subs {
		p.deliver(s, ev)
	}
}

// deliver hands ev to s, unless s is gone or the process is closing.
func (p *process) deliver(s *subscriber, ev api.ExecEvent) {
	select {
	case s.ch <- ev:
	case <-s.gone:
	case <-p.closing:
	}
}

func (p *process) finish(ev api.ExecEvent) {
	p.mu.Lock()
	p.exit = &ev
	subs := slices.Collect(maps.Keys(p.subs))
	p.subs = nil
	p.mu.Unlock()
	for _, s := range subs {
		p.deliver(s, ev)
		close(s.ch)
	}
}

// signal sends sig to the process's group.
func (p *process) signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return errorf(errdefs.ErrConflict, "process %d has exited", p.pid)
	}
	if err := unix.Kill(-p.pid, sig); err != nil {
		// The process may have left its group (setsid, job control).
		if err := unix.Kill(p.pid, sig); err != nil {
			return fmt.Errorf("signalling process %d: %w", p.pid, err)
		}
	}
	return nil
}

func (p *process) kill() { p.signal(unix.SIGKILL) }

// read passes what f gives to the process's subscribers as events of typ,
// and a background process's lines to the sandbox's log too.
func (p *process) read(f *os.File, typ string, logs *logRing) {
	defer p.readers.Done()
	var lines *lineSplitter
	if p.background && logs != nil {
		lines = &lineSplitter{emit: func(l string) { logs.add(p.pid, p.tag, typ, l) }}
		defer lines.flush()
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if lines != nil {
				lines.write(buf[:n])
			}
			p.broadcast(api.ExecEvent{Type: typ, Data: bytes.Clone(buf[:n])})
		}
		if err != nil {
			return
		}
	}
}

// writeStdin copies r to the process's stdin.
func (p *process) writeStdin(r io.Reader) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	return p.writeStdinLocked(r)
}

func (p *process) writeStdinLocked(r io.Reader) error {
	if p.stdinClosed {
		return errorf(errdefs.ErrConflict, "stdin of process %d is closed", p.pid)
	}
	if _, err := io.Copy(p.stdinF, r); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) {
			return errorf(errdefs.ErrConflict, "stdin of process %d is closed", p.pid)
		}
		return fmt.Errorf("writing stdin: %w", err)
	}
	return nil
}

// closeStdin ends the process's input. On a terminal that is an end-of-file
// character (^D), as a user would type it: closing the terminal would hang it up.
func (p *process) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	return p.closeStdinLocked()
}

func (p *process) closeStdinLocked() error {
	if p.stdinClosed {
		return nil
	}
	if p.isPTY {
		if err := p.writeStdinLocked(strings.NewReader("\x04")); err != nil {
			return err
		}
	} else {
		p.stdinF.Close()
	}
	p.stdinClosed = true
	return nil
}

func (p *process) resize(size api.PTYSize) error {
	if !p.isPTY {
		return errorf(errdefs.ErrConflict, "process %d has no terminal", p.pid)
	}
	if size.Rows == 0 || size.Cols == 0 {
		return errorf(errdefs.ErrInvalid, "rows and cols must be positive")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil {
		return errorf(errdefs.ErrConflict, "process %d has exited", p.pid)
	}
	if err := pty.Setsize(p.ptmx, &pty.Winsize{Rows: size.Rows, Cols: size.Cols}); err != nil {
		return fmt.Errorf("resizing terminal: %w", err)
	}
	return nil
}

// start starts the process s describes. A non-nil subscriber is registered
// before the process starts, so it misses no output.
func (a *Agent) start(s *spec, withSub bool) (*process, *subscriber, error) {
	p := &process{
		argv:       s.argv,
		tag:        s.tag,
		isPTY:      s.pty != nil,
		background: s.bg || s.detach, // listed after it exits, to whoever reconnects
		status:     make(chan unix.WaitStatus, 1),
		reaped:     make(chan struct{}),
		closing:    a.closing,
		subs:       make(map[*subscriber]struct{}),
	}
	var sub *subscriber
	if withSub {
		sub, _ = p.subscribe()
	}
	attr := &syscall.SysProcAttr{}
	child, err := p.openStdio(s, attr)
	if err != nil {
		return nil, nil, err
	}
	if s.acct.uid != 0 || s.acct.gid != 0 {
		groups := make([]uint32, len(s.acct.groups))
		for i, g := range s.acct.groups {
			groups[i] = uint32(g)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(s.acct.uid), Gid: uint32(s.acct.gid), Groups: groups}
	}
	if err := a.spawn(p, s, child, attr); err != nil {
		return nil, nil, err
	}
	a.supervise(p, s)
	a.log.Debug("process started", "op", "exec", "pid", p.pid, "pty", p.isPTY, "background", p.background)
	return p, sub, nil
}

// openStdio makes p's side of the process's standard files, a terminal or
// three pipes, and returns the child's side, which spawn closes. It sets in
// attr what the terminal or the pipes ask of the child's session.
func (p *process) openStdio(s *spec, attr *syscall.SysProcAttr) (child []*os.File, err error) {
	if s.pty != nil {
		ptmx, tty, err := pty.Open()
		if err != nil {
			return nil, errorf(errdefs.ErrUnavailable, "opening terminal: %v", err)
		}
		if err := pty.Setsize(ptmx, &pty.Winsize{Rows: s.pty.Rows, Cols: s.pty.Cols}); err != nil {
			ptmx.Close()
			tty.Close()
			return nil, fmt.Errorf("sizing terminal: %w", err)
		}
		p.ptmx, p.stdinF, p.outputs = ptmx, ptmx, []*os.File{ptmx}
		attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
		return []*os.File{tty, tty, tty}, nil
	}
	var fds [6]*os.File // stdin r w, stdout r w, stderr r w
	for i := 0; i < 6; i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range fds[:i] {
				f.Close()
			}
			return nil, errorf(errdefs.ErrUnavailable, "creating pipes: %v", err)
		}
		fds[i], fds[i+1] = r, w
	}
	p.stdinF, p.outputs = fds[1], []*os.File{fds[2], fds[4]}
	attr.Setpgid = true
	return []*os.File{fds[0], fds[3], fds[5]}, nil
}

// spawn starts the process with child as its standard files, unless the
// agent is shutting down, and registers it with the reaper before it can
// exit. On failure p's side of the files is closed too.
func (a *Agent) spawn(p *process, s *spec, child []*os.File, attr *syscall.SysProcAttr) error {
	a.procMu.Lock()
	closed := a.closed
	a.procMu.Unlock()
	var (
		proc *os.Process
		err  error
	)
	if closed {
		err = errorf(errdefs.ErrUnavailable, "agent is shutting down")
	} else {
		a.reapMu.Lock()
		start := func() {
			proc, err = os.StartProcess(s.path, s.argv, &os.ProcAttr{Dir: s.dir, Env: s.env, Files: child, Sys: attr})
		}
		if a.cfg.StartOn != nil {
			a.cfg.StartOn(start)
		} else {
			start()
		}
		if err == nil && a.cfg.Reap {
			a.waiters[proc.Pid] = p
		}
		a.reapMu.Unlock()
	}
	for _, f := range slices.Compact(child) {
		f.Close()
	}
	if err != nil {
		p.stdinF.Close()
		for _, f := range p.outputs {
			f.Close()
		}
		if _, ok := err.(*kindError); ok {
			return err
		}
		return startError(s.argv[0], err)
	}
	p.pid = proc.Pid
	p.startedAt = time.Now().UTC()
	proc.Release() // we wait with wait4, not through os.Process
	return nil
}

// supervise starts what follows a started process: its wait (unless the
// agent reaps), its listing, its output readers, its timeout, the feeding
// of its stdin and its monitor.
func (a *Agent) supervise(p *process, s *spec) {
	if !a.cfg.Reap {
		a.wg.Go(func() {
			var ws unix.WaitStatus
			for {
				_, err := unix.Wait4(p.pid, &ws, 0, nil)
				if err != syscall.EINTR {
					break
				}
			}
			p.status <- ws
		})
	}

	a.procMu.Lock()
	a.procs[p.pid] = p
	if a.closed {
		p.kill()
	}
	a.procMu.Unlock()

	types := []string{api.EventStdout, api.EventStderr}
	for i, f := range p.outputs {
		p.readers.Add(1)
		a.wg.Go(func() { p.read(f, types[i], a.logs) })
	}
	var timer *time.Timer
	if s.tmo > 0 {
		timer = time.AfterFunc(s.tmo, func() {
			p.timedOut.Store(true)
			p.kill()
		})
	}
	if len(s.stdin) > 0 || !s.keep {
		p.stdinMu.Lock() // taken here so later writes queue behind these bytes
		a.wg.Go(func() {
			defer p.stdinMu.Unlock()
			if len(s.stdin) > 0 {
				if err := p.writeStdinLocked(bytes.NewReader(s.stdin)); err != nil {
					return
				}
			}
			if !s.keep {
				p.closeStdinLocked()
			}
		})
	}
	a.wg.Go(func() { a.monitor(p, timer) })
}

func startError(name string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EAGAIN, syscall.ENOMEM:
			return errorf(errdefs.ErrUnavailable, "starting %s: %v", name, errno)
		}
		return errorf(errdefs.ErrInvalid, "starting %s: %v", name, errno)
	}
	return fmt.Errorf("starting %s: %w", name, err)
}

// monitor waits for p to exit, lets its output drain, and sends the exit event.
func (a *Agent) monitor(p *process, timer *time.Timer) {
	ws := <-p.status
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	close(p.reaped)
	if timer != nil {
		timer.Stop()
	}

	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainDelay):
	}
	for _, f := range p.outputs {
		f.Close() // unblocks readers still waiting on a pipe a grandchild holds
	}
	<-drained
	p.stdinF.Close() // unblocks a writer the process will never read

	ev := api.ExecEvent{Type: api.EventExit, TimedOut: p.timedOut.Load()}
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = -1
		ev.Signal = unix.SignalName(ws.Signal())
	}
	ev.ExitCode = &code
	// Retire before the exit event goes out: a client that has seen a
	// foreground process end must not find it listed any more.
	a.retire(p)
	p.finish(ev)
	a.log.Debug("process exited", "op", "exec", "pid", p.pid, "exit_code", code, "signal", ev.Signal)
}

// retire drops a finished foreground process and keeps the last keepExited
// background ones listed so clients can learn how they ended.
func (a *Agent) retire(p *process) {
	a.procMu.Lock()
	defer a.procMu.Unlock()
	if !p.background {
		if a.procs[p.pid] == p {
			delete(a.procs, p.pid)
		}
		return
	}
	a.exited = append(a.exited, p)
	if len(a.exited) > keepExited {
		old := a.exited[0]
		a.exited = slices.Delete(a.exited, 0, 1)
		if a.procs[old.pid] == old {
			delete(a.procs, old.pid)
		}
	}
}

func (a *Agent) process(pidStr string) (*process, error) {
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return nil, errorf(errdefs.ErrInvalid, "bad pid %q", pidStr)
	}
	a.procMu.Lock()
	defer a.procMu.Unlock()
	p, ok := a.procs[pid]
	if !ok {
		return nil, errorf(errdefs.ErrNotFound, "no process %d", pid)
	}
	return p, nil
}

func (a *Agent) processes(tag string) []api.Process {
	a.procMu.Lock()
	ps := slices.Collect(maps.Values(a.procs))
	a.procMu.Unlock()
	list := []api.Process{}
	for _, p := range ps {
		if tag == "" || p.tag == tag {
			list = append(list, p.info())
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].StartedAt.Before(list[j].StartedAt) })
	return list
}

// reaper collects the exit status of every child, including orphans
// re-parented to the agent, and routes those of processes it started.
func (a *Agent) reaper() {
	defer close(a.reaperDone)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	// A periodic sweep as well: signals coalesce, and one lost would strand a zombie.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		a.reapAll()
		select {
		case <-sigs:
		case <-tick.C:
		case <-a.reaperStop:
			return
		}
	}
}

func (a *Agent) reapAll() {
	a.reapMu.Lock()
	defer a.reapMu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if p, ok := a.waiters[pid]; ok {
			delete(a.waiters, pid)
			p.status <- ws // buffered; each process exits once
		}
	}
}

// parseSignal accepts "SIGTERM", "TERM", "term" or "15".
func parseSignal(s string) (unix.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errorf(errdefs.ErrInvalid, "bad signal %q", s)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, errorf(errdefs.ErrInvalid, "bad signal %q", s)
	}
	return sig, nil
}
