package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// runtimes measures every runtime the server offers through the API, in
// one run (issue #7): create → ready, exec round trip, pause and resume in
// memory, pause to disk and back where the runtime saves memory, fork,
// delete, and host memory per idle sandbox; beside runsc alone as a peer.
// The server is cold (no warm pool, no prestarted processes), so every
// runtime starts its sandboxes the same way.
func runtimes(r *report, work string, n int) {
	srv := startServer(work, "runtimes", 0, 0)
	defer srv.stop()
	c := srv.client()
	ctx := context.Background()
	rts, err := c.Runtimes(ctx)
	check(err)
	for _, rt := range rts {
		if !rt.Available {
			r.note(fmt.Sprintf("runtime %s not offered: %s", rt.Name, rt.Reason))
			continue
		}
		runtimeFigures(r, c, rt, n)
	}
	peerRunsc(r, n)
	for _, rt := range rts {
		if rt.Name == "vm" && rt.Available {
			peerQEMU(r)
		}
	}
}

// peerQEMU is QEMU alone booting the vm runtime's kernel the same way, to
// its init's exit: the vm package's benchmark of it, run here so that it
// shares this run's machine and load.
func peerQEMU(r *report) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "QEMUBootToInitExit", "-benchtime", "5x", "./internal/runtime/vm/")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if os.Getenv("ATOLL_TEST_VM_CACHE") == "" {
		cmd.Env = append(cmd.Env, "ATOLL_TEST_VM_CACHE=/var/cache/atoll-test/vm")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.note(fmt.Sprintf("peer QEMU alone: %v: %s", err, lastLines(out, 3)))
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "BenchmarkQEMUBootToInitExit") {
			continue
		}
		var p50, p99 float64
		for i := 2; i+1 < len(f); i += 2 {
			v, _ := strconv.ParseFloat(f[i], 64)
			switch f[i+1] {
			case "p50-ms":
				p50 = v
			case "p99-ms":
				p99 = v
			}
		}
		r.rows = append(r.rows, row{name: "peer: QEMU alone, the vm runtime's kernel and machine, boot to init exit", mode: "sequential",
			p50: time.Duration(p50 * float64(time.Millisecond)), p99: time.Duration(p99 * float64(time.Millisecond)), n: 5})
		return
	}
	r.note("peer QEMU alone: no figures in: " + lastLines(out, 3))
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " / ")
}

func runtimeFigures(r *report, c *atoll.Client, rt api.Runtime, n int) {
	ctx := context.Background()
	name := rt.Name
	req := api.CreateSandboxRequest{Runtime: name, MemoryMiB: 512}
	// Warm up: the first sandbox of a runtime builds what it caches.
	sb, err := c.CreateSandbox(ctx, req)
	check(err)
	check(c.DeleteSandbox(ctx, sb.ID))
	slow := name != "ns" // gvisor and vm start in seconds here, not ms
	count := n
	if slow {
		count = min(n, 10)
	}
	var create, del []time.Duration
	for i := 0; i < count; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		check(err)
		create = append(create, time.Since(t0))
		t0 = time.Now()
		check(c.DeleteSandbox(ctx, sb.ID))
		del = append(del, time.Since(t0))
	}
	r.add(name+": create → ready (API), cold", "sequential", create)
	r.add(name+": delete (API)", "sequential", del)

	sb, err = c.CreateSandbox(ctx, req)
	check(err)
	defer c.DeleteSandbox(ctx, sb.ID)
	sandboxOpFigures(r, c, rt, sb, count)
	idleMemoryFigure(r, c, req)
}

// sandboxOpFigures times what can be done to the running sandbox sb, count
// times each (fewer for the slow ones): exec, pause and resume in memory
// and to disk, and forks, as rt's capabilities allow.
func sandboxOpFigures(r *report, c *atoll.Client, rt api.Runtime, sb api.Sandbox, count int) {
	ctx := context.Background()
	name := rt.Name
	r.add(name+": exec `true` round trip (API)", "sequential", execTrues(ctx, c, sb.ID, count*3))

	resumeSb := func() { ok(c.ResumeSandbox(ctx, sb.ID)) }
	if rt.Capabilities.Pause {
		pause, resume := pairs(count, func() { ok(c.PauseSandbox(ctx, sb.ID)) }, resumeSb)
		r.add(name+": pause, in memory (API)", "sequential", pause)
		r.add(name+": resume, in memory (API)", "sequential", resume)
	}
	if rt.Capabilities.MemorySnapshot {
		suspend, restore := pairs(min(count, 5), func() { ok(c.SuspendSandbox(ctx, sb.ID)) }, resumeSb)
		r.add(name+": pause to disk (API)", "sequential", suspend)
		r.add(name+": resume from disk (API)", "sequential", restore)
	}
	var forks []time.Duration
	for i := 0; i < min(count, 5); i++ {
		t0 := time.Now()
		kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 1})
		check(err)
		forks = append(forks, time.Since(t0))
		for _, k := range kids {
			check(c.DeleteSandbox(ctx, k.ID))
		}
	}
	r.add(name+": fork into 1 (API)", "sequential", forks)
	if rt.Capabilities.MemoryFork {
		var mforks []time.Duration
		for i := 0; i < min(count, 5); i++ {
			t0 := time.Now()
			kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 1, Memory: true})
			check(err)
			mforks = append(mforks, time.Since(t0))
			for _, k := range kids {
				check(c.DeleteSandbox(ctx, k.ID))
			}
		}
		r.add(name+": fork into 1 with memory (API)", "sequential", mforks)
	}
}

// idleMemoryFigure notes the host memory an idle sandbox takes:
// MemAvailable before and after starting k of them, settled.
func idleMemoryFigure(r *report, c *atoll.Client, req api.CreateSandboxRequest) {
	ctx := context.Background()
	name := req.Runtime
	const k = 4
	time.Sleep(2 * time.Second)
	before := memAvailable()
	var ids []string
	for i := 0; i < k; i++ {
		sb, err := c.CreateSandbox(ctx, req)
		check(err)
		ids = append(ids, sb.ID)
	}
	time.Sleep(3 * time.Second)
	after := memAvailable()
	for _, id := range ids {
		check(c.DeleteSandbox(ctx, id))
	}
	r.note(fmt.Sprintf("%s: host memory per idle sandbox (MemAvailable, %d sandboxes): %.1f MiB", name, k, float64(before-after)/k/(1<<20)))
}

// peerRunsc times `runsc do true` on the platform the server chose, from
// start to exit: gVisor with nothing of atoll.
func peerRunsc(r *report, n int) {
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		r.note("peer runsc: not installed")
		return
	}
	platform := "ptrace"
	if b, err := os.ReadFile("/run/atoll/gvisor-platform"); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		platform = lines[len(lines)-1]
	}
	root, err := os.MkdirTemp("", "atoll-bench-runsc-")
	check(err)
	defer os.RemoveAll(root)
	var ds []time.Duration
	for i := 0; i < min(n, 10); i++ {
		t0 := time.Now()
		cmd := exec.Command(runsc, "--root", root, "--network=none", "--platform="+platform, "do", "true")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			r.note(fmt.Sprintf("peer runsc do true: %v: %s", err, out))
			return
		}
		ds = append(ds, time.Since(t0))
	}
	r.add("peer: `runsc do true` ("+platform+"), to exit", "sequential", ds)
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	check(err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			check(err)
			return kb << 10
		}
	}
	fatal("no MemAvailable in /proc/meminfo")
	return 0
}
