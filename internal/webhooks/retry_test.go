package webhooks

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// TestRetrySchedule: a receiver that always answers 500 is tried again
// after 10 s, then after twice the wait each time up to an hour, then
// hourly, each attempt signed at the clock's time, and never before it
// is due; the first attempt a day or more after the event gives up, and
// the deliveries list shows it failed, with its attempts and last
// status. The clock is the Service's (Config.Now), the store a real
// SQLite one.
func TestRetrySchedule(t *testing.T) {
	ctx := tenant.NewContext(context.Background(), "team-a")
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	t0 := time.Unix(1700000000, 0).UTC()
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); defer mu.Unlock(); now = t }

	type hit struct {
		attempt int
		id      string
		sigErr  error
	}
	var hits []hit
	var secret string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n, _ := strconv.Atoi(r.Header.Get("Atoll-Delivery-Attempt"))
		mu.Lock()
		hits = append(hits, hit{n, r.Header.Get(api.HeaderEventID), Verify(secret, r.Header.Get(api.HeaderSignature), body, now, time.Second)})
		mu.Unlock()
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer rcv.Close()

	s := New(Config{Store: st, AllowPrivate: true, Now: clock})
	w, err := s.Create(ctx, api.CreateWebhookRequest{URL: rcv.URL + "/hook"})
	if err != nil {
		t.Fatal(err)
	}
	secret = w.Secret
	if _, err := st.AddEvents(ctx, []store.Event{{ID: "ev1", At: t0, Type: api.LifecycleCreated, Tenant: "team-a", Sandbox: "sb1", State: api.StateRunning}}); err != nil {
		t.Fatal(err)
	}

	// The schedule, worked out apart from the code: waits of 10 s
	// doubling to at most an hour, until an attempt made a day or more
	// after the event.
	var wantWaits []time.Duration
	for at, wait := t0, 10*time.Second; at.Sub(t0) < 24*time.Hour; {
		wantWaits = append(wantWaits, wait)
		at = at.Add(wait)
		wait = min(2*wait, time.Hour)
	}
	if len(wantWaits) < 30 || wantWaits[0] != 10*time.Second || wantWaits[9] != time.Hour || wantWaits[8] != 2560*time.Second {
		t.Fatalf("schedule worked out wrong: %v", wantWaits)
	}

	at := t0
	for i := 0; ; i++ {
		if i > 0 {
			// Not due a second before its time.
			set(at.Add(-time.Second))
			if n := s.sendDue(ctx); n != 0 {
				t.Fatalf("attempt %d: %d deliveries claimed a second before due", i+1, n)
			}
		}
		set(at)
		if n := s.sendDue(ctx); n != 1 {
			t.Fatalf("attempt %d at +%s: %d deliveries claimed, want 1", i+1, at.Sub(t0), n)
		}
		ds, err := s.Deliveries(ctx, w.ID, 0)
		if err != nil || len(ds) != 1 {
			t.Fatalf("deliveries: %+v, %v", ds, err)
		}
		d := ds[0]
		if d.Attempts != i+1 || d.LastStatus != http.StatusInternalServerError || d.LastError == "" {
			t.Fatalf("attempt %d: %+v", i+1, d)
		}
		if i == len(wantWaits) {
			// A day has passed: given up.
			if d.State != store.DeliveryFailed || d.NextAt != nil || d.DoneAt == nil || !d.DoneAt.Equal(at) || at.Sub(t0) < 24*time.Hour {
				t.Fatalf("attempt %d at +%s: %+v, want failed at that time", i+1, at.Sub(t0), d)
			}
			break
		}
		if d.State != store.DeliveryPending || d.NextAt == nil || d.DoneAt != nil {
			t.Fatalf("attempt %d at +%s: %+v, want pending", i+1, at.Sub(t0), d)
		}
		if got := d.NextAt.Sub(at); got != wantWaits[i] {
			t.Fatalf("attempt %d at +%s: next in %s, want %s", i+1, at.Sub(t0), got, wantWaits[i])
		}
		at = *d.NextAt
	}
	// Given up: never tried again.
	set(at.Add(48 * time.Hour))
	if n := s.sendDue(ctx); n != 0 {
		t.Fatalf("a failed delivery was claimed again")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hits) != len(wantWaits)+1 {
		t.Fatalf("receiver saw %d attempts, want %d", len(hits), len(wantWaits)+1)
	}
	for i, h := range hits {
		if h.attempt != i+1 || h.id != "ev1" || h.sigErr != nil {
			t.Errorf("request %d: %+v", i+1, h)
		}
	}
	t.Logf("%d attempts over %s", len(hits), at.Sub(t0))
}
