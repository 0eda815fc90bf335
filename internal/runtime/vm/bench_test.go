package vm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
)

// The benchmarks report medians and p99 (p50-ms, p99-ms) beside Go's mean.
// Under TCG (here) every figure is the CPU emulator's as much as the
// runtime's; the peer, QEMU alone booting the same kernel, says how much.

// BenchmarkStartExecStop measures the runtime alone, per phase: start to
// agent ready, one exec of true, stop (which copies the disk back).
func BenchmarkStartExecStop(b *testing.B) { runtimetest.BenchStartExecStop(b, newRuntime) }

// BenchmarkExec measures an exec of true through the channel alone.
func BenchmarkExec(b *testing.B) { runtimetest.BenchExec(b, newRuntime) }

// BenchmarkPauseResume measures a pause and a resume, and the agent
// answering after it.
func BenchmarkPauseResume(b *testing.B) {
	rt, env := newRuntime(b)
	ctx := context.Background()
	sb := runtimetest.Start(b, rt, env, runtimetest.BenchLimits, 1<<30)
	var pause, resume []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := rt.Pause(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := rt.Resume(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Client.Health(ctx); err != nil {
			b.Fatal(err)
		}
		pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	runtimetest.Report(b, "pause-", pause)
	runtimetest.Report(b, "resume-", resume)
}

// BenchmarkCheckpointRestore measures a checkpoint to disk of a sandbox
// with a process running and a restore until its agent answers.
func BenchmarkCheckpointRestore(b *testing.B) {
	rt, env := newRuntime(b)
	ctx := context.Background()
	sb := runtimetest.Start(b, rt, env, runtimetest.BenchLimits, 1<<30)
	sb.MustSh(b, `nohup sleep 100000 >/dev/null 2>&1 &`)
	var cp, rs []time.Duration
	var size int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		img := filepath.Join(b.TempDir(), "image")
		t0 := time.Now()
		if err := rt.Checkpoint(ctx, sb.ID, sb.Inst, img); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		inst, err := rt.Restore(ctx, sb.Spec, img)
		if err != nil {
			b.Fatal(err)
		}
		sb.Inst, sb.Client = inst, runtimetest.Client(inst)
		if _, err := sb.Client.Health(ctx); err != nil {
			b.Fatal(err)
		}
		cp, rs = append(cp, t1.Sub(t0)), append(rs, time.Since(t1))
		if fi, err := os.Stat(filepath.Join(img, "memory")); err == nil {
			size = fi.Size()
		}
	}
	runtimetest.Report(b, "checkpoint-", cp)
	runtimetest.Report(b, "restore-", rs)
	b.ReportMetric(float64(size)/(1<<20), "image-MiB")
}

// BenchmarkIdleMemory reports the host memory an idle sandbox holds: the
// proportional set size of its QEMU and proxy, some seconds after boot.
func BenchmarkIdleMemory(b *testing.B) {
	rt, env := newRuntime(b)
	var pss []float64
	for i := 0; i < b.N; i++ {
		sb := runtimetest.Start(b, rt, env, runtimetest.BenchLimits, 1<<30)
		time.Sleep(3 * time.Second)
		var kb int64
		for _, pid := range processes(sb.ID) {
			kb += pssKB(pid)
		}
		pss = append(pss, float64(kb)/1024)
		if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
			b.Fatal(err)
		}
	}
	sort.Float64s(pss)
	b.ReportMetric(pss[len(pss)/2], "idle-pss-MiB")
}

func pssKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkQEMUBootToInitExit is the peer: QEMU alone booting the same
// kernel the same way (microvm, PVH, the same accelerator and command line)
// with an initramfs whose init (the agent binary, given nothing to serve)
// exits at once, until QEMU has exited: the floor under the runtime's
// start.
func BenchmarkQEMUBootToInitExit(b *testing.B) {
	rt, env := newRuntime(b)
	kernel, accel := rt.BootKernel(), rt.Accel()
	dir := b.TempDir()
	initrd := filepath.Join(dir, "initrd")
	if err := rt.WriteTrivialInitrd(initrd, env.AgentPath); err != nil {
		b.Fatal(err)
	}
	args := rt.PeerArgs(kernel, initrd, accel)
	var d []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		out, err := osexec.Command("qemu-system-x86_64", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("qemu: %v: %s", err, out)
		}
		if !bytes.Contains(out, []byte("Attempted to kill init")) {
			b.Fatalf("the guest did not reach its init: %s", out)
		}
		d = append(d, time.Since(t0))
	}
	runtimetest.Report(b, "", d)
}
