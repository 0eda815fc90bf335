package control

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/events"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// eventNode is a single machine's Service (real ns sandboxes) publishing
// to a real events.Bus over its SQLite store, and a stream of every
// event recorded from now on.
func eventNode(t *testing.T) (*clusterNode, store.Store, <-chan api.Event) {
	t.Helper()
	testenv.RequireRoot(t)
	st, err := sqlite.Open(filepath.Join(testenv.Dir(t), "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	bus := events.New(events.Config{Journal: st, Poll: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(bus.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := bus.Subscribe(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	return newClusterNode(t, "", st, Config{Events: bus}), st, stream
}

// nextEvents reads n events from stream, failing after 10 s without one.
func nextEvents(t *testing.T, stream <-chan api.Event, n int) []api.Event {
	t.Helper()
	var got []api.Event
	for len(got) < n {
		select {
		case e, ok := <-stream:
			if !ok {
				t.Fatalf("the stream ended after %+v", got)
			}
			got = append(got, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("after %+v: no event for 10 s", got)
		}
	}
	return got
}

func typesOf(evs []api.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+"/"+e.State)
	}
	return out
}

// TestEventsOfPausesAndUpdates: a sandbox paused without its memory
// (shelved) is paused and its boot back a resume, as a frozen one's are;
// writes that leave the state as it was (a timeout set, a paused
// sandbox's timeout) announce nothing. A marker event after them shows
// that nothing came in between.
func TestEventsOfPausesAndUpdates(t *testing.T) {
	ctx := context.Background()
	n, _, stream := eventNode(t)
	sb, err := n.Create(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { _, err := n.SetTimeout(ctx, sb.ID, api.TimeoutRequest{TimeoutSec: 600}); return err },
		func() error { _, err := n.Pause(ctx, sb.ID); return err },
		func() error { _, err := n.SetTimeout(ctx, sb.ID, api.TimeoutRequest{TimeoutSec: 900}); return err },
		func() error { _, err := n.Resume(ctx, sb.ID); return err },
		func() error { _, err := n.Shelve(ctx, sb.ID); return err },
		func() error { _, err := n.Resume(ctx, sb.ID); return err },
		func() error { _, err := n.Stop(ctx, sb.ID); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	n.events.Publish(store.Event{Type: api.LifecycleQuotaExceeded, Tenant: "marker"})
	want := []string{"created/creating", "started/running", "paused/paused", "resumed/running",
		"paused/shelved", "resumed/running", "stopped/stopped", "quota_exceeded/"}
	got := nextEvents(t, stream, len(want))
	if !slices.Equal(typesOf(got), want) {
		t.Errorf("events:\n got %v\nwant %v", typesOf(got), want)
	}
	for _, e := range got[:len(got)-1] {
		if e.Sandbox != sb.ID {
			t.Errorf("event %+v is not of %s", e, sb.ID)
		}
	}
}

// TestErrorEvent: recovery records a sandbox whose runtime the server no
// longer has (gvisor, runsc gone) as error, and that is an error event
// with the reason; one already in error, recovered again (the server
// restarted once more), is not announced a second time.
func TestErrorEvent(t *testing.T) {
	ctx := context.Background()
	n, st, stream := eventNode(t)
	sb := insert(t, st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateRunning, Runtime: "gvisor"}, Tenant: "team-a"})
	for range 2 {
		if err := n.Recover(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := st.Get(ctx, sb.ID); err != nil || got.State != api.StateError {
		t.Fatalf("after recovery: %+v, %v; want error", got, err)
	}
	n.events.Publish(store.Event{Type: api.LifecycleQuotaExceeded, Tenant: "marker"})
	got := nextEvents(t, stream, 2)
	if e := got[0]; e.Type != api.LifecycleError || e.Sandbox != sb.ID || e.State != api.StateError || e.Tenant != "team-a" ||
		e.Reason != "runtime gvisor is not available" {
		t.Errorf("event %+v, want sandbox %s's error with its reason", e, sb.ID)
	}
	if got[1].Tenant != "marker" {
		t.Errorf("a second event before the marker: %+v", got[1])
	}
}
