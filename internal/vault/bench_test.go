package vault_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// BenchmarkPush measures the push of a 1-file commit with the stock git
// client, from its start to its exit (acknowledged, hence durable: the
// pack in the blob directory, fsynced, and the refs committed to SQLite),
// and reports the p50 and p99. Each iteration also pushes the same commit
// to a bare repository on the same disk over file:// (no HTTP, no hook,
// no object store, no database): the floor, measured under the same load
// of the machine at the same moments.
//
//	go test -run - -bench Push -benchtime 200x ./internal/vault
func BenchmarkPush(b *testing.B) {
	e := newEnv(b)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	floor := filepath.Join(b.TempDir(), "floor.git")
	mustGit(b, a, "init", "-q", "--bare", floor)
	var took, floorTook []time.Duration
	push := func(remote string) time.Duration {
		start := time.Now()
		if out, err := git(b, a, "push", "-q", remote, "HEAD:main"); err != nil {
			b.Fatalf("push to %s: %v\n%s", remote, err, out)
		}
		return time.Since(start)
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		commitFile(b, a, fmt.Sprintf("timeline/%04d.md", i), fmt.Sprintf("# entry %d\n", i))
		floorTook = append(floorTook, push(floor))
		b.StartTimer()
		took = append(took, push("origin"))
	}
	b.StopTimer()
	for _, d := range []struct {
		name string
		took []time.Duration
	}{{"", took}, {"floor-", floorTook}} {
		slices.Sort(d.took)
		b.ReportMetric(float64(d.took[len(d.took)/2].Microseconds())/1000, d.name+"p50-ms")
		b.ReportMetric(float64(d.took[len(d.took)*99/100].Microseconds())/1000, d.name+"p99-ms")
	}
}
