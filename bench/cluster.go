package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

type clusterConfig struct {
	n, clients int
}

// clusterBench measures a burst of creates through the three nodes of a
// cluster (issue 16) beside the same burst on one `atoll serve` with
// SQLite, both made by the test harness netcluster (each server in a
// network namespace of its own, networking on, no warm pool or prestarted
// processes): creates/s, create latency, and the placements per node. The
// cluster's PostgreSQL and S3 servers are throwaway ones started here.
func clusterBench(r *report, work string, cfg clusterConfig) {
	bin := buildAtoll(work)
	pg, stopPG := startPostgres()
	defer stopPG()
	s3, stopS3 := startS3(work)
	defer stopS3()
	for k, v := range map[string]string{"ATOLL_TEST_POSTGRES_URL": pg, "ATOLL_TEST_S3_URL": s3,
		"AWS_ACCESS_KEY_ID": "atoll-bench", "AWS_SECRET_ACCESS_KEY": "atoll-bench"} {
		os.Setenv(k, v)
	}
	args := []string{"--warm-pool", "0", "--prestart", "0"}
	mode := fmt.Sprintf("%d clients", cfg.clients)

	single := harness(r, "cluster: one node (SQLite)", func(t testing.TB) *netcluster.Cluster {
		return netcluster.New(t, netcluster.Config{Bin: bin, Nodes: 1, Args: args})
	})
	if single == nil {
		return
	}
	one := clusterBurst(r, single.c, "one node, SQLite", mode, cfg)
	single.close()

	// Room for every sandbox of the burst on any node: what is measured is
	// placement and the cluster's overhead, not refusals.
	capacity := fmt.Sprintf("cpu=%d,memory=%dGi,disk=%d,sandboxes=%d", cfg.n, cfg.n, cfg.n*10, cfg.n)
	three := harness(r, "cluster: three nodes", func(t testing.TB) *netcluster.Cluster {
		return netcluster.New(t, netcluster.Config{Bin: bin, Cluster: true,
			Args: append(args, "--node-capacity", capacity)})
	})
	if three == nil {
		return
	}
	// The schedulers' views of the nodes are a second old at most: let
	// every node's include the others (see TestClusterPlacement).
	time.Sleep(1500 * time.Millisecond)
	all := clusterBurst(r, three.c, "3 nodes, PostgreSQL", mode, cfg)
	if one > 0 && all > 0 {
		r.note(fmt.Sprintf("cluster: 3 nodes create %.2f× the creates/s of one node on the same machine (2 cores shared by all three nodes and PostgreSQL)", all/one))
	}
	three.close()

	// The same cluster with warm pools following demand (--warm-pool
	// 8, the most each node keeps): a first burst is the demand, and once
	// the pools have filled from it, the burst measured takes the warm
	// sandboxes first and starts the rest cold.
	pooled := harness(r, "cluster: three nodes, warm pools", func(t testing.TB) *netcluster.Cluster {
		return netcluster.New(t, netcluster.Config{Bin: bin, Cluster: true,
			Args: []string{"--warm-pool", "8", "--prestart", "0", "--node-lease", "3s", "--node-capacity", capacity}})
	})
	if pooled == nil {
		return
	}
	defer pooled.close()
	time.Sleep(1500 * time.Millisecond)
	clusterBurst(r, pooled.c, "3 nodes, warm pools, the demand", mode, cfg)
	warm := waitWarm(pooled.c)
	time.Sleep(1500 * time.Millisecond) // every scheduler's view sees them
	withPools := clusterBurst(r, pooled.c, "3 nodes, warm pools", mode, cfg)
	r.note(fmt.Sprintf("cluster: warm sandboxes waiting before the burst: %d; with them 3 nodes create %.2f× the creates/s they create without", warm, withPools/max(all, 1e-9)))
}

// waitWarm waits until the warm sandboxes of c's nodes stop growing (or
// 30 s), and returns how many there are.
func waitWarm(c *netcluster.Cluster) int {
	ctx := context.Background()
	last, since := -1, time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ns, err := c.Nodes[0].Client().ListNodes(ctx)
		check(err)
		n := 0
		for _, nd := range ns {
			for _, w := range nd.Warm {
				n += w
			}
		}
		if n != last {
			last, since = n, time.Now()
		} else if n > 0 && time.Since(since) > 3*time.Second {
			break
		}
	}
	return last
}

// clusterBurst creates cfg.n sandboxes through the nodes of c, round
// robin, from cfg.clients clients, then deletes them; it reports the
// latency, the rate and the placements per node, and returns the rate.
func clusterBurst(r *report, c *netcluster.Cluster, name, mode string, cfg clusterConfig) float64 {
	ctx := context.Background()
	clients := make([]*atoll.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = n.Client()
	}
	// The first create makes the template's layer image on its node.
	for _, cl := range clients {
		sb, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		check(cl.DeleteSandbox(ctx, sb.ID))
	}
	var mu sync.Mutex
	var lat []time.Duration
	on := map[string]int{}
	var ids []string
	warm := 0
	t0 := time.Now()
	errs := parallel(cfg.n, cfg.clients, func(i int) error {
		t := time.Now()
		sb, err := clients[i%len(clients)].CreateSandbox(ctx, api.CreateSandboxRequest{Explain: len(c.Nodes) > 1})
		if err != nil {
			return err
		}
		mu.Lock()
		lat = append(lat, time.Since(t))
		on[sb.Node]++
		if sb.Placement != nil && sb.Placement.Warm {
			warm++
		}
		ids = append(ids, sb.ID)
		mu.Unlock()
		return nil
	})
	wall := time.Since(t0)
	r.add("cluster burst: create → ready (API), "+name, mode, lat)
	r.rate("cluster burst: creates, "+name, mode, len(ids), wall, errs, "")
	if len(c.Nodes) > 1 {
		var nodes []string
		for n := range on {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		var parts []string
		for _, n := range nodes {
			parts = append(parts, fmt.Sprintf("%s %d", n, on[n]))
		}
		r.note(fmt.Sprintf("cluster burst, %s: placements by node: %s; %d served warm", name, strings.Join(parts, ", "), warm))
	}
	parallel(len(ids), cfg.clients, func(i int) error { return clients[i%len(clients)].DeleteSandbox(ctx, ids[i]) })
	return float64(len(ids)) / wall.Seconds()
}

// buildAtoll builds atoll and atoll-agent into work, once.
func buildAtoll(work string) string {
	bin := filepath.Join(work, "atoll")
	if _, err := os.Stat(bin); err != nil {
		// Both binaries, as `go install ./cmd/...` would put them: the server
		// then runs the smaller atoll-agent in sandboxes.
		build := exec.Command("go", "build", "-o", work, "./cmd/atoll", "./cmd/atoll-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stderr = os.Stderr
		check(build.Run())
	}
	return bin
}

// startS3 starts gofakes3 (installed from the Go module proxy, as
// scripts/test.sh does) on a loopback port, its data under work, and
// returns its URL for --blob.
func startS3(work string) (string, func()) {
	gobin, err := exec.Command("go", "env", "GOPATH").Output()
	check(err)
	dir := filepath.Join(strings.TrimSpace(string(gobin)), "bin")
	bin := filepath.Join(dir, "gofakes3")
	if _, err := os.Stat(bin); err != nil {
		install := exec.Command("go", "install", "github.com/johannesboyne/gofakes3/cmd/gofakes3@v1.2.0")
		install.Env = append(os.Environ(), "GOBIN="+dir)
		install.Stderr = os.Stderr
		check(install.Run())
	}
	cmd := exec.Command(bin, "-host", "127.0.0.1:0", "-backend", "bolt", "-bolt.db", filepath.Join(work, "s3.db"),
		"-initialbucket", "atoll-bench", "-quiet")
	stderr, err := cmd.StderrPipe()
	check(err)
	check(cmd.Start())
	port := regexp.MustCompile(`using port: (\d+)$`)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := port.FindStringSubmatch(sc.Text()); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return "s3://atoll-bench?endpoint=http://127.0.0.1:" + m[1] + "&region=us-east-1&use_path_style=true&disable_https=true",
				func() { cmd.Process.Kill(); cmd.Wait() }
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	fatal("cluster: gofakes3 did not say its port")
	return "", nil
}

// harnessRun is a netcluster made outside a test: its testing.TB is tb.
type harnessRun struct {
	c  *netcluster.Cluster
	tb *benchTB
}

func (h *harnessRun) close() { h.tb.close() }

// harness runs start with a testing.TB of the benchmark's; a failure is
// reported as name's, not measured, and everything made is undone.
func harness(r *report, name string, start func(t testing.TB) *netcluster.Cluster) (h *harnessRun) {
	tb := &benchTB{dir: workDir}
	defer func() {
		if p := recover(); p != nil {
			if f, ok := p.(benchFailure); ok {
				tb.close()
				r.failed(name, string(f))
				h = nil
				return
			}
			panic(p)
		}
	}()
	return &harnessRun{c: start(tb), tb: tb}
}

// benchTB is the part of testing.TB that netcluster uses, for the
// benchmark: cleanups run at close, a fatal error panics (harness recovers
// it), logs go to stderr.
type benchTB struct {
	testing.TB // nil: netcluster calls only the methods below
	dir        string
	mu         sync.Mutex
	cleanups   []func()
	failed     bool
}

type benchFailure string

func (b *benchTB) Helper() {}
func (b *benchTB) Cleanup(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, f)
}
func (b *benchTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
func (b *benchTB) Errorf(format string, args ...any) {
	b.mu.Lock()
	b.failed = true
	b.mu.Unlock()
	b.Logf(format, args...)
}
func (b *benchTB) Fatalf(format string, args ...any) {
	panic(benchFailure(fmt.Sprintf(format, args...)))
}
func (b *benchTB) Fatal(args ...any) { panic(benchFailure(fmt.Sprint(args...))) }
func (b *benchTB) Skip(args ...any)  { panic(benchFailure(fmt.Sprint(args...))) }
func (b *benchTB) Failed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed
}
func (b *benchTB) TempDir() string {
	d, err := os.MkdirTemp(b.dir, "cluster-")
	check(err)
	return d
}

// close runs the cleanups, last first, as testing does.
func (b *benchTB) close() {
	b.mu.Lock()
	cs := b.cleanups
	b.cleanups = nil
	b.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
