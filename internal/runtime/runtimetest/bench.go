package runtimetest

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// The benchmarks every runtime runs (its bench_test.go calls them) report
// medians and p99 (p50-ms, p99-ms) beside Go's mean: start and stop times
// have long tails. The API-level figures come from bench/.

// BenchLimits are the limits of a benchmark's sandboxes.
var BenchLimits = runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}

// BenchStartExecStop measures the runtime newRuntime makes alone, per phase: start to agent ready,
// one exec of true, stop.
func BenchStartExecStop[R runtime.Runtime](b *testing.B, newRuntime func(testing.TB) (R, Env)) {
	rt, env := newRuntime(b)
	var start, exec, stop []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		sb := Start(b, rt, env, BenchLimits, 1<<30)
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
	Report(b, "start-", start)
	Report(b, "first-exec-", exec)
	Report(b, "stop-", stop)
}

// BenchExec measures, in a sandbox of the runtime newRuntime makes, an exec of true through the agent's channel alone.
func BenchExec[R runtime.Runtime](b *testing.B, newRuntime func(testing.TB) (R, Env)) {
	rt, env := newRuntime(b)
	sb := Start(b, rt, env, BenchLimits, 1<<30)
	var d []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := sb.Client.Exec(context.Background(), api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	Report(b, "", d)
}

// Report reports the median and p99 of d in milliseconds, as
// prefix+"p50-ms" and prefix+"p99-ms".
func Report(b *testing.B, prefix string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000 }
	b.ReportMetric(ms(0.5), prefix+"p50-ms")
	b.ReportMetric(ms(0.99), prefix+"p99-ms")
}
