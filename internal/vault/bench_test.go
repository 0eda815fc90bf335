package vault_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// BenchmarkPush measures the push of a 1-file commit with the stock git
// client, from its start to its exit (acknowledged, hence durable: the
// pack in the blob directory, fsynced, and the refs committed to SQLite),
// and reports the p50 and p99.
//
//	go test -run - -bench Push -benchtime 200x ./internal/vault
func BenchmarkPush(b *testing.B) {
	e := newEnv(b)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		commitFile(b, a, fmt.Sprintf("timeline/%04d.md", i), fmt.Sprintf("# entry %d\n", i))
		b.StartTimer()
		start := time.Now()
		if out, err := git(b, a, "push", "-q", "origin", "HEAD:main"); err != nil {
			b.Fatalf("push: %v\n%s", err, out)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkPushLocal is the floor BenchmarkPush is read against: the same
// pushes to a bare repository on the same disk over file://, no HTTP, no
// hook, no object store.
func BenchmarkPushLocal(b *testing.B) {
	dir := b.TempDir()
	mustGit(b, dir, "init", "-q", "--bare", "r.git")
	mustGit(b, dir, "clone", "-q", "r.git", "c")
	a := dir + "/c"
	var took []time.Duration
	for i := range b.N {
		commitFile(b, a, fmt.Sprintf("timeline/%04d.md", i), fmt.Sprintf("# entry %d\n", i))
		start := time.Now()
		if out, err := git(b, a, "push", "-q", "origin", "HEAD:main"); err != nil {
			b.Fatalf("push: %v\n%s", err, out)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}
