package control

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// TestRates checks the per-tenant token bucket of creates_per_second on a
// clock of the test's: a second's worth of creates at once, then one per
// 1/rate, each refusal a quota error of the rate with the wait until the
// next; a fork may take the bucket below zero, which later creates wait
// for; a changed rate is seen within rateTTL, or at once after forget.
func TestRates(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.SetQuota(ctx, "team-r", store.Quota{CreatesPerSecond: 2}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	r := newRates(st, nil)
	r.now = func() time.Time { return now }
	refused := func(what string, err error, wait time.Duration) {
		t.Helper()
		var qe *errdefs.QuotaError
		var b *errdefs.Busy
		if !errors.As(err, &qe) || !errors.As(err, &b) || !errors.Is(err, errdefs.ErrQuota) || qe.Quota != store.QuotaCreates || qe.Limit != 2 {
			t.Fatalf("%s: %v, want a busy quota error of creates_per_second 2", what, err)
		}
		if b.After != wait {
			t.Fatalf("%s: retry after %v, want %v", what, b.After, wait)
		}
	}
	for i := range 2 {
		if err := r.take(ctx, "team-r", 1); err != nil {
			t.Fatalf("create %d of the burst: %v", i, err)
		}
	}
	refused("third at once", r.take(ctx, "team-r", 1), 500*time.Millisecond)
	now = now.Add(250 * time.Millisecond)
	refused("a quarter second on", r.take(ctx, "team-r", 1), 250*time.Millisecond)
	now = now.Add(250 * time.Millisecond)
	if err := r.take(ctx, "team-r", 5); err != nil {
		t.Fatalf("a fork of 5 with one create left: %v", err)
	}
	refused("after the fork", r.take(ctx, "team-r", 1), 2500*time.Millisecond)
	// Other tenants have buckets of their own; no rate is no limit.
	for range 10 {
		if err := r.take(ctx, "team-s", 1); err != nil {
			t.Fatalf("a tenant without a rate: %v", err)
		}
	}

	// Lifted in the store: seen once rateTTL has passed since the read.
	if err := st.SetQuota(ctx, "team-r", store.Quota{}); err != nil {
		t.Fatal(err)
	}
	refused("before rateTTL", r.take(ctx, "team-r", 1), 2500*time.Millisecond)
	now = now.Add(rateTTL)
	if err := r.take(ctx, "team-r", 1); err != nil {
		t.Fatalf("after rateTTL: %v", err)
	}
	// Set here (forget): at once.
	if err := st.SetQuota(ctx, "team-r", store.Quota{CreatesPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	r.forget("team-r")
	if err := r.take(ctx, "team-r", 1); err != nil {
		t.Fatal(err)
	}
	if err := r.take(ctx, "team-r", 1); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a second create at 1/s: %v", err)
	}
}
