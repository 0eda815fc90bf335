package network

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/egress"
)

// reportPercentiles reports the median and 99th percentile in ms of each
// named series of durations.
func reportPercentiles(b *testing.B, series map[string][]time.Duration) {
	for name, ds := range series {
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(ds[len(ds)/2]), name+"-p50-ms")
		b.ReportMetric(ms(ds[(len(ds)*99)/100]), name+"-p99-ms")
	}
}

// BenchmarkAttach measures giving a sandbox its network without a pool: a
// new namespace, veth, addresses, routes and firewall elements; and
// Release, which takes them all away again.
func BenchmarkAttach(b *testing.B) {
	tp := newTopology(b, Config{Logger: discard()})
	ctx := context.Background()
	var attach, release []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := tp.m.Attach(ctx, i%1000, egress.Policy{}); err != nil {
			b.Fatal(err)
		}
		attach = append(attach, time.Since(start))
		start = time.Now()
		if err := tp.m.Release(ctx, i%1000); err != nil {
			b.Fatal(err)
		}
		release = append(release, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, map[string][]time.Duration{"attach": attach, "release": release})
}

// BenchmarkPoolGet measures Pool.Get with a warm entry ready: what sandbox
// create pays for networking when the pool keeps up. It also reports what
// making one warm entry (the pool's background work) costs.
func BenchmarkPoolGet(b *testing.B) {
	tp := newTopology(b, Config{Logger: discard()})
	ctx := context.Background()
	pool := NewPool(tp.m, 1)
	var get, warm []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		start := time.Now()
		e, err := tp.m.warmEntry()
		if err != nil {
			b.Fatal(err)
		}
		warm = append(warm, time.Since(start))
		pool.mu.Lock()
		pool.warm = append(pool.warm, e)
		pool.mu.Unlock()
		b.StartTimer()
		start = time.Now()
		if _, err := pool.Get(ctx, i%1000, egress.Policy{}); err != nil {
			b.Fatal(err)
		}
		get = append(get, time.Since(start))
		b.StopTimer()
		if err := tp.m.Release(ctx, i%1000); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, map[string][]time.Duration{"get": get, "warm": warm})
}

// BenchmarkSetPolicy measures setting an attached slot's policy again, as
// a create that takes a prestarted process (whose network is attached)
// does: the firewall elements refilled and the connections the policy
// forbids cut.
func BenchmarkSetPolicy(b *testing.B) {
	tp := newTopology(b, Config{Logger: discard()})
	ctx := context.Background()
	if _, err := tp.m.Attach(ctx, 1, egress.Policy{}); err != nil {
		b.Fatal(err)
	}
	var same []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := tp.m.SetPolicy(ctx, 1, egress.Policy{}); err != nil {
			b.Fatal(err)
		}
		same = append(same, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, map[string][]time.Duration{"set": same})
}
