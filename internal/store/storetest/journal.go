package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// testAudit: audit entries come back newest first, selected by every
// filter, and pruned by age.
func testAudit(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var all []store.AuditEntry
	for i := range 6 {
		e := store.AuditEntry{At: t0.Add(time.Duration(i) * time.Minute), Tenant: []string{"default", "acme"}[i%2], KeyID: "k" + fmt.Sprint(i%2),
			Source: "192.0.2.1", Action: []string{"POST /v1/sandboxes", "POST /v1/sandboxes/{id}/stop", "DELETE /v1/sandboxes/{id}"}[i%3],
			Target: []string{"", "sb1", "sb2"}[i%3], Status: 200 + i, RequestID: "r" + fmt.Sprint(i)}
		all = append(all, e)
	}
	if err := st.AddAudit(ctx, all[:4]); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAudit(ctx, all[4:]); err != nil {
		t.Fatal(err)
	}
	got, err := st.Audit(ctx, store.AuditFilter{})
	if err != nil || len(got) != 6 {
		t.Fatalf("Audit: %d entries, %v", len(got), err)
	}
	for i, e := range got {
		want := all[5-i]
		want.Seq = e.Seq
		if diff := cmp.Diff(want, e); diff != "" {
			t.Errorf("entry %d (-want +got):\n%s", i, diff)
		}
		if i > 0 && e.Seq >= got[i-1].Seq {
			t.Errorf("not newest first: seq %d after %d", e.Seq, got[i-1].Seq)
		}
	}
	for _, f := range []store.AuditFilter{
		{Tenant: "acme"}, {Target: "sb1"}, {Action: "DELETE /v1/sandboxes/{id}"}, {Action: "POST"}, {Action: "PO"}, {Action: "POST %"},
		{From: t0.Add(2 * time.Minute), To: t0.Add(4 * time.Minute)},
		{Tenant: "default", Action: "POST /v1/sandboxes"},
		{Before: got[1].Seq}, {Limit: 2}, {Tenant: "nobody"}, {Target: "x\x00'; DROP TABLE audit; --"},
	} {
		sel, err := st.Audit(ctx, f)
		if err != nil {
			t.Fatalf("Audit(%+v): %v", f, err)
		}
		var want []int64
		for _, e := range got {
			if f.Match(e) && (f.Limit == 0 || len(want) < f.Limit) {
				want = append(want, e.Seq)
			}
		}
		var have []int64
		for _, e := range sel {
			have = append(have, e.Seq)
		}
		if !cmp.Equal(want, have) {
			t.Errorf("Audit(%+v) = %v, want %v", f, have, want)
		}
	}
	if err := st.PruneJournal(ctx, t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Audit(ctx, store.AuditFilter{}); err != nil || len(got) != 3 {
		t.Errorf("after pruning the first three: %d entries, %v", len(got), err)
	}
}

// testEvents: events are numbered in order, read after a number, and
// owe a delivery to each webhook of their tenant that wants them.
func testEvents(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	hooks := []store.Webhook{
		{ID: "wh-all", Tenant: "acme", URL: "https://example.com/a", Secret: "s1", CreatedAt: t0},
		{ID: "wh-stop", Tenant: "acme", URL: "https://example.com/b", Events: []string{"stopped", "deleted"}, Secret: "s2", CreatedAt: t0.Add(time.Second)},
		{ID: "wh-other", Tenant: "other", URL: "http://example.org/", Secret: "s3", CreatedAt: t0},
	}
	for _, w := range hooks {
		if err := st.AddWebhook(ctx, w); err != nil {
			t.Fatalf("AddWebhook %s: %v", w.ID, err)
		}
	}
	if err := st.AddWebhook(ctx, hooks[0]); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second webhook of one ID: %v, want conflict", err)
	}
	for _, bad := range []store.Webhook{
		{ID: "b1", Tenant: "acme", URL: "ftp://example.com/", Secret: "s"},
		{ID: "b2", Tenant: "acme", URL: "/relative", Secret: "s"},
		{ID: "b3", Tenant: "acme", URL: "https://example.com/\x00", Secret: "s"},
		{ID: "b4", Tenant: "acme", URL: "https://example.com/", Secret: ""},
		{ID: "b5", Tenant: "acme", URL: "https://example.com/", Secret: "s", Events: []string{"\xff"}},
	} {
		if err := st.AddWebhook(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("AddWebhook(%+v): %v, want invalid", bad, err)
		}
	}
	if ws, err := st.Webhooks(ctx, "acme"); err != nil || len(ws) != 2 || ws[0].ID != "wh-all" || !cmp.Equal(ws[1], hooks[1]) {
		t.Errorf("Webhooks(acme) = %+v, %v", ws, err)
	}
	if ws, err := st.Webhooks(ctx, ""); err != nil || len(ws) != 3 {
		t.Errorf("Webhooks of every tenant: %d, %v", len(ws), err)
	}
	if _, err := st.GetWebhook(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetWebhook of none: %v", err)
	}
	evs := []store.Event{
		{ID: "e1", At: t0, Type: "created", Tenant: "acme", Sandbox: "sb1", State: "creating"},
		{ID: "e2", At: t0, Type: "started", Tenant: "acme", Sandbox: "sb1", State: "running"},
		{ID: "e3", At: t0, Type: "stopped", Tenant: "acme", Sandbox: "sb1", State: "stopped"},
		{ID: "e4", At: t0, Type: "started", Tenant: "acme", Sandbox: "sb2", State: "running"},
		{ID: "e5", At: t0, Type: "error", Tenant: "", Sandbox: "sb3", State: "error", Reason: "boom"},
	}
	if last, err := st.LastEventSeq(ctx); err != nil || last != 0 {
		t.Errorf("LastEventSeq of none = %d, %v", last, err)
	}
	added, err := st.AddEvents(ctx, evs[:3])
	if err != nil {
		t.Fatal(err)
	}
	more, err := st.AddEvents(ctx, evs[3:])
	if err != nil {
		t.Fatal(err)
	}
	added = append(added, more...)
	// Each event's deliveries, counted (and not kept: Events reads none).
	for i, want := range []int{1, 1, 2, 1, 0} {
		if added[i].Queued != want {
			t.Errorf("event %s queued %d deliveries, want %d", added[i].ID, added[i].Queued, want)
		}
		added[i].Queued = 0
	}
	for i := 1; i < len(added); i++ {
		if added[i].Seq <= added[i-1].Seq {
			t.Fatalf("seqs not ascending: %+v", added)
		}
	}
	if added[4].Tenant != "default" {
		t.Errorf(`"" tenant written as %q`, added[4].Tenant)
	}
	if _, err := st.AddEvents(ctx, evs[:1]); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("an event ID twice: %v, want conflict", err)
	}
	got, err := st.Events(ctx, added[1].Seq, 0)
	if err != nil || !cmp.Equal(got, added[2:]) {
		t.Errorf("Events after the second: %s %v", cmp.Diff(added[2:], got), err)
	}
	if last, err := st.LastEventSeq(ctx); err != nil || last != added[4].Seq {
		t.Errorf("LastEventSeq = %d, %v; want %d", last, err, added[4].Seq)
	}
	if got, err := st.Events(ctx, 0, 2); err != nil || len(got) != 2 || got[0].ID != "e1" {
		t.Errorf("Events limit 2: %+v %v", got, err)
	}

	// Deliveries: wh-all owes e1..e4, wh-stop e3; wh-other nothing.
	ds, err := st.Deliveries(ctx, "wh-all", 0)
	if err != nil || len(ds) != 4 || ds[0].Event.ID != "e4" || ds[0].State != store.DeliveryPending {
		t.Fatalf("wh-all's deliveries: %+v %v", ds, err)
	}
	if ds, err := st.Deliveries(ctx, "wh-stop", 0); err != nil || len(ds) != 1 || ds[0].Event.ID != "e3" {
		t.Errorf("wh-stop's deliveries: %+v %v", ds, err)
	}
	if ds, err := st.Deliveries(ctx, "wh-other", 0); err != nil || len(ds) != 0 {
		t.Errorf("another tenant's webhook got deliveries: %+v %v", ds, err)
	}

	// Claims: the head of each webhook's queue per sandbox, held.
	now := t0.Add(time.Minute)
	ids := func(ds []store.Delivery) (out []string) {
		for _, d := range ds {
			out = append(out, d.Webhook+"/"+d.Event.ID)
		}
		return out
	}
	c1, err := st.ClaimDeliveries(ctx, now, 30*time.Second, 10)
	if want := []string{"wh-all/e1", "wh-stop/e3", "wh-all/e4"}; err != nil || !cmp.Equal(ids(c1), want) {
		t.Fatalf("first claim = %v, %v; want %v", ids(c1), err, want)
	}
	if c1[0].Attempts != 1 || !c1[0].NextAt.Equal(now.Add(30*time.Second)) {
		t.Errorf("claimed delivery: attempts %d, next %v", c1[0].Attempts, c1[0].NextAt)
	}
	if c, err := st.ClaimDeliveries(ctx, now, 30*time.Second, 10); err != nil || len(c) != 0 {
		t.Errorf("claimed again while held: %v %v", ids(c), err)
	}
	// e1 delivered: e2 is sb1's head for wh-all.
	d := c1[0]
	d.State, d.LastStatus, d.DoneAt = store.DeliveryDone, 200, now
	if err := st.FinishDelivery(ctx, d); err != nil {
		t.Fatal(err)
	}
	// e4 failed, to be retried in a minute: nothing of sb2 is due now.
	d = c1[2]
	d.State, d.LastStatus, d.LastError, d.NextAt = store.DeliveryPending, 500, "internal server error", now.Add(time.Minute)
	if err := st.FinishDelivery(ctx, d); err != nil {
		t.Fatal(err)
	}
	c2, err := st.ClaimDeliveries(ctx, now, 30*time.Second, 10)
	if want := []string{"wh-all/e2"}; err != nil || !cmp.Equal(ids(c2), want) {
		t.Errorf("second claim = %v, %v; want %v", ids(c2), err, want)
	}
	// Past the hold, an unfinished claim is due again: at least once.
	c3, err := st.ClaimDeliveries(ctx, now.Add(2*time.Minute), 30*time.Second, 10)
	if want := []string{"wh-all/e2", "wh-stop/e3", "wh-all/e4"}; err != nil || !cmp.Equal(ids(c3), want) {
		t.Errorf("claim past the hold = %v, %v; want %v", ids(c3), err, want)
	}
	for _, d := range c3 {
		if d.Webhook == "wh-all" && d.Event.ID == "e4" && (d.Attempts != 2 || d.LastStatus != 500 || d.LastError != "internal server error") {
			t.Errorf("retried delivery: %+v", d)
		}
	}
	if err := st.FinishDelivery(ctx, store.Delivery{Seq: 1 << 40, State: store.DeliveryDone}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("finishing no delivery: %v", err)
	}

	// Pruning keeps the events pending deliveries need.
	if err := st.PruneJournal(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	left, err := st.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var leftIDs []string
	for _, e := range left {
		leftIDs = append(leftIDs, e.ID)
	}
	if want := []string{"e2", "e3", "e4"}; !cmp.Equal(leftIDs, want) {
		t.Errorf("events after pruning: %v, want %v (e1 delivered, e5 owed to nobody)", leftIDs, want)
	}

	// A webhook goes with its deliveries.
	if err := st.DeleteWebhook(ctx, "wh-all"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteWebhook(ctx, "wh-all"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting it twice: %v", err)
	}
	if ds, err := st.Deliveries(ctx, "wh-all", 0); err != nil || len(ds) != 0 {
		t.Errorf("a deleted webhook's deliveries: %+v %v", ds, err)
	}
	if err := st.DeleteWebhook(ctx, "x\x00y"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting a hostile ID: %v", err)
	}
}
