package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/scheduler"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
)

// schedConfig is the scheduler benchmark's (-only scheduler).
type schedConfig struct {
	url       string // a PostgreSQL server; "" starts a throwaway one
	nodes     int
	sandboxes int
	apis      int // schedulers, each with its own connection pool
	clients   int // concurrent placers per scheduler
	perNode   int // sandboxes of 1 CPU a node has room for
	ttl       time.Duration
	refresh   time.Duration
	fail      float64 // share of nodes that stop renewing, in the second run
	share     int     // scheduler.Config.Share
	pprof     string  // write a CPU profile of the burst here
}

// schedulerBench measures internal/scheduler at scale on the real
// PostgreSQL store: simulated nodes (rows that join, renew their leases and
// take placements; no processes) and several schedulers, each with its own
// connection pool as the API nodes of a cluster have, placing a burst of
// sandboxes of 1 CPU and 256 MiB. Then the same with a share of the nodes
// failing (they stop renewing; an expirer fences them) in the burst.
func schedulerBench(r *report, c schedConfig) {
	if c.url == "" {
		u, stop := startPostgres()
		defer stop()
		c.url = u
	}
	schedRun(r, c, 0)
	if c.fail > 0 {
		schedRun(r, c, c.fail)
	}
}

// schedRun is one burst, on a schema of its own.
func schedRun(r *report, c schedConfig, fail float64) {
	ctx := context.Background()
	name := "bench run"
	if fail > 0 {
		name = fmt.Sprintf("%.0f%% of nodes failing", fail*100)
	}
	u, drop := benchSchema(c.url)
	defer drop()

	// The nodes: joined at once by a pool of their own, big enough that a
	// heartbeat waiting for a node row a placement holds does not hold up
	// the others (each node of a real cluster renews on its own).
	nodesStore, err := postgres.Open(ctx, u+"&pool_max_conns=32")
	check(err)
	defer nodesStore.Close()
	type simNode struct {
		name  string
		epoch int64
		fails bool
	}
	sim := make([]simNode, c.nodes)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < c.nodes; i += 8 {
				n := store.Node{
					Name: fmt.Sprintf("node-%04d", i), Address: fmt.Sprintf("10.%d.%d.%d:7443", i/65536, i/256%256, i%256),
					Version: "bench", Runtimes: []string{"ns"}, Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%3)},
					Capacity: store.Resources{CPU: float64(c.perNode), MemoryMiB: int64(c.perNode) * 512, DiskGiB: int64(c.perNode) * 10, Sandboxes: c.perNode * 2},
				}
				epoch, err := nodesStore.Join(ctx, n, c.ttl)
				check(err)
				// Every k-th node fails: spread over the zones and names.
				fails := fail > 0 && i%int(1/fail) == 0
				sim[i] = simNode{n.Name, epoch, fails}
			}
		}()
	}
	wg.Wait()

	// Heartbeats: goroutines sharing the nodes' pool, each renewing its
	// share of the leases every ttl/3. In the second run the failing nodes
	// renew once more, then stop, a lease less failAfter before the burst:
	// their leases run out failAfter into it.
	const failAfter = 2 * time.Second
	var stopFailing atomic.Bool
	renewCtx, stopRenew := context.WithCancel(ctx)
	var renewals, renewErrs atomic.Int64
	const renewers = 32
	for w := range renewers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(c.ttl / 3)
			defer tick.Stop()
			for {
				select {
				case <-renewCtx.Done():
					return
				case <-tick.C:
				}
				for i := w; i < len(sim); i += renewers {
					if sim[i].fails && stopFailing.Load() {
						continue
					}
					err := nodesStore.Renew(renewCtx, sim[i].name, sim[i].epoch, c.ttl, store.NodeStatus{})
					if renewCtx.Err() != nil {
						return
					}
					renewals.Add(1)
					if err != nil {
						renewErrs.Add(1)
					}
				}
			}
		}()
	}
	if fail > 0 {
		stopFailing.Store(true)
		for i := range sim {
			if sim[i].fails {
				check(nodesStore.Renew(ctx, sim[i].name, sim[i].epoch, c.ttl, store.NodeStatus{}))
			}
		}
	}
	stoppedAt := time.Now()

	// The expirer: what one node of a cluster does, every quarter second.
	var fenced []store.Node
	var fencedAt []time.Duration
	var burstStart time.Time
	var startMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-tick.C:
			}
			got, err := nodesStore.Expire(renewCtx, time.Now(), "lease expired (bench)")
			if renewCtx.Err() != nil {
				return
			}
			check(err)
			startMu.Lock()
			for range got {
				fencedAt = append(fencedAt, time.Since(burstStart))
			}
			fenced = append(fenced, got...)
			startMu.Unlock()
		}
	}()

	// The API nodes.
	scheds := make([]*scheduler.Scheduler, c.apis)
	for i := range scheds {
		st, err := postgres.Open(ctx, u)
		check(err)
		defer st.Close()
		scheds[i] = scheduler.New(scheduler.Config{Store: st, Refresh: c.refresh, Share: c.share})
		defer scheds[i].Close()
	}
	time.Sleep(c.refresh + 200*time.Millisecond) // their first views
	if fail > 0 {
		time.Sleep(time.Until(stoppedAt.Add(c.ttl - failAfter)))
	}

	if c.pprof != "" && fail == 0 {
		f, err := os.Create(c.pprof)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer f.Close()
	}
	sum := func() (st scheduler.Stats) {
		for _, sch := range scheds {
			x := sch.Stats()
			st.Placed += x.Placed
			st.Refused += x.Refused
			st.Full += x.Full
			st.Batches += x.Batches
			st.Refreshes += x.Refreshes
			st.Others += x.Others / float64(len(scheds))
		}
		return st
	}
	st0 := sum()
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	cpu0, pg0 := machineCPU(), postgresCPU(u)
	var next atomic.Int64
	lat := make([][]time.Duration, c.apis*c.clients)
	placedOn := make([]string, c.sandboxes)
	var noRoom, otherErrs atomic.Int64
	var firstErr atomic.Value
	startMu.Lock()
	burstStart = time.Now()
	startMu.Unlock()
	t0 := time.Now()
	for a, sch := range scheds {
		for cl := range c.clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slot := &lat[a*c.clients+cl]
				for {
					i := int(next.Add(1)) - 1
					if i >= c.sandboxes {
						return
					}
					sb := &store.Sandbox{Sandbox: api.Sandbox{
						ID: fmt.Sprintf("sb-%06d", i), State: api.StateCreating, Template: "host", Runtime: "ns",
						CPU: 1, MemoryMiB: 256, DiskGiB: 1, CreatedAt: time.Now().UTC(),
					}}
					t := time.Now()
					_, err := sch.Place(ctx, sb, scheduler.Request{})
					*slot = append(*slot, time.Since(t))
					var nr *scheduler.NoRoomError
					switch {
					case err == nil:
						placedOn[i] = sb.Node
					case errors.As(err, &nr):
						noRoom.Add(1)
					default:
						otherErrs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
				}
			}()
		}
	}
	// Wait for the placers only (the heartbeats run on).
	waitPlacers := func() {
		for next.Load() < int64(c.sandboxes)+int64(c.apis*c.clients) {
			time.Sleep(time.Millisecond)
		}
	}
	waitPlacers()
	wall := time.Since(t0)
	st := sum()
	st.Placed -= st0.Placed
	st.Refused -= st0.Refused
	st.Full -= st0.Full
	st.Batches -= st0.Batches
	st.Refreshes -= st0.Refreshes
	if c.pprof != "" && fail == 0 {
		pprof.StopCPUProfile()
	}
	cpu1, pg1 := machineCPU(), postgresCPU(u)
	var ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)

	// Leases of failing nodes may run out after the burst: let them, so
	// that the check sees the cluster settled.
	if fail > 0 {
		time.Sleep(c.ttl + 500*time.Millisecond)
	}
	stopRenew()
	wg.Wait()

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	placed := 0
	for _, n := range placedOn {
		if n != "" {
			placed++
		}
	}
	mode := fmt.Sprintf("%d schedulers × %d clients, %d nodes", c.apis, c.clients, c.nodes)
	r.add("scheduler placement (store.Place in PostgreSQL), "+name, mode, all)
	r.rate("scheduler placements, "+name, mode, placed, wall, int(noRoom.Load()+otherErrs.Load()), "")

	// The check: what PostgreSQL holds, node by node.
	nodes, err := nodesStore.Nodes(ctx)
	check(err)
	over, live, drift := 0, 0, 0
	minN, maxN := int(^uint(0)>>1), 0
	isFenced := map[string]bool{}
	// Against the sums of the sandbox rows, not the sums the store keeps
	// (Nodes' Committed), which must equal them.
	held := heldByRows(u)
	for _, n := range nodes {
		cm, cp := held[n.Name], n.Capacity
		if k := n.Committed; k.MemoryMiB != cm.MemoryMiB || k.DiskGiB != cm.DiskGiB || k.Sandboxes != cm.Sandboxes || math.Abs(k.CPU-cm.CPU) > 1e-6 {
			drift++
		}
		if cm.CPU > cp.CPU+1e-9 || cm.MemoryMiB > cp.MemoryMiB || cm.DiskGiB > cp.DiskGiB || cm.Sandboxes > cp.Sandboxes {
			over++
		}
		if n.State != store.NodeLive {
			isFenced[n.Name] = true
			continue
		}
		live++
		minN, maxN = min(minN, cm.Sandboxes), max(maxN, cm.Sandboxes)
	}
	rows, lost, onFenced := countRows(u)
	for _, n := range placedOn {
		if isFenced[n] {
			onFenced++
		}
	}
	procCPU := cpuSeconds(ru1) - cpuSeconds(ru0)
	r.note(fmt.Sprintf("Scheduler, %s: %d of %d placed in %v (%.0f/s); %d no room, %d other errors%s. "+
		"Spread over the %d live nodes: %d–%d sandboxes each. Over capacity after the run: %d nodes (checked from PostgreSQL's rows: %d sandbox rows, %d lost; nodes whose kept sums differ from the rows': %d). "+
		"Batches: %d, %.1f placements each; %d refused by the store and placed elsewhere; %d reads of the nodes; each scheduler expected the others to place %.1f times as many as itself. "+
		"Heartbeats: %d renewals (%d refused). CPU in the burst: this process (schedulers and simulated nodes) %.1f s, PostgreSQL %s, anything else on the machine %.1f s, of %.1f s (%d cores × wall).",
		name, placed, c.sandboxes, wall.Round(time.Millisecond), float64(placed)/wall.Seconds(), noRoom.Load(), otherErrs.Load(), firstErrNote(&firstErr),
		live, minN, maxN, over, rows, lost, drift,
		st.Batches, float64(st.Placed+st.Refused)/float64(max(st.Batches, 1)), st.Refused, st.Refreshes, st.Others,
		renewals.Load(), renewErrs.Load(), procCPU, pgNote(pg0, pg1), (cpu1.busy-cpu0.busy)-procCPU-max(pg1-pg0, 0), wall.Seconds()*float64(cpu1.cores), cpu1.cores))
	if fail > 0 {
		sort.Slice(fencedAt, func(i, j int) bool { return fencedAt[i] < fencedAt[j] })
		when := "none"
		if len(fencedAt) > 0 {
			when = fmt.Sprintf("%v to %v after the burst began", fencedAt[0].Round(time.Millisecond), fencedAt[len(fencedAt)-1].Round(time.Millisecond))
		}
		r.note(fmt.Sprintf("Scheduler, %s: %d nodes stopped renewing so that their leases (%v) ran out 2 s into the burst; %d fenced by Expire, %s; %d placements had gone to them before and are lost with them.",
			name, countFailing(c, fail), c.ttl, len(fenced), when, onFenced))
	}
}

func firstErrNote(v *atomic.Value) string {
	if s, ok := v.Load().(string); ok {
		return " (first: " + s + ")"
	}
	return ""
}

func countFailing(c schedConfig, fail float64) int {
	n := 0
	for i := 0; i < c.nodes; i++ {
		if i%int(1/fail) == 0 {
			n++
		}
	}
	return n
}

// countRows counts the sandbox rows in the schema u uses, and the lost.
// heldByRows sums what each node's sandboxes hold from their rows
// (store.Holds), as the store did before it kept the sums.
func heldByRows(u string) map[string]store.Resources {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	check(err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT node, state, SUM(cpu), SUM(memory_mib), SUM(disk_gib), COUNT(*) FROM sandboxes GROUP BY node, state`)
	check(err)
	out := map[string]store.Resources{}
	var node, state string
	var r store.Resources
	_, err = pgx.ForEachRow(rows, []any{&node, &state, &r.CPU, &r.MemoryMiB, &r.DiskGiB, &r.Sandboxes}, func() error {
		c := out[node]
		c.Add(state, r)
		out[node] = c
		return nil
	})
	check(err)
	return out
}

func countRows(u string) (rows, lost, _ int) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	check(err)
	defer conn.Close(ctx)
	check(conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'lost') FROM sandboxes`).Scan(&rows, &lost))
	return rows, lost, 0
}

// benchSchema makes a schema of its own on the server and returns a URL
// using it, and how to drop it.
func benchSchema(base string) (string, func()) {
	name, drop, err := pgtest.Schema(context.Background(), base, "bench_sched_")
	check(err)
	u, err := pgtest.WithSearchPath(base, name)
	check(err)
	return u, func() { check(drop()) }
}

// startPostgres starts a throwaway PostgreSQL server (Debian's), as
// scripts/test.sh does: owned by the postgres user, on a unix socket in a
// temporary directory, with its default settings but for connections.
func startPostgres() (string, func()) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(bins) == 0 {
		fatal("scheduler: PostgreSQL is not installed (apt-get install postgresql), or pass -scheduler-postgres URL")
	}
	sort.Slice(bins, func(i, j int) bool { return pgVersion(bins[i]) < pgVersion(bins[j]) })
	bin := bins[len(bins)-1]
	dir, err := os.MkdirTemp("", "atoll-bench-pg-")
	check(err)
	run := func(args ...string) {
		cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			fatal("scheduler: %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	check(exec.Command("chown", "postgres:", dir).Run())
	run(bin+"/initdb", "-D", dir+"/data", "-U", "postgres", "--auth=trust", "--no-sync")
	run(bin+"/pg_ctl", "start", "-w", "-s", "-D", dir+"/data", "-l", dir+"/log",
		"-o", "-c listen_addresses='' -c unix_socket_directories='"+dir+"' -c max_connections=200")
	return "postgres:///postgres?host=" + dir + "&user=postgres", func() {
		run(bin+"/pg_ctl", "stop", "-s", "-D", dir+"/data", "-m", "fast")
		os.RemoveAll(dir)
	}
}

func pgVersion(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// postgresCPU is the CPU time of the PostgreSQL server u connects to by a
// unix socket (its lock file names the postmaster): the postmaster's, its
// reaped children's and its live children's; -1 if it cannot tell.
func postgresCPU(u string) float64 {
	p, err := url.Parse(u)
	if err != nil {
		return -1
	}
	locks, _ := filepath.Glob(filepath.Join(p.Query().Get("host"), ".s.PGSQL.*.lock"))
	if len(locks) != 1 {
		return -1
	}
	b, err := os.ReadFile(locks[0])
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		return -1
	}
	stat := func(pid string) (ppid int, self, children float64, ok bool) {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return 0, 0, 0, false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // from field 3, state
		num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i-3], 64); return v / 100 }
		ppid, _ = strconv.Atoi(f[1])
		return ppid, num(14) + num(15), num(16) + num(17), true
	}
	_, self, children, ok := stat(strconv.Itoa(pid))
	if !ok {
		return -1
	}
	total := self + children
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if ppid, self, _, ok := stat(e.Name()); ok && ppid == pid {
			total += self
		}
	}
	return total
}

func pgNote(before, after float64) string {
	if before < 0 || after < 0 {
		return "unknown (not a server on a local socket)"
	}
	return fmt.Sprintf("%.1f s", after-before)
}

func cpuSeconds(ru syscall.Rusage) float64 {
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// machineCPU is the machine's busy CPU time so far (/proc/stat), in
// seconds, and its cores.
type machineTime struct {
	busy  float64
	cores int
}

func machineCPU() machineTime {
	b, err := os.ReadFile("/proc/stat")
	check(err)
	var t machineTime
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] == "cpu" {
			for i, v := range f[1:] {
				if i == 3 || i == 4 { // idle, iowait
					continue
				}
				n, _ := strconv.ParseFloat(v, 64)
				t.busy += n / 100 // USER_HZ
			}
		} else if strings.HasPrefix(f[0], "cpu") {
			t.cores++
		}
	}
	return t
}
