package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/webhooks"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// receiver is a webhook receiver on loopback: it checks each delivery's
// signature, answers the first one 500, and keeps what it accepted.
type receiver struct {
	t      *testing.T
	secret func() string

	mu       sync.Mutex
	failed   string              // the event ID answered 500
	attempts map[string]int      // by event ID
	bySb     map[string][]string // accepted event types, by sandbox, in order
	ids      map[string]bool
	badSigs  int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := webhooks.Verify(rc.secret(), r.Header.Get(api.HeaderSignature), body, time.Now(), 5*time.Minute); err != nil {
		rc.mu.Lock()
		rc.badSigs++
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var e api.Event
	if err := json.Unmarshal(body, &e); err != nil || e.ID != r.Header.Get(api.HeaderEventID) || e.Type != r.Header.Get(api.HeaderEventType) {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.attempts[e.ID]++
	if rc.failed == "" {
		rc.failed = e.ID
		http.Error(w, "try again", http.StatusInternalServerError)
		return
	}
	if rc.ids[e.ID] {
		return // a repeat: at least once, dropped by its ID
	}
	rc.ids[e.ID] = true
	rc.bySb[e.Sandbox] = append(rc.bySb[e.Sandbox], e.Type)
}

func (rc *receiver) types(sb string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.bySb[sb])
}

// TestJournalE2E runs the journal on a real server: a tenant's lifecycle
// events (created, started, stopped, paused, resumed, archived, deleted)
// stream as SSE in order and only to that tenant (and admins), a
// quota hit is an event, a signed webhook on loopback gets them in order
// per sandbox with a retry after a 500, the audit log records the
// requests with filters, and hostile input (bad URLs, another tenant's
// webhook IDs) gets 4xx.
func TestJournalE2E(t *testing.T) {
	d, _, admin := startRooted(t, "--warm-pool", "0", "--prestart", "0", "--webhook-allow-private", "--webhook-retry", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	ka, err := admin.CreateKey(ctx, api.CreateKeyRequest{Name: "journal-a"})
	if err != nil {
		t.Fatal(err)
	}
	kb, err := admin.CreateKey(ctx, api.CreateKeyRequest{Name: "journal-b"})
	if err != nil {
		t.Fatal(err)
	}
	a, b := d.clientWith(ka.Key), d.clientWith(kb.Key)

	var secret string
	var secretMu sync.Mutex
	rc := &receiver{t: t, attempts: map[string]int{}, bySb: map[string][]string{}, ids: map[string]bool{},
		secret: func() string { secretMu.Lock(); defer secretMu.Unlock(); return secret }}
	hs := httptest.NewServer(rc)
	defer hs.Close()
	hook, err := a.CreateWebhook(ctx, api.CreateWebhookRequest{URL: hs.URL + "/hook", Events: []string{"created", "started", "stopped", "deleted"}})
	if err != nil {
		t.Fatal(err)
	}
	secretMu.Lock()
	secret = hook.Secret
	secretMu.Unlock()
	if !strings.HasPrefix(hook.Secret, "whsec_") || hook.Tenant != "journal-a" || len(hook.ID) != 20 {
		t.Fatalf("webhook: %+v", hook)
	}
	if ws, err := a.ListWebhooks(ctx); err != nil || len(ws) != 1 || ws[0].Secret != "" {
		t.Errorf("ListWebhooks: %+v %v (want one, without its secret)", ws, err)
	}

	// Streams: tenant A's and the admin's, from now.
	streamA, err := a.Events(ctx, atoll.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer streamA.Close()
	streamAdmin, err := admin.Events(ctx, atoll.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer streamAdmin.Close()

	sbA := newSandbox(ctx, t, a, api.CreateSandboxRequest{})
	if _, err := a.StopSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.StartSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PauseSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ResumeSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.StopSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ArchiveSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteSandbox(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	sbB := newSandbox(ctx, t, b, api.CreateSandboxRequest{})
	// A quota hit is an event of the tenant's.
	if _, err := admin.SetQuota(ctx, "journal-a", api.TenantQuota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	sbA2 := newSandbox(ctx, t, a, api.CreateSandboxRequest{})
	if _, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{}); !errors.Is(err, atoll.ErrQuota) {
		t.Fatalf("create over the quota: %v", err)
	}

	wantA := []string{"created/" + sbA.ID, "started/" + sbA.ID, "stopped/" + sbA.ID, "started/" + sbA.ID,
		"paused/" + sbA.ID, "resumed/" + sbA.ID, "stopped/" + sbA.ID, "archived/" + sbA.ID, "deleted/" + sbA.ID, "created/" + sbA2.ID, "started/" + sbA2.ID, "quota_exceeded/"}
	readStream := func(name string, s *atoll.EventStream, n int, keep func(api.Event) bool) []string {
		t.Helper()
		var got []string
		var last int64
		for len(got) < n {
			e, err := s.Next()
			if err != nil {
				t.Fatalf("%s stream after %v: %v", name, got, err)
			}
			if e.Seq <= last {
				t.Errorf("%s stream: seq %d after %d", name, e.Seq, last)
			}
			last = e.Seq
			if keep(e) {
				got = append(got, e.Type+"/"+e.Sandbox)
			}
		}
		return got
	}
	gotA := readStream("tenant A's", streamA, len(wantA), func(e api.Event) bool {
		if e.Tenant != "journal-a" {
			t.Errorf("tenant A's stream sent %+v", e)
		}
		return true
	})
	if !slices.Equal(gotA, wantA) {
		t.Errorf("tenant A's events:\n got %v\nwant %v", gotA, wantA)
	}
	// The admin sees every tenant's: B's create among A's.
	gotAdmin := readStream("the admin's", streamAdmin, len(wantA)+2, func(e api.Event) bool { return true })
	if !slices.Contains(gotAdmin, "created/"+sbB.ID) || !slices.Contains(gotAdmin, "deleted/"+sbA.ID) {
		t.Errorf("admin's stream lacks others' events: %v", gotAdmin)
	}
	// A stream resumed after an event sends what followed.
	all, err := a.Events(ctx, atoll.EventsOptions{After: new(int64), Types: []string{"deleted"}})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := all.Next(); err != nil || e.Type != "deleted" || e.Sandbox != sbA.ID {
		t.Errorf("resumed stream, deleted only: %+v %v", e, err)
	}
	all.Close()

	// The webhook: A's sandbox's events of the types it wants (not
	// paused, resumed or archived), in order, the first after a 500.
	wantHook := []string{"created", "started", "stopped", "started", "stopped", "deleted"}
	deadline := time.Now().Add(60 * time.Second)
	for !slices.Equal(rc.types(sbA.ID), wantHook) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if got := rc.types(sbA.ID); !slices.Equal(got, wantHook) {
		t.Errorf("webhook got %v for sandbox A, want %v", got, wantHook)
	}
	rc.mu.Lock()
	failed, retried, bad := rc.failed, rc.attempts[rc.failed], rc.badSigs
	_, sawB := rc.bySb[sbB.ID]
	rc.mu.Unlock()
	if failed == "" || retried < 2 {
		t.Errorf("the event answered 500 was tried %d times, want a retry", retried)
	}
	if bad != 0 || sawB {
		t.Errorf("bad signatures %d; tenant B's events delivered: %v", bad, sawB)
	}
	ds, err := a.WebhookDeliveries(ctx, hook.ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	var retriedDelivery bool
	for _, dl := range ds {
		if dl.Event.ID == failed {
			retriedDelivery = dl.State == "delivered" && dl.Attempts >= 2 && dl.LastStatus == 200
		}
	}
	if !retriedDelivery || len(ds) < len(wantHook) {
		t.Errorf("deliveries do not show the retried one delivered: %+v", ds)
	}

	// The audit log: A's requests about its sandbox, newest first.
	l, err := admin.Audit(ctx, api.AuditQuery{Sandbox: sbA.ID})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range l.Entries {
		actions = append(actions, e.Action)
		if e.Tenant != "journal-a" || e.KeyID != ka.ID || e.Source != "127.0.0.1" || e.Status >= 300 || e.RequestID == "" {
			t.Errorf("audit entry %+v: want tenant journal-a, key %s, 2xx, a request ID", e, ka.ID)
		}
	}
	wantActions := []string{"DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/archive", "POST /v1/sandboxes/{id}/stop",
		"POST /v1/sandboxes/{id}/resume", "POST /v1/sandboxes/{id}/pause", "POST /v1/sandboxes/{id}/start",
		"POST /v1/sandboxes/{id}/stop", "POST /v1/sandboxes"}
	if !slices.Equal(actions, wantActions) {
		t.Errorf("audit of sandbox A: %v, want %v", actions, wantActions)
	}
	if l, err := admin.Audit(ctx, api.AuditQuery{Tenant: "journal-b", Action: "POST /v1/sandboxes"}); err != nil || len(l.Entries) != 1 || l.Entries[0].Target != sbB.ID {
		t.Errorf("audit of B's creates: %+v %v", l, err)
	}
	if l, err := admin.Audit(ctx, api.AuditQuery{Tenant: "journal-a", Action: "POST /v1/sandboxes"}); err != nil || len(l.Entries) != 3 || l.Entries[0].Status != 429 {
		t.Errorf("audit of A's creates (the last refused 429): %+v %v", l, err)
	}
	if l, err := admin.Audit(ctx, api.AuditQuery{Tenant: "journal-a", Action: "DELETE"}); err != nil || len(l.Entries) != 1 || l.Entries[0].Target != sbA.ID {
		t.Errorf("audit of A's DELETEs: %+v %v", l, err)
	}
	if l, err := admin.Audit(ctx, api.AuditQuery{From: time.Now().Add(time.Hour)}); err != nil || len(l.Entries) != 0 {
		t.Errorf("audit from the future: %+v %v", l, err)
	}
	if l, err := admin.Audit(ctx, api.AuditQuery{Limit: 2}); err != nil || len(l.Entries) != 2 || l.Next == 0 {
		t.Errorf("a page of 2: %+v %v", l, err)
	} else if l2, err := admin.Audit(ctx, api.AuditQuery{Limit: 2, Before: l.Next}); err != nil || len(l2.Entries) != 2 || l2.Entries[0].Seq >= l.Entries[1].Seq {
		t.Errorf("the next page: %+v %v", l2, err)
	}
	if _, err := a.Audit(ctx, api.AuditQuery{}); !errors.Is(err, atoll.ErrForbidden) {
		t.Errorf("a tenant's key reading the audit log: %v, want forbidden", err)
	}
	if out, code := d.cli("audit", "--sandbox", sbA.ID); code != 0 || !strings.Contains(out, "POST /v1/sandboxes/{id}/stop") {
		t.Errorf("atoll audit: %d %s", code, out)
	}

	// Hostile input.
	for _, u := range []string{"ftp://example.com/x", "not a url", "http://user:pw@example.com/", "http:///nohost", strings.Repeat("x", 3000)} {
		if _, err := a.CreateWebhook(ctx, api.CreateWebhookRequest{URL: u}); !errors.Is(err, atoll.ErrInvalid) {
			t.Errorf("webhook URL %.40q: %v, want invalid", u, err)
		}
	}
	if _, err := a.CreateWebhook(ctx, api.CreateWebhookRequest{URL: hs.URL, Events: []string{"exploded"}}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("unknown event type: %v, want invalid", err)
	}
	if err := b.DeleteWebhook(ctx, hook.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("another tenant deleting A's webhook: %v, want not found", err)
	}
	if _, err := b.WebhookDeliveries(ctx, hook.ID, 0); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("another tenant reading A's deliveries: %v, want not found", err)
	}
	for _, p := range []string{"/v1/webhooks/../../etc", "/v1/webhooks/AAAAAAAAAAAAAAAAAAAA", "/v1/webhooks/x%00y"} {
		if status, body := d.v1(t, "DELETE", p, ka.Key, ""); status < 400 || status >= 500 {
			t.Errorf("DELETE %s: %d %s", p, status, body)
		}
	}
	for _, q := range []string{"?after=-5", "?after=x", "?types=exploded"} {
		if status, body := d.v1(t, "GET", "/v1/events"+q, ka.Key, ""); status != 400 {
			t.Errorf("GET /v1/events%s: %d %s", q, status, body)
		}
	}
	for _, q := range []string{"?from=yesterday", "?limit=0", "?before=-1", "?tenant=" + strings.Repeat("x", 300)} {
		if status, body := d.v1(t, "GET", "/v1/audit"+q, d.key, ""); status != 400 {
			t.Errorf("GET /v1/audit%s: %d %s", q, status, body)
		}
	}
	if err := a.DeleteWebhook(ctx, hook.ID); err != nil {
		t.Errorf("deleting the webhook: %v", err)
	}
	if ws, err := a.ListWebhooks(ctx); err != nil || len(ws) != 0 {
		t.Errorf("after rm: %+v %v", ws, err)
	}

	// A stream open does not hold a shutdown up: it ends the stream.
	open, err := a.Events(ctx, atoll.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	start := time.Now()
	d.stop()
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("shutdown with an event stream open took %v", took)
	}
	if _, err := open.Next(); err == nil {
		t.Error("the stream goes on after the shutdown")
	}
}
