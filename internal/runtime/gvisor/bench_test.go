package gvisor_test

import (
	"context"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
)

// The benchmarks report medians and p99 (p50-ms, p99-ms) beside Go's mean:
// start and stop times under ptrace have long tails. The API-level figures come from bench/.

var benchLimits = runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}

// BenchmarkStartExecStop measures the runtime alone, per phase: start to
// agent ready, one exec of true, stop.
func BenchmarkStartExecStop(b *testing.B) {
	rt, env := newRuntime(b)
	var start, exec, stop []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		sb := runtimetest.Start(b, rt, env, benchLimits, 1<<30)
		t1 := time.Now()
		if _, err := sb.Client.Exec(context.Background(), api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
			b.Fatal(err)
		}
		start, exec, stop = append(start, t1.Sub(t0)), append(exec, t2.Sub(t1)), append(stop, time.Since(t2))
	}
	report(b, "start-", start)
	report(b, "first-exec-", exec)
	report(b, "stop-", stop)
}

// BenchmarkExec measures an exec of true through the agent socket alone.
func BenchmarkExec(b *testing.B) {
	rt, env := newRuntime(b)
	sb := runtimetest.Start(b, rt, env, benchLimits, 1<<30)
	var d []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := sb.Client.Exec(context.Background(), api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	report(b, "", d)
}

// BenchmarkRunscTrue is the peer: `runsc run` of true over the same kind of
// root (the host template's overlay and binds), with the same flags, until
// it has exited and runsc has cleaned up after it; no agent, no limits.
func BenchmarkRunscTrue(b *testing.B) {
	rt, env := newRuntime(b)
	_ = rt
	dir := b.TempDir()
	tmpl, err := env.Layers.Template(layers.HostTemplate)
	if err != nil {
		b.Fatal(err)
	}
	w, err := env.Layers.CreateWritable("peer", 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.Layers.RemoveWritable("peer") })
	rootfs := filepath.Join(dir, "rootfs")
	os.Mkdir(rootfs, 0o700)
	opts := "lowerdir=" + tmpl.Layers[0] + ",upperdir=" + w + "/upper,workdir=" + w + "/work,userxattr"
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"/usr/bin/true"}, Env: []string{"PATH=/usr/bin"}, Cwd: "/"},
		Root:    &specs.Root{Path: rootfs},
		Linux:   &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.MountNamespace}}},
	}
	for _, bd := range tmpl.Binds {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: bd.Target, Type: "bind", Source: bd.Source, Options: []string{"rbind", "ro"}})
	}
	cfg, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		b.Fatal(err)
	}
	flags := []string{"--root", filepath.Join(dir, "state"), "--network=none", "--platform=" + rt.Platform(), "--overlay2=none"}
	var d []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		out, err := osexec.Command("runsc", append(flags, "run", "--bundle", dir, "peer")...).CombinedOutput()
		if err != nil {
			b.Fatalf("runsc run: %v: %s", err, out)
		}
		d = append(d, time.Since(t0))
	}
	report(b, "", d)
}

// report reports the median and p99 of d in milliseconds.
func report(b *testing.B, prefix string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000 }
	b.ReportMetric(ms(0.5), prefix+"p50-ms")
	b.ReportMetric(ms(0.99), prefix+"p99-ms")
}
