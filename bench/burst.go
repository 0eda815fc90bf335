package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime/cgroup"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

type burstConfig struct {
	n, clients, sustained int
	idle                  time.Duration
	serve                 string // extra serve flags
	pprof                 string // directory for CPU profiles; "" for none
}

// burst measures creates in bulk (issue #13) on a server with the default
// warm pool and prestarted processes: (a) a burst of creates from concurrent
// clients on a server idle for a while, each sandbox then running `true`,
// then all deleted; (b) runc and bwrap running `true` at the same
// parallelism in the same root file system; (c) a sustained run of creates
// with deletes running behind them, so that the pools must refill.
func burst(r *report, work string, cfg burstConfig) {
	extra := strings.Fields(cfg.serve)
	var pprofAddr string
	if cfg.pprof != "" {
		check(os.MkdirAll(cfg.pprof, 0o755))
		pprofAddr = freeAddr()
		extra = append(extra, "--debug-pprof", pprofAddr)
	}
	// The serve defaults for the pools: what a user who did not tune gets.
	srv := startServer(work, "burst", 2, 4, extra...)
	defer srv.stop()
	codes := &statusCounter{}
	c := atoll.New(srv.url, srv.key, atoll.WithHTTPClient(&http.Client{Transport: codes.wrap(cfg.clients)}))
	ctx := context.Background()
	// The first sandbox makes the template's layer images.
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	check(c.DeleteSandbox(ctx, sb.ID))
	time.Sleep(cfg.idle)
	if cfg.serve != "" {
		r.note("burst server flags: " + cfg.serve)
	}
	mode := fmt.Sprintf("%d clients", cfg.clients)
	profile := func(name string) func() {
		if pprofAddr == "" {
			return func() {}
		}
		return fetchProfiles(pprofAddr, filepath.Join(cfg.pprof, name))
	}

	b := &burstRun{r: r, c: c, codes: codes, cfg: cfg, mode: mode, profile: profile, pid: srv.cmd.Process.Pid}
	b.creates(ctx)

	// (b) The peers at the same parallelism, in the host template's layer.
	skeleton := filepath.Join(srv.data, "layers", "templates", "host-v2")
	before := burstPeers(r, work, skeleton, cfg)

	rate := b.sustained(ctx)

	// runc once more, right after: the host's speed drifts over a run
	// (a VM's neighbours), and the ratio is taken against runc's rate on
	// both sides of the sustained run.
	root := newPeerRoot(work, skeleton)
	root.mount()
	after := runtimePeer(r, root, "runc", ", after the sustained run", cfg)
	root.umount()
	if before > 0 && after > 0 && rate > 0 {
		mean := (before + after) / 2
		r.note(fmt.Sprintf("sustained creates/s ÷ runc runs/s: %.2f× against runc's mean (%.1f runs/s before the sustained run, %.1f after, mean %.1f); %.2f× against the one before",
			rate/mean, before, after, mean, rate/before))
	}
}

// burstRun is what the burst's phases share: the server's client, its
// status counter and process, and how to profile a phase.
type burstRun struct {
	r       *report
	c       *atoll.Client
	codes   *statusCounter
	cfg     burstConfig
	mode    string
	profile func(name string) func()
	pid     int // the server's
}

// each runs op on every sandbox of ids from the burst's clients, and
// reports its latencies as latency and its rate and errors as rate.
func (b *burstRun) each(ids []string, latency, rate string, op func(id string) error) {
	b.codes.reset()
	var mu sync.Mutex
	var ds []time.Duration
	t0 := time.Now()
	errs := parallel(len(ids), b.cfg.clients, func(i int) error {
		t := time.Now()
		err := op(ids[i])
		mu.Lock()
		ds = append(ds, time.Since(t))
		mu.Unlock()
		return err
	})
	b.r.add(latency, b.mode, ds)
	b.r.rate(rate, b.mode, len(ds)-errs, time.Since(t0), errs, b.codes.summary())
}

// creates is the burst (a): create → ready, then `true` in each, then
// delete all.
func (b *burstRun) creates(ctx context.Context) {
	b.codes.reset()
	done := b.profile("burst")
	cpu0 := cpuOf(b.pid)
	t0 := time.Now()
	var mu sync.Mutex
	var ids []string
	var lat, ready []time.Duration
	errs := parallel(b.cfg.n, b.cfg.clients, func(int) error {
		t := time.Now()
		sb, err := b.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			return err
		}
		mu.Lock()
		ids = append(ids, sb.ID)
		lat, ready = append(lat, time.Since(t)), append(ready, time.Since(t0))
		mu.Unlock()
		return nil
	})
	createWall := time.Since(t0)
	done()
	b.r.add("burst: create → ready (API)", b.mode, lat)
	b.r.rate("burst: creates", b.mode, len(ids), createWall, errs, b.codes.summary())
	sort.Slice(ready, func(i, j int) bool { return ready[i] < ready[j] })
	for _, k := range []int{100, b.cfg.n} {
		if k <= len(ready) {
			b.r.note(fmt.Sprintf("burst: %d sandboxes ready %s after the first request", k, ms(ready[k-1])))
		}
	}
	b.each(ids, "burst: first exec `true` (API)", "burst: first execs", func(id string) error {
		code, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		if err == nil && code != 0 {
			err = fmt.Errorf("true exited %d", code)
		}
		return err
	})
	b.each(ids, "burst: delete (API)", "burst: deletes", func(id string) error { return b.c.DeleteSandbox(ctx, id) })
	// Deleted sandboxes' processes have been reaped by the server, so
	// their CPU time is in its children's.
	b.r.note(fmt.Sprintf("burst: CPU time per sandbox (create, exec, delete; the server and its sandboxes' processes): %s",
		cpuOf(b.pid).per(cpu0, len(ids))))
}

// sustained is (c): creates at the same parallelism, each sandbox deleted
// behind them by as many clients, so that the pools refill as they go.
func (b *burstRun) sustained(ctx context.Context) (createsPerSecond float64) {
	var mu sync.Mutex
	b.codes.reset()
	done := b.profile("sustained")
	scpu0, m0 := cpuOf(b.pid), machineCPU()
	var slat, sdel []time.Duration
	var created, deleted, derrs atomic.Int64
	toDelete := make(chan string, b.cfg.sustained)
	var dwg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < b.cfg.clients; w++ {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for id := range toDelete {
				t := time.Now()
				if err := b.c.DeleteSandbox(ctx, id); err != nil {
					derrs.Add(1)
					fmt.Fprintf(os.Stderr, "bench: sustained delete: %v\n", err)
					continue
				}
				deleted.Add(1)
				mu.Lock()
				sdel = append(sdel, time.Since(t))
				mu.Unlock()
			}
		}()
	}
	errs := parallel(b.cfg.sustained, b.cfg.clients, func(int) error {
		t := time.Now()
		sb, err := b.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			return err
		}
		created.Add(1)
		mu.Lock()
		slat = append(slat, time.Since(t))
		mu.Unlock()
		toDelete <- sb.ID
		return nil
	})
	createWall := time.Since(t0)
	close(toDelete)
	dwg.Wait()
	deleteWall := time.Since(t0)
	m1 := machineCPU()
	done()
	b.r.add("sustained: create → ready (API), deletes behind", b.mode, slat)
	b.r.add("sustained: delete (API), behind the creates", b.mode, sdel)
	sum := b.codes.summary()
	b.r.rate("sustained: creates, deletes behind", b.mode, int(created.Load()), createWall, errs, sum)
	createsPerSecond = float64(created.Load()) / createWall.Seconds()
	b.r.rate("sustained: deletes (from the first create to the last delete)", b.mode, int(deleted.Load()), deleteWall, int(derrs.Load()), sum)
	if b.cfg.sustained > 0 {
		b.r.note(fmt.Sprintf("sustained: CPU time per sandbox (create, delete): %s",
			cpuOf(b.pid).per(scpu0, b.cfg.sustained)))
		// What the counts above miss (kernel threads, interrupts, the
		// bench's own client) and what the machine left idle.
		busy := m1.busy - m0.busy
		b.r.note(fmt.Sprintf("sustained: the machine was busy %.1f%% of the run; all of its CPU time, a sandbox: %s",
			100*busy/(float64(m1.cores)*deleteWall.Seconds()), ms(time.Duration(busy*float64(time.Second))/time.Duration(b.cfg.sustained))))
	}
	return createsPerSecond
}

// burstPeers runs `true` n times at the burst's parallelism with runc,
// crun, the floor (burstFloor) and bwrap in the same root file system.
func burstPeers(r *report, work, skeleton string, cfg burstConfig) (runc float64) {
	root := newPeerRoot(work, skeleton)
	root.mount()
	defer root.umount()
	mode := fmt.Sprintf("%d clients", cfg.clients)
	for _, rt := range []string{"runc", "crun"} {
		if v := runtimePeer(r, root, rt, "", cfg); rt == "runc" {
			runc = v
		}
	}
	burstFloor(r, work, skeleton, cfg)
	if _, err := exec.LookPath("bwrap"); err != nil {
		r.missing("bwrap")
		return runc
	}
	var mu sync.Mutex
	var ds []time.Duration
	cpu0 := childrenCPU()
	t0 := time.Now()
	errs := parallel(cfg.n, cfg.clients, func(int) error {
		t := time.Now()
		out, err := exec.Command("bwrap", bwrapArgs(root.merged)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bwrap: %v: %s", err, strings.TrimSpace(string(out)))
		}
		mu.Lock()
		ds = append(ds, time.Since(t))
		mu.Unlock()
		return nil
	})
	r.add("burst peer: bwrap `true`", mode, ds)
	r.rate("burst peer: bwrap `true` runs", mode, len(ds), time.Since(t0), errs, "")
	r.note(fmt.Sprintf("burst peer: CPU time per bwrap run: %s", ms((childrenCPU()-cpu0)/time.Duration(cfg.n))))
	return runc
}

// runtimePeer runs `true` cfg.n times with rt (runc or crun) at the burst's
// parallelism in root, reports its latencies, rate and CPU under a name
// with suffix, and returns its runs a second (0 if it could not run).
func runtimePeer(r *report, root *peerRoot, rt, suffix string, cfg burstConfig) float64 {
	mode := fmt.Sprintf("%d clients", cfg.clients)
	if _, err := exec.LookPath(rt); err != nil {
		r.missing(rt)
		return 0
	}
	_, name := runtimeArgs(rt, root.bundle, "")
	var mu sync.Mutex
	var ds []time.Duration
	cpu0 := childrenCPU()
	t0 := time.Now()
	errs := parallel(cfg.n, cfg.clients, func(i int) error {
		id := fmt.Sprintf("atoll-burst-%d", i)
		args, _ := runtimeArgs(rt, root.bundle, id)
		t := time.Now()
		out, err := exec.Command(rt, args...).CombinedOutput()
		d := time.Since(t)
		exec.Command(rt, "delete", "-f", id).Run()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", rt, err, strings.TrimSpace(string(out)))
		}
		mu.Lock()
		ds = append(ds, d)
		mu.Unlock()
		return nil
	})
	wall := time.Since(t0)
	if len(ds) == 0 {
		r.failed(name+suffix+", "+mode, "every run failed")
		return 0
	}
	r.add("burst peer: "+name+suffix, mode, ds)
	r.rate("burst peer: "+name+" runs"+suffix, mode, len(ds), wall, errs, "")
	r.note(fmt.Sprintf("burst peer: CPU time per %s run%s (run and delete): %s", rt, suffix, ms((childrenCPU()-cpu0)/time.Duration(cfg.n))))
	return float64(len(ds)) / wall.Seconds()
}

// burstFloor runs the least a stateful sandbox needs, at the burst's
// parallelism: a writable layer of its own (an overlay over the same
// skeleton, mounted and removed by the bench's own syscalls) and new user,
// mount, pid, uts, ipc and network namespaces rooted in it, running
// `true`. No cgroup, agent, API, database or network device: a sandbox does
// all of this and more, so atoll's sustained rate cannot exceed this
// floor's, which bounds what its ratio to runc can become.
//
// The design floor adds what atoll's design asks of every sandbox besides
// its API, records and pools: the writable layer on the data directory's
// btrfs (where snapshots and forks are subvolume snapshots), so that the
// overlay's unmount syncs that file system as a sandbox's end does; a
// cgroup with a default sandbox's limits (on cgroup v1 one in each
// hierarchy atoll uses); and a Go program as the sandbox's first process
// instead of `true`, since the agent is one (no cgo: see STYLE.md), here
// the smallest there is, which starts and exits.
func burstFloor(r *report, work, skeleton string, cfg burstConfig) {
	if _, err := exec.LookPath("unshare"); err != nil {
		r.missing("unshare")
		return
	}
	floorRuns(r, cfg, floorSpec{
		name:     "floor: own overlay + unshare (user, mount, pid, uts, ipc, net) + `true`",
		note:     "floor run",
		layers:   filepath.Join(work, "floor"),
		skeleton: skeleton,
		prog:     "/usr/bin/true",
	})
	// The design floor's layers go on the server's btrfs, beside the
	// template the skeleton is.
	goLayer := filepath.Join(work, "floor-go")
	check(os.MkdirAll(goLayer, 0o755))
	check(os.WriteFile(filepath.Join(work, "floor-go.go"), []byte("package main\n\nfunc main() {}\n"), 0o644))
	build := exec.Command("go", "build", "-o", filepath.Join(goLayer, "floor-go"), filepath.Join(work, "floor-go.go"))
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		r.failed("design floor", fmt.Sprintf("building its Go program: %v: %s", err, bytes.TrimSpace(out)))
		return
	}
	floorRuns(r, cfg, floorSpec{
		name:     "design floor: writable layer on the data btrfs + cgroup + unshare + a Go program",
		note:     "design floor run",
		layers:   filepath.Join(filepath.Dir(filepath.Dir(skeleton)), "bench-floor"),
		skeleton: goLayer + ":" + skeleton,
		prog:     "/floor-go",
		cgroup:   true,
	})
}

// floorLimits are a default sandbox's (control's defaults: 1 CPU, 1 GiB
// without swap, 1024 processes), as the ns runtime writes them.
var floorLimits = func() *specs.LinuxResources {
	mem, pids := int64(1<<30), int64(1024)
	return &specs.LinuxResources{
		CPU:    cgroup.CPU(0, 1),
		Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
		Pids:   &specs.LinuxPids{Limit: &pids},
	}
}()

// floorSpec is one floor: its row's name, where its writable layers go, the
// overlay's lower directories, the program run and whether each run gets a
// cgroup.
type floorSpec struct {
	name, note, layers, skeleton, prog string
	cgroup                             bool
}

// floorRuns runs f's floor cfg.n times at the burst's parallelism.
func floorRuns(r *report, cfg burstConfig, f floorSpec) {
	var mu sync.Mutex
	var ds []time.Duration
	defer os.RemoveAll(f.layers)
	if f.cgroup {
		defer func() {
			if cg, err := cgroup.Load("/atoll-bench-floor"); err == nil {
				cg.Delete()
			}
		}()
	}
	cpu0, self0 := childrenCPU(), cpuOf(os.Getpid())
	t0 := time.Now()
	errs := parallel(cfg.n, cfg.clients, func(i int) error {
		t := time.Now()
		dir := filepath.Join(f.layers, strconv.Itoa(i))
		merged, upper, wd := filepath.Join(dir, "root"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		for _, d := range []string{merged, upper, wd} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		defer os.RemoveAll(dir)
		if err := syscall.Mount("overlay", merged, "overlay", 0, "lowerdir="+f.skeleton+",upperdir="+upper+",workdir="+wd); err != nil {
			return fmt.Errorf("floor overlay: %v", err)
		}
		defer syscall.Unmount(merged, syscall.MNT_DETACH)
		usr := filepath.Join(merged, "usr")
		if err := syscall.Mount("/usr", usr, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("floor /usr: %v", err)
		}
		defer syscall.Unmount(usr, syscall.MNT_DETACH)
		var out bytes.Buffer
		cmd := exec.Command("unshare", "--fork", "--pid", "--mount", "--uts", "--ipc", "--net", "--user", "--map-root-user",
			"--root="+merged, f.prog)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return err
		}
		if f.cgroup {
			// As a sandbox's first process on cgroup v1: born outside,
			// moved in (it may have ended by then).
			cg, err := cgroup.New(fmt.Sprintf("/atoll-bench-floor/%d", i), floorLimits)
			if err != nil {
				cmd.Wait()
				return err
			}
			defer cg.Delete()
			if err := cg.MoveIn(cmd.Process.Pid); err != nil && !errors.Is(err, syscall.ESRCH) {
				cmd.Wait()
				return fmt.Errorf("floor cgroup: %v", err)
			}
		}
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("floor: %v: %s", err, bytes.TrimSpace(out.Bytes()))
		}
		mu.Lock()
		ds = append(ds, time.Since(t))
		mu.Unlock()
		return nil
	})
	wall := time.Since(t0)
	self := cpuOf(os.Getpid())
	r.add("burst peer: "+f.name, fmt.Sprintf("%d clients", cfg.clients), ds)
	r.rate("burst peer: "+f.name+" runs", fmt.Sprintf("%d clients", cfg.clients), len(ds), wall, errs, "")
	r.note(fmt.Sprintf("burst peer: CPU time per %s: %s (the runs %s; the bench's own mounts and cgroups %s)", f.note,
		ms((childrenCPU()-cpu0+self.self-self0.self)/time.Duration(cfg.n)), ms((childrenCPU()-cpu0)/time.Duration(cfg.n)),
		ms((self.self-self0.self)/time.Duration(cfg.n))))
}

// cpuOf is the CPU time, user and system, of process pid, and in children
// that of the processes it started: those it has reaped (for the server: its
// sandboxes' processes, once deleted) and those still running, with what
// they reaped (the server's spawner, whose children the sandboxes' processes
// are). The kernel's own threads (btrfs cleanup, namespace teardown) are
// not in it, for atoll or its peers.
func cpuOf(pid int) cpuTime {
	t, ok := procCPU(pid)
	if !ok {
		check(fmt.Errorf("no process %d", pid))
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(c)
			if ct, ok := procCPU(n); ok {
				t.children += ct.self + ct.children
				t.childrenSys += ct.selfSys + ct.childrenSys
			}
		}
	}
	return t
}

// procCPU reads process pid's own and reaped children's CPU time.
func procCPU(pid int) (cpuTime, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTime{}, false
	}
	// Fields after the command's closing parenthesis; utime is the 14th
	// field of the line, the 12th after it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	var t [4]time.Duration
	for i := range t { // utime, stime, cutime, cstime
		n, err := strconv.ParseInt(f[11+i], 10, 64)
		check(err)
		t[i] = time.Duration(n) * time.Second / clockTicks
	}
	return cpuTime{self: t[0] + t[1], selfSys: t[1], children: t[2] + t[3], childrenSys: t[3]}, true
}

// cpuTime is a process's CPU time and its reaped children's, each with the
// part spent in the kernel.
type cpuTime struct{ self, selfSys, children, childrenSys time.Duration }

// per describes the CPU time from t0 to t per one of n operations.
func (t cpuTime) per(t0 cpuTime, n int) string {
	d := time.Duration(max(n, 1))
	return fmt.Sprintf("%s (the server %s, %s of it in the kernel; its sandboxes' processes %s, %s in the kernel)",
		ms((t.self+t.children-t0.self-t0.children)/d), ms((t.self-t0.self)/d), ms((t.selfSys-t0.selfSys)/d),
		ms((t.children-t0.children)/d), ms((t.childrenSys-t0.childrenSys)/d))
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100

// childrenCPU is the CPU time of the bench's reaped children (the peers).
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parallel runs f(0) … f(n-1) from clients goroutines and returns how many
// failed, printing the first few failures.
func parallel(n, clients int, f func(i int) error) int {
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					if failed.Add(1) <= 5 {
						fmt.Fprintf(os.Stderr, "bench: %v\n", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

// statusCounter counts the HTTP statuses of a client's answers, so that the
// report shows the 429s and 503s that the SDK retried behind the scenes.
type statusCounter struct {
	mu     sync.Mutex
	counts map[int]int
	rt     http.RoundTripper
}

func (s *statusCounter) wrap(clients int) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 2 * clients
	s.rt = t
	s.reset()
	return s
}

func (s *statusCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err == nil {
		s.mu.Lock()
		s.counts[resp.StatusCode]++
		s.mu.Unlock()
	}
	return resp, err
}

func (s *statusCounter) reset() {
	s.mu.Lock()
	s.counts = map[int]int{}
	s.mu.Unlock()
}

// summary lists the answers that were not 2xx, e.g. "429×12".
func (s *statusCounter) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for code, n := range s.counts {
		if code/100 != 2 {
			parts = append(parts, fmt.Sprintf("%d×%d", code, n))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// freeAddr is a loopback address with a port nobody listens on.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer ln.Close()
	return ln.Addr().String()
}

// profileSeconds is how long a CPU profile of the server runs: pprof takes
// only a fixed duration, and this covers a burst or sustained run here. The
// execution trace, which shows where goroutines wait (syscalls, locks, the
// store), is shorter: it grows fast.
const (
	profileSeconds = 20
	traceSeconds   = 4
)

// fetchProfiles starts a CPU profile and an execution trace of the server
// whose pprof endpoint is at addr; the function it returns waits for their
// ends and writes them to prefix-cpu.pprof and prefix.trace.
func fetchProfiles(addr, prefix string) func() {
	var wg sync.WaitGroup
	get := func(path, file string) {
		defer wg.Done()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: pprof: %v\n", err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(file)
		check(err)
		defer f.Close()
		io.Copy(f, resp.Body)
	}
	wg.Add(2)
	go get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", profileSeconds), prefix+"-cpu.pprof")
	go get(fmt.Sprintf("/debug/pprof/trace?seconds=%d", traceSeconds), prefix+".trace")
	return wg.Wait
}
