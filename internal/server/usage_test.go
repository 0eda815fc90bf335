package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/usage"
)

// TestUsageRoute answers GET /v1/usage from rows in a real store, through
// real keys: an admin sees every tenant's usage or one's, another key only
// its own tenant's (403 for another's), and bad queries are 400s.
func TestUsageRoute(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := auth.New(st)
	admin, err := keys.EnsureFirst(ctx, func(string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	teamA, err := keys.Create(ctx, api.CreateKeyRequest{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(10 * time.Second)
	if err := st.PutUsage(ctx, []store.UsageRow{
		{Sandbox: "sb-admin", Tenant: "default", Template: "base", Start: now.Add(-time.Minute), Seconds: 10, CPUMicros: 2_000_000},
		{Sandbox: "sb-a", Tenant: "team-a", Template: "py", Labels: map[string]string{"team": "x"}, Start: now.Add(-time.Minute), Seconds: 10, CPUMicros: 3_000_000, NetOutBytes: 7},
	}); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keys, Keys: keys,
		Usage: usage.Reporter{Store: st}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	f := &fixture{t: t, s: s, url: ts.URL}
	get := func(key, query string, status int) api.UsageReport {
		t.Helper()
		resp, body := f.do("GET", "/v1/usage"+query, "", "X-API-Key", key)
		if resp.StatusCode != status {
			t.Fatalf("usage%s: %d %s, want %d", query, resp.StatusCode, body, status)
		}
		var rep api.UsageReport
		json.Unmarshal(body, &rep)
		return rep
	}
	groups := func(rep api.UsageReport) map[string]float64 {
		out := map[string]float64{}
		for _, e := range rep.Usage {
			out[e.Group] += e.CPUSeconds
		}
		return out
	}
	if g := groups(get(admin, "?step=1d", 200)); len(g) != 2 || g["sb-admin"] != 2 || g["sb-a"] != 3 {
		t.Errorf("admin: %v", g)
	}
	if g := groups(get(admin, "?step=1d&tenant=team-a", 200)); len(g) != 1 || g["sb-a"] != 3 {
		t.Errorf("admin, team-a's: %v", g)
	}
	if g := groups(get(teamA.Key, "?step=1d&group_by=tenant", 200)); len(g) != 1 || g["team-a"] != 3 {
		t.Errorf("team-a by tenant: %v", g)
	}
	if g := groups(get(teamA.Key, "?step=1m&group_by=label:team", 200)); len(g) != 1 || g["x"] != 3 {
		t.Errorf("team-a by label: %v", g)
	}
	rep := get(admin, "?group_by=template", 200)
	if rep.Step != "1h" || rep.GroupBy != "template" || len(rep.Usage) != 2 || rep.To.Sub(rep.From) < 24*time.Hour {
		t.Errorf("defaults: %+v", rep)
	}
	get(teamA.Key, "?tenant=default", 403)
	get("atoll_wrong", "", 401)
	for _, q := range []string{"?step=5m", "?group_by=node", "?group_by=label:", "?from=yesterday", "?from=200&to=100",
		"?step=1m&from=0", "?tenant=Not%20A%20Tenant", "?to=99999999999999"} {
		get(admin, q, 400)
	}
	// A server without metering answers 503.
	s2, err := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts2 := httptest.NewServer(s2.Handler())
	t.Cleanup(ts2.Close)
	if resp, body := (&fixture{t: t, s: s2, url: ts2.URL}).do("GET", "/v1/usage", "", "X-API-Key", admin); resp.StatusCode != 503 {
		t.Errorf("no metering: %d %s", resp.StatusCode, body)
	}
}
