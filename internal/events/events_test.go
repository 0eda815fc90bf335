package events

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// TestAcrossBuses: two buses on one store, as two nodes of a cluster on
// their PostgreSQL: a stream of one sends, in order, the events the other
// records (found by its poll, as nothing wakes it), only its tenant's to
// a tenant, and a stream resumed after an event sends what followed.
func TestAcrossBuses(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := New(Config{Journal: st, Logger: quiet, Poll: 50 * time.Millisecond})
	defer a.Close()
	b := New(Config{Journal: st, Logger: quiet, Poll: 50 * time.Millisecond})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	all, err := b.Subscribe(ctx, -1) // the server's own: every tenant's
	if err != nil {
		t.Fatal(err)
	}
	mine, err := b.Subscribe(tenant.NewContext(ctx, "team-a"), -1)
	if err != nil {
		t.Fatal(err)
	}
	types := []string{api.LifecycleCreated, api.LifecycleStarted, api.LifecycleStopped, api.LifecycleDeleted}
	for i, typ := range types {
		a.Publish(store.Event{Type: typ, Tenant: "team-a", Sandbox: "sb1"})
		a.Publish(store.Event{Type: typ, Tenant: "team-b", Sandbox: "sb2", Reason: string(rune('0' + i))})
	}
	next := func(ch <-chan api.Event) api.Event {
		t.Helper()
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatal("stream ended")
			}
			return e
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return api.Event{}
	}
	var last int64
	for range 2 * len(types) {
		e := next(all)
		if e.Seq <= last || e.ID == "" || e.Time.IsZero() {
			t.Errorf("event %+v after seq %d", e, last)
		}
		last = e.Seq
	}
	var firstSeq int64
	for i, typ := range types {
		e := next(mine)
		if e.Tenant != "team-a" || e.Type != typ || e.Sandbox != "sb1" {
			t.Errorf("team-a's event %d: %+v, want %s of sb1", i, e, typ)
		}
		if i == 0 {
			firstSeq = e.Seq
		}
	}
	// Resumed after team-a's first event: its other three.
	resumed, err := a.Subscribe(tenant.NewContext(ctx, "team-a"), firstSeq)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range types[1:] {
		if e := next(resumed); e.Type != typ || e.Tenant != "team-a" {
			t.Errorf("resumed stream: %+v, want %s", e, typ)
		}
	}
}

// TestWrittenOnlyWhenQueued: the webhooks' sender is woken for a batch
// that queued a delivery, and not for one no webhook wants; the store
// counts each event's deliveries.
func TestWrittenOnlyWhenQueued(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.AddWebhook(ctx, store.Webhook{ID: "wh1", Tenant: "team-a", URL: "http://127.0.0.1:1/",
		Events: []string{api.LifecycleDeleted}, Secret: "s", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	evs, err := st.AddEvents(ctx, []store.Event{
		{ID: NewID(), At: time.Now(), Type: api.LifecycleCreated, Tenant: "team-a", Sandbox: "sb1", Queued: 7},
		{ID: NewID(), At: time.Now(), Type: api.LifecycleDeleted, Tenant: "team-a", Sandbox: "sb1"},
		{ID: NewID(), At: time.Now(), Type: api.LifecycleDeleted, Tenant: "team-b", Sandbox: "sb2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].Queued != 0 || evs[1].Queued != 1 || evs[2].Queued != 0 {
		t.Errorf("queued %d, %d, %d deliveries; want 0, 1, 0", evs[0].Queued, evs[1].Queued, evs[2].Queued)
	}

	written := make(chan struct{}, 16)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := New(Config{Journal: st, Logger: quiet, Written: func() { written <- struct{}{} }})
	defer b.Close()
	sub, err := b.Subscribe(ctx, -1) // from now on
	if err != nil {
		t.Fatal(err)
	}
	await := func() {
		t.Helper()
		select {
		case <-sub:
		case <-time.After(10 * time.Second):
			t.Fatal("the event was not recorded")
		}
	}
	b.Publish(store.Event{Type: api.LifecycleCreated, Tenant: "team-a", Sandbox: "sb3"})
	await()
	b.Publish(store.Event{Type: api.LifecycleDeleted, Tenant: "team-a", Sandbox: "sb3"})
	await()
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the sender was not woken for an event a webhook wants")
	}
	// Told in order: a wake for the first event would be queued already.
	select {
	case <-written:
		t.Error("the sender was woken for an event no webhook wants")
	default:
	}
}
