package audit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// clock is a settable Config.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

var t0 = time.Unix(1700000000, 0).UTC()

// recorder returns a Recorder on a fresh SQLite store, pruning every
// few milliseconds by c, and a function that stops the sandbox named by
// its argument through it: an audited request.
func recorder(t *testing.T, c *clock, retention time.Duration) (*audit.Recorder, *sqlite.Store, func(id string)) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.New(audit.Config{Journal: st, Retention: retention, PruneInterval: 10 * time.Millisecond, Now: c.Now})
	t.Cleanup(func() { rec.Close(); st.Close() })
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/stop", func(http.ResponseWriter, *http.Request) {})
	h := rec.Wrap(mux)
	stop := func(id string) {
		t.Helper()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/sandboxes/"+id+"/stop", nil))
		// Written off the request's path: wait until it is listed.
		waitFor(t, func() bool { return slices.Contains(targets(t, rec), id) }, id+"'s entry written")
	}
	return rec, st, stop
}

func targets(t *testing.T, rec *audit.Recorder) []string {
	t.Helper()
	es, _, err := rec.List(context.Background(), api.AuditQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Target)
	}
	slices.Sort(out)
	return out
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// TestRetention: the pruning loop deletes the audit entries and events
// older than the retention (the default, 90 days) by the Recorder's
// clock, and keeps the recent ones; entries are stamped by that clock.
func TestRetention(t *testing.T) {
	ctx := context.Background()
	c := &clock{}
	rec, st, stop := recorder(t, c, 0)
	for _, e := range []struct {
		id  string
		age time.Duration
	}{{"old", 100 * 24 * time.Hour}, {"edge", 89 * 24 * time.Hour}, {"new", time.Hour}} {
		c.set(t0.Add(-e.age))
		stop(e.id)
		if _, err := st.AddEvents(ctx, []store.Event{{ID: "ev-" + e.id, At: t0.Add(-e.age), Type: api.LifecycleStopped, Sandbox: e.id}}); err != nil {
			t.Fatal(err)
		}
	}
	events := func() []string {
		evs, err := st.Events(ctx, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs {
			out = append(out, e.ID)
		}
		slices.Sort(out)
		return out
	}
	// Each was listed once written (stop); the clock now moves on to t0,
	// where old is past the retention.
	c.set(t0)
	waitFor(t, func() bool { return !slices.Contains(targets(t, rec), "old") }, "the old entry to be pruned")
	waitFor(t, func() bool { return !slices.Contains(events(), "ev-old") }, "the old event to be pruned")
	// Several more prunes keep what is recent.
	time.Sleep(100 * time.Millisecond)
	if got := targets(t, rec); !slices.Equal(got, []string{"edge", "new"}) {
		t.Errorf("entries after pruning: %v, want edge and new", got)
	}
	if got := events(); !slices.Equal(got, []string{"ev-edge", "ev-new"}) {
		t.Errorf("events after pruning: %v, want ev-edge and ev-new", got)
	}
	es, _, err := rec.List(ctx, api.AuditQuery{Sandbox: "new"})
	if err != nil || len(es) != 1 || !es[0].Time.Equal(t0.Add(-time.Hour)) || es[0].Action != "POST /v1/sandboxes/{id}/stop" {
		t.Errorf("the new entry: %+v, %v", es, err)
	}
}

// TestRetentionForever: a negative retention (atoll serve
// --audit-retention 0) prunes nothing, however old.
func TestRetentionForever(t *testing.T) {
	c := &clock{}
	rec, _, stop := recorder(t, c, -1)
	c.set(t0.Add(-10 * 365 * 24 * time.Hour))
	stop("ancient")
	c.set(t0)
	time.Sleep(100 * time.Millisecond) // ten prune intervals
	if got := targets(t, rec); !slices.Equal(got, []string{"ancient"}) {
		t.Errorf("entries: %v, want the ancient one kept", got)
	}
}
