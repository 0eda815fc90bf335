package vault_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// BenchmarkSearch measures Search over a vault of 10,000 notes (about 150
// words each, from a vocabulary of 5,000, with frontmatter and links), the
// whole call: the vault's lookup, its head read from the store, the FTS5
// query of the index, 20 hits with snippets. It reports the p50 and p99,
// the time from the push's end to the first answer (the index of 10,000
// notes built), and the same after a push of one note more (the index
// updated).
//
//	go test -run - -bench Search -benchtime 2000x ./internal/vault
func BenchmarkSearch(b *testing.B) {
	const notes = 10_000
	e := newEnv(b)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	rng := rand.New(rand.NewPCG(1, 2))
	vocab := make([]string, 5000)
	for i := range vocab {
		vocab[i] = fmt.Sprintf("w%x%s", i, strings.Repeat("a", i%5))
	}
	word := func() string { return vocab[int(rng.ExpFloat64()*800)%len(vocab)] } // a few words common, most rare
	for i := range notes {
		var sb strings.Builder
		fmt.Fprintf(&sb, "---\ntitle: Note %d %s\ntype: entity\ntags: [%s, %s]\n---\n", i, word(), word(), word())
		for j := range 150 {
			sb.WriteString(word())
			if j%15 == 14 {
				fmt.Fprintf(&sb, " [[Note %d]]\n", rng.IntN(notes))
			} else {
				sb.WriteByte(' ')
			}
		}
		p := filepath.Join(dir, "entities", fmt.Sprintf("%02d", i%100), fmt.Sprintf("n%05d.md", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	mustGit(b, dir, "add", "-A")
	mustGit(b, dir, "commit", "-q", "-m", "10k notes")
	mustGit(b, dir, "push", "-q", "origin", "HEAD:main")
	start := time.Now()
	if _, err := e.svc.Search(ctx, "mem", vocab[0], 0); err != nil {
		b.Fatal(err)
	}
	built := time.Since(start)
	queries := []string{vocab[0], vocab[3] + " " + vocab[7], vocab[100], vocab[2000], `"` + vocab[1] + " " + vocab[2] + `"`, vocab[10] + " OR " + vocab[400], "w1*", "title:" + vocab[5]}
	for _, q := range queries {
		t0 := time.Now()
		res, _ := e.svc.Search(ctx, "mem", q, 0)
		b.Logf("%q: %d hits, %v (cold)", q, len(res.Hits), time.Since(t0))
	}
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if _, err := e.svc.Search(ctx, "mem", queries[i%len(queries)], 0); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	// A push of one note more: its index is the last one's, changed.
	commitFile(b, dir, "entities/new.md", "a fresh note about quokkas\n")
	mustGit(b, dir, "push", "-q")
	start = time.Now()
	if res, err := e.svc.Search(ctx, "mem", "quokkas", 0); err != nil || len(res.Hits) != 1 {
		b.Fatalf("the new note: %+v, %v", res, err)
	}
	updated := time.Since(start)
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(built.Milliseconds()), "index-build-ms")
	b.ReportMetric(float64(updated.Milliseconds()), "index-update-ms")
}
