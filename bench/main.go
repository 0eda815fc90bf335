// Command bench measures atoll through its API beside peers run in the same
// rootfs on the same machine: runc, crun, bwrap, and raw unshare+overlay+exec as
// the floor. It builds and starts its own `atoll serve` on a fresh data
// directory, and prints a Markdown report for docs/benchmarks.md.
//
//	go run ./bench [-n 100] [-clients 8]
//
// It needs root and the peers' Debian packages (runc, crun, bubblewrap); a
// missing peer is reported, not fatal. Figures are reports, not pass/fail.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/netns"
	"github.com/atoll-dev/atoll/internal/runtime/host"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func main() {
	n := flag.Int("n", 100, "iterations per measurement")
	clients := flag.Int("clients", 8, "concurrent clients for the concurrent run")
	only := flag.String("only", "", "comma-separated parts to run (core,templates,state,forks,prestarted,recent,warm,e2b,mcp,dashboard,runtimes,ports,autoresume,vault,vaultmount,metering,telemetry,peers,burst; and codeinterp, scheduler and cluster, only when named); default all but codeinterp, scheduler and cluster")
	flag.Int64Var(&hostDirtyLimit, "layer-dirty-limit", 0, "the servers' --layer-dirty-limit (0: their default; -1: the kernel's defaults)")
	var b burstConfig
	flag.IntVar(&b.n, "burst-n", 300, "burst: creates in the burst")
	flag.IntVar(&b.clients, "burst-clients", 16, "burst: concurrent clients")
	flag.DurationVar(&b.idle, "burst-idle", time.Minute, "burst: how long the server is idle before the burst")
	flag.IntVar(&b.sustained, "burst-sustained", 1000, "burst: creates in the sustained run, with deletes behind them")
	flag.StringVar(&b.serve, "burst-serve", "", "burst: extra flags for its server, e.g. \"--create-concurrency 8\"")
	flag.StringVar(&b.pprof, "burst-pprof", "", "burst: write the server's CPU profiles of the burst and the sustained run to this directory")
	logPath := flag.String("server-log", "", "append the servers' logs (with --debug) to this file")
	var sc schedConfig
	flag.StringVar(&sc.url, "scheduler-postgres", "", "scheduler: the PostgreSQL server to use (a URL); default: start a throwaway one")
	flag.IntVar(&sc.nodes, "scheduler-nodes", 1000, "scheduler: simulated nodes")
	flag.IntVar(&sc.sandboxes, "scheduler-n", 50000, "scheduler: placements in the burst")
	flag.IntVar(&sc.apis, "scheduler-apis", 8, "scheduler: schedulers (API nodes), each with its own connection pool")
	flag.IntVar(&sc.clients, "scheduler-clients", 256, "scheduler: concurrent placers per scheduler")
	flag.IntVar(&sc.perNode, "scheduler-per-node", 64, "scheduler: a node's capacity in sandboxes of 1 CPU")
	flag.DurationVar(&sc.ttl, "scheduler-ttl", 10*time.Second, "scheduler: the nodes' lease; they renew every third of it")
	flag.DurationVar(&sc.refresh, "scheduler-refresh", 0, "scheduler: how often a scheduler reads the nodes again (0: the scheduler's default)")
	flag.IntVar(&sc.share, "scheduler-share", 0, "scheduler: placements of a batch that share a draw (0: the scheduler's default)")
	flag.StringVar(&sc.pprof, "scheduler-pprof", "", "scheduler: write a CPU profile of the first burst to this file")
	flag.Float64Var(&sc.fail, "scheduler-fail", 0.1, "scheduler: share of nodes that stop renewing in the second run (0: no second run)")
	var cc clusterConfig
	flag.IntVar(&cc.n, "cluster-n", 100, "cluster: creates in the burst")
	flag.IntVar(&cc.clients, "cluster-clients", 16, "cluster: concurrent clients, spread over the nodes")
	flag.Parse()
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		check(err)
		defer f.Close()
		serverLog, serverArgs = f, []string{"--debug"}
	}
	parts := map[string]bool{}
	for _, p := range strings.Split(*only, ",") {
		if p != "" {
			parts[p] = true
		}
	}
	want := func(part string) bool { return len(parts) == 0 || parts[part] }
	if os.Geteuid() != 0 {
		fatal("bench needs root")
	}
	// The scheduler's benchmark runs only when asked for (it needs no
	// atoll server, and a PostgreSQL server of its own for minutes).
	if parts["scheduler"] {
		r := &report{}
		r.machine()
		schedulerBench(r, sc)
		delete(parts, "scheduler")
		if len(parts) == 0 {
			r.print(os.Stdout, *n, *clients, *only)
			fmt.Printf("\nScheduler: `-scheduler-nodes %d -scheduler-n %d -scheduler-apis %d -scheduler-clients %d -scheduler-per-node %d -scheduler-ttl %v -scheduler-refresh %v -scheduler-fail %v`\n",
				sc.nodes, sc.sandboxes, sc.apis, sc.clients, sc.perNode, sc.ttl, sc.refresh, sc.fail)
			return
		}
		r.print(os.Stdout, *n, *clients, "scheduler")
	}
	work, err := os.MkdirTemp("", "atoll-bench-")
	check(err)
	os.Chmod(work, 0o711)
	workDir = work
	defer removeWork()
	// The cluster's benchmark runs only when asked for: it starts four
	// servers, PostgreSQL and S3 of its own.
	if parts["cluster"] {
		r := &report{}
		r.machine()
		clusterBench(r, work, cc)
		r.print(os.Stdout, *n, *clients, "cluster")
		fmt.Printf("\nCluster: `-cluster-n %d -cluster-clients %d`\n", cc.n, cc.clients)
		delete(parts, "cluster")
		if len(parts) == 0 {
			return
		}
	}
	srv := startServer(work, "cold", 0, 0)
	defer srv.stop()

	r := &report{}
	r.machine()
	c := srv.client()
	ctx := context.Background()

	// Warm up: the first sandbox builds the host template.
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	check(c.DeleteSandbox(ctx, sb.ID))

	// The parts, in the order they run (and -only names them).
	for _, p := range []struct {
		name string
		run  func()
	}{
		{"core", func() { core(r, c, *n, *clients) }},
		{"templates", func() { templates(r, srv, min(*n, 30)) }},
		{"state", func() { state(r, srv, min(*n, 20)) }},
		{"forks", func() { forks(r, srv, "no prestarted processes", min(*n, 20)) }},
		{"prestarted", func() { prestarted(r, work, *n) }},
		{"recent", func() { recent(r, work, min(*n, 20)) }},
		{"warm", func() { warm(r, work, *n, *clients) }},
		{"e2b", func() { e2bSDK(r, srv, min(*n, 50)) }},
		{"dashboard", func() { dashboard(r, srv, min(*n, 30)) }},
		{"mcp", func() { mcpBench(r, srv, min(*n, 50)) }},
		{"codeinterp", func() { codeInterp(r, work, min(*n, 10)) }},
		{"runtimes", func() { runtimes(r, work, min(*n, 30)) }},
		{"ports", func() { ports(r, work, min(*n, 30)) }},
		{"autoresume", func() { autoResume(r, work, min(*n, 20)) }},
		{"burst", func() { burst(r, work, b) }},
		{"vault", func() { vaultBench(r, work, *n) }},
		{"vaultmount", func() { vaultMountBench(r, work, min(*n, 50), 1000) }},
		{"metering", func() { metering(r, work, min(*n, 50)) }},
		{"telemetry", func() { telemetry(r, work, min(*n, 100)) }},
		{"peers", func() { peers(r, work, filepath.Join(srv.data, "layers", "templates", "host-v2"), *n) }},
	} {
		// codeinterp builds a template from Debian's mirror (minutes, and
		// the network): only when named.
		if want(p.name) && (p.name != "codeinterp" || parts[p.name]) {
			p.run()
		}
	}
	r.print(os.Stdout, *n, *clients, *only)
	if want("burst") {
		fmt.Printf("\nBurst: `-burst-n %d -burst-clients %d -burst-idle %v -burst-sustained %d`\n", b.n, b.clients, b.idle, b.sustained)
	}
}

// core measures create, exec and delete one at a time and from concurrent
// clients, on the cold server.
func core(r *report, c *atoll.Client, n, clients int) {
	ctx := context.Background()
	var create, exec1, del []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		create = append(create, time.Since(t0))
		t0 = time.Now()
		_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		check(err)
		exec1 = append(exec1, time.Since(t0))
		t0 = time.Now()
		check(c.DeleteSandbox(ctx, sb.ID))
		del = append(del, time.Since(t0))
	}
	r.add("atoll create → ready (API), cold", "sequential", create)
	r.add("atoll first exec `true` (API)", "sequential", exec1)
	r.add("atoll delete (API)", "sequential", del)

	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	r.add("atoll exec `true` round trip (API)", "sequential", execTrues(ctx, c, sb.ID, n*5))
	check(c.DeleteSandbox(ctx, sb.ID))

	// Concurrent clients, each creating, exec'ing and deleting.
	var mu sync.Mutex
	var ccreate, cexec, cdel []time.Duration
	var wg sync.WaitGroup
	per := max(n/clients, 1)
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				t0 := time.Now()
				sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
				check(err)
				t1 := time.Now()
				_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
				check(err)
				t2 := time.Now()
				check(c.DeleteSandbox(ctx, sb.ID))
				t3 := time.Now()
				mu.Lock()
				ccreate, cexec, cdel = append(ccreate, t1.Sub(t0)), append(cexec, t2.Sub(t1)), append(cdel, t3.Sub(t2))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	conc := fmt.Sprintf("%d clients", clients)
	r.add("atoll create → ready (API), cold", conc, ccreate)
	r.add("atoll first exec `true` (API)", conc, cexec)
	r.add("atoll delete (API)", conc, cdel)

}

// warm measures creates served by the warm pool: one at a time with a pause
// that lets the pool refill, and a burst of concurrent clients that drains it.
func warm(r *report, work string, n, clients int) {
	srv := startServer(work, "warm", clients, 0)
	defer srv.stop()
	c := srv.client()
	ctx := context.Background()
	time.Sleep(3 * time.Second)
	var ds []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		ds = append(ds, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
		time.Sleep(150 * time.Millisecond)
	}
	r.add("atoll create → ready (API), warm pool hit", "sequential", ds)
	var ex []time.Duration
	time.Sleep(time.Second)
	for i := 0; i < n; i++ {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		t0 := time.Now()
		_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		check(err)
		ex = append(ex, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
		time.Sleep(150 * time.Millisecond)
	}
	r.add("atoll first exec `true` (API), warm pool", "sequential", ex)
	time.Sleep(3 * time.Second)
	var mu sync.Mutex
	var burst []time.Duration
	var ids []string
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
			check(err)
			mu.Lock()
			burst = append(burst, time.Since(t0))
			ids = append(ids, sb.ID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, id := range ids {
		check(c.DeleteSandbox(ctx, id))
	}
	r.add(fmt.Sprintf("atoll create → ready (API), burst into a pool of %d", clients), fmt.Sprintf("%d clients", clients), burst)
}

type server struct {
	stopped   bool
	bin       string
	cmd       *exec.Cmd
	data, url string
	key       string
	// netns is the network namespace the server runs in, "" for the
	// bench's own; args are its flags.
	netns   string
	args    []string
	log     string   // the server's log (stderr)
	logFile *os.File // open while the server runs
}

// serverArgs are flags every server the bench starts gets besides its own,
// e.g. -server-log's --debug.
var serverArgs []string

// serverLog, when set, receives the servers' logs (stderr).
var serverLog io.Writer = io.Discard

func startServer(work, name string, pool, prestart int, extra ...string) *server {
	// Networking stays off: it would turn the machine running the benchmark
	// into a router (and the figures here predate it).
	return startServerIn(work, name, "", append([]string{"--network", "off", "--warm-pool", fmt.Sprint(pool), "--prestart", fmt.Sprint(prestart)}, extra...)...)
}

// startServerIn starts `atoll serve` with flags args (and serverArgs),
// inside the network namespace at ns unless it is "".
func startServerIn(work, name, ns string, args ...string) *server {
	bin := buildAtoll(work)
	data := filepath.Join(work, name)
	full := append(append(append([]string{"serve", "--listen", "127.0.0.1:0", "--data", data,
		"--layer-image-size", fmt.Sprint(int64(16 << 30))}, dirtyArgs()...), serverArgs...), args...)
	cmd := exec.Command(bin, full...)
	out, err := cmd.StdoutPipe()
	check(err)
	// Each server's log is kept beside its data: the recent part reads the
	// freezes it reports.
	logPath := data + ".log"
	logFile, err := os.Create(logPath)
	check(err)
	cmd.Stderr = logFile
	if serverLog != io.Discard {
		// Through a pipe that exec copies from until the server exits:
		// the file stays open until stop.
		cmd.Stderr = io.MultiWriter(logFile, serverLog)
	}
	if ns != "" {
		// Born in the namespace: Start runs on a thread that joined it.
		check(netns.Run(ns, cmd.Start))
	} else {
		check(cmd.Start())
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "Try:") {
			break
		}
	}
	go io.Copy(io.Discard, out)
	url, err := os.ReadFile(filepath.Join(data, "url"))
	check(err)
	key, err := os.ReadFile(filepath.Join(data, "api-key"))
	check(err)
	srv := &server{bin: bin, cmd: cmd, data: data, url: strings.TrimSpace(string(url)), key: strings.TrimSpace(string(key)),
		netns: ns, args: args, log: logPath, logFile: logFile}
	servers = append(servers, srv)
	return srv
}

// client is an API client of s, connecting from s's network namespace.
func (s *server) client() *atoll.Client {
	if s.netns == "" {
		return atoll.New(s.url, s.key)
	}
	return atoll.New(s.url, s.key, atoll.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: s.dial}}))
}

// dial connects to addr from s's network namespace.
func (s *server) dial(ctx context.Context, netw, addr string) (conn net.Conn, err error) {
	if s.netns == "" {
		return (&net.Dialer{}).DialContext(ctx, netw, addr)
	}
	err = netns.Run(s.netns, func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, netw, addr)
		return err
	})
	return conn, err
}

// servers are the servers started, stopped by fatal too.
var servers []*server

// stop ends the server and every sandbox it left: sandboxes outlive their
// server by design, so a last start without a warm pool or prestarted
// processes (which a stop while they start can leave behind) discards pooled ones
// and the remaining ones are deleted through the API.
func (s *server) stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	s.cmd.Process.Signal(os.Interrupt)
	s.cmd.Wait()
	s.logFile.Close()
	// The same flags (networking included, so that sandboxes' networks are
	// released), later ones winning.
	last := exec.Command(s.bin, append(append([]string{"serve", "--listen", "127.0.0.1:0", "--data", s.data}, s.args...),
		"--warm-pool", "0", "--prestart", "0", "--network-pool", "0")...)
	start := last.Start
	if s.netns != "" {
		start = func() error { return netns.Run(s.netns, last.Start) }
	}
	if out, err := last.StdoutPipe(); err == nil && start() == nil {
		sc := bufio.NewScanner(out)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "Try:") {
		}
		go io.Copy(io.Discard, out)
		c := s.client()
		if url, err := os.ReadFile(filepath.Join(s.data, "url")); err == nil {
			s.url = strings.TrimSpace(string(url))
			c = s.client()
		}
		if sbs, err := c.ListSandboxes(context.Background(), atoll.ListOptions{}); err == nil {
			for _, sb := range sbs {
				c.DeleteSandbox(context.Background(), sb.ID)
			}
		}
		last.Process.Signal(os.Interrupt)
		last.Wait()
	}
	exec.Command("umount", "-l", filepath.Join(s.data, "layers")).Run()
	for _, d := range []string{"run", "run-gvisor", "run-vm", "lowers"} {
		exec.Command("umount", "-l", filepath.Join(s.data, d)).Run()
	}
}

// peerRoot is the root file system the peers run `true` in: the host
// template's own layer (skeleton) under a fresh overlay, with the host's
// /usr bound read-only, as the bundle's rootfs. umount takes it down again
// and empties the upper layer.
type peerRoot struct {
	bundle, merged, upper, work, skeleton string
}

func newPeerRoot(work, skeleton string) *peerRoot {
	p := &peerRoot{bundle: filepath.Join(work, "peer"), skeleton: skeleton}
	p.merged = filepath.Join(p.bundle, "rootfs")
	p.upper = filepath.Join(p.bundle, "upper")
	p.work = filepath.Join(p.bundle, "work")
	for _, d := range []string{p.merged, p.upper, p.work} {
		check(os.MkdirAll(d, 0o755))
	}
	writeOCIConfig(filepath.Join(p.bundle, "config.json"))
	return p
}

func (p *peerRoot) mount() {
	must("mount", "-t", "overlay", "overlay", "-o", "lowerdir="+p.skeleton+",upperdir="+p.upper+",workdir="+p.work, p.merged)
	must("mount", "--bind", "-o", "ro", "/usr", filepath.Join(p.merged, "usr"))
}

func (p *peerRoot) umount() {
	must("umount", filepath.Join(p.merged, "usr"))
	must("umount", p.merged)
	os.RemoveAll(p.upper)
	os.RemoveAll(p.work)
	os.MkdirAll(p.upper, 0o755)
	os.MkdirAll(p.work, 0o755)
}

// runtimeArgs is how the bench runs `true` in bundle with OCI runtime rt
// (runc, crun) under container id, and the row's name.
func runtimeArgs(rt, bundle, id string) (args []string, name string) {
	// crun 1.8 refuses cgroup v1 on hybrid hosts; it runs without a
	// cgroup manager there (so it does less work than runc and atoll).
	args = []string{"run", "--bundle", bundle, id}
	name = rt + " run `true`"
	if rt == "crun" && hybridCgroups() {
		args = append([]string{"--cgroup-manager=disabled"}, args...)
		name += " (no cgroups)"
	}
	return args, name
}

// bwrapArgs runs `true` with bwrap in root merged.
func bwrapArgs(merged string) []string {
	return []string{"--bind", merged, "/", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
		"--unshare-all", "/usr/bin/true"}
}

// peers runs `true` in the same rootfs (the host template: its own layer with
// the host's /usr bound read-only) with each peer that is installed.
func peers(r *report, work, skeleton string, n int) {
	root := newPeerRoot(work, skeleton)
	mountRoot, umountRoot, merged := root.mount, root.umount, root.merged

	// The exec floor: this host running `true` with no sandbox at all.
	var host []time.Duration
	for i := 0; i < n*5; i++ {
		t0 := time.Now()
		must("/usr/bin/true")
		host = append(host, time.Since(t0))
	}
	r.add("floor: fork+exec+wait `true` on the host (Go os/exec)", "sequential", host)

	// The floor: a fresh overlay, then unshare into new namespaces and exec.
	if _, err := exec.LookPath("unshare"); err == nil {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			mountRoot()
			must("unshare", "--fork", "--pid", "--mount", "--uts", "--ipc", "--net", "--user", "--map-root-user",
				"--root="+merged, "/usr/bin/true")
			umountRoot()
			ds = append(ds, time.Since(t0))
		}
		r.add("floor: overlay mount + unshare + exec `true`", "sequential", ds)
	}

	mountRoot()
	defer umountRoot()
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.missing(rt)
			continue
		}
		_, name := runtimeArgs(rt, root.bundle, "")
		var ds []time.Duration
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("atoll-bench-%d", i)
			args, _ := runtimeArgs(rt, root.bundle, id)
			t0 := time.Now()
			out, err := exec.Command(rt, args...).CombinedOutput()
			if err != nil {
				r.failed(name, fmt.Sprintf("%v: %s", err, bytes.TrimSpace(out)))
				ds = nil
				break
			}
			ds = append(ds, time.Since(t0))
			exec.Command(rt, "delete", "-f", id).Run()
		}
		if ds != nil {
			r.add(name, "sequential", ds)
		}
	}
	if _, err := exec.LookPath("bwrap"); err == nil {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			must("bwrap", bwrapArgs(merged)...)
			ds = append(ds, time.Since(t0))
		}
		r.add("bwrap `true`", "sequential", ds)
	} else {
		r.missing("bwrap")
	}
}

// writeOCIConfig writes a runtime-spec config like `runc spec`'s default, with
// the host's /usr bound read-only and `true` as the process.
func writeOCIConfig(path string) {
	cfg := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false, "user": map[string]int{"uid": 0, "gid": 0},
			"args": []string{"/usr/bin/true"}, "env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/",
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": "rootfs", "readonly": false},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}},
			"resources":  map[string]any{"memory": map[string]int64{"limit": 1 << 30}, "pids": map[string]int64{"limit": 1024}},
		},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	check(err)
	check(os.WriteFile(path, b, 0o644))
}

type row struct {
	name, mode string
	p50, p99   time.Duration
	n          int
}

// rateRow is a throughput: n operations done in wall time, with failures
// and the non-2xx answers seen on the way.
type rateRow struct {
	name, mode string
	n, errs    int
	wall       time.Duration
	answers    string
}

type report struct {
	rows     []row
	rates    []rateRow
	notes    []string
	missed   []string
	failures []string
	cpu      string
	kernel   string
	started  time.Time
}

func (r *report) machine() {
	r.started = time.Now()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				r.cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := exec.Command("uname", "-r").Output(); err == nil {
		r.kernel = strings.TrimSpace(string(b))
	}
}

func (r *report) add(name, mode string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p := func(q float64) time.Duration { return ds[min(int(q*float64(len(ds))), len(ds)-1)] }
	r.rows = append(r.rows, row{name: name, mode: mode, p50: p(0.5), p99: p(0.99), n: len(ds)})
}

func (r *report) rate(name, mode string, n int, wall time.Duration, errs int, answers string) {
	r.rates = append(r.rates, rateRow{name: name, mode: mode, n: n, wall: wall, errs: errs, answers: answers})
}

func (r *report) missing(name string) { r.missed = append(r.missed, name) }

func (r *report) note(s string) { r.notes = append(r.notes, s) }

func (r *report) failed(name, why string) { r.failures = append(r.failures, name+": "+why) }

// hybridCgroups reports whether v1 controllers sit beside an empty v2 tree.
func hybridCgroups() bool {
	_, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers")
	return err == nil
}

func (r *report) print(w io.Writer, n, clients int, only string) {
	fmt.Fprintf(w, "Machine: %s, %d cores, kernel %s, %s\n\n", r.cpu, runtime.NumCPU(), r.kernel, r.started.UTC().Format("2006-01-02"))
	if only != "" {
		only = " -only " + only
	}
	fmt.Fprintf(w, "Command: `go run ./bench -n %d -clients %d%s`\n\n", n, clients, only)
	var runc time.Duration
	for _, x := range r.rows {
		if x.name == "runc run `true`" {
			runc = x.p50
		}
	}
	fmt.Fprintln(w, "| measurement | mode | n | p50 | p99 | p50 vs runc run |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, x := range r.rows {
		ratio := "–"
		if runc > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(x.p50)/float64(runc))
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", x.name, x.mode, x.n, ms(x.p50), ms(x.p99), ratio)
	}
	if len(r.rates) > 0 {
		fmt.Fprintln(w, "\n| throughput | mode | done | wall | per second | failed | non-2xx answers |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for _, x := range r.rates {
			if x.answers == "" {
				x.answers = "–"
			}
			fmt.Fprintf(w, "| %s | %s | %d | %.2f s | %.1f | %d | %s |\n", x.name, x.mode, x.n, x.wall.Seconds(),
				float64(x.n)/x.wall.Seconds(), x.errs, x.answers)
		}
	}
	for _, note := range r.notes {
		fmt.Fprintf(w, "\n%s\n", note)
	}
	for _, f := range r.failures {
		fmt.Fprintf(w, "\nFailed, not measured: %s\n", f)
	}
	if len(r.missed) > 0 {
		fmt.Fprintf(w, "\nNot installed, not measured: %s\n", strings.Join(r.missed, ", "))
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func must(name string, args ...string) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		fatal("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func check(err error) {
	if err != nil {
		fatal("%v", err)
	}
}

// execTrues runs `true` in sandbox id count times, one after another, and
// returns how long each round trip took.
func execTrues(ctx context.Context, c *atoll.Client, id string, count int) []time.Duration {
	var ds []time.Duration
	for range count {
		t0 := time.Now()
		code, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		check(err)
		if code != 0 {
			fatal("true exited %d in sandbox %s", code, id)
		}
		ds = append(ds, time.Since(t0))
	}
	return ds
}

// ok checks the error of a call whose value is not wanted.
func ok[T any](_ T, err error) { check(err) }

// pairs does a then b, count times, and returns how long each took: for
// the operations measured with the one that undoes them.
func pairs(count int, a, b func()) (as, bs []time.Duration) {
	for range count {
		t0 := time.Now()
		a()
		t1 := time.Now()
		b()
		as, bs = append(as, t1.Sub(t0)), append(bs, time.Since(t1))
	}
	return as, bs
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	removeWork()
	os.Exit(1)
}

// workDir holds the servers' data directories.
var workDir string

// removeWork stops every server, unmounts what they left mounted (their
// layer images, layer image mounts and run directories) and removes the
// work directory.
func removeWork() {
	for _, s := range servers {
		s.stop()
	}
	if workDir == "" {
		return
	}
	for _, m := range host.MountsUnder(workDir) { // deepest first
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	os.RemoveAll(workDir)
}
