package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

func TestVaultCompactRoute(t *testing.T) {
	f := newVaultFixture(t)
	resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	// The seeded layout has no daily files: nothing to do, no commit.
	resp, body = f.do("POST", "/v1/vaults/notes/compact", api.VaultCompactRequest{Before: "2030-01-01"})
	var res api.VaultCompaction
	if resp.StatusCode != 200 || json.Unmarshal(body, &res) != nil || res.Commit != "" || len(res.Weeks) != 0 {
		t.Errorf("compact: %s %s", resp.Status, body)
	}
	resp, body = f.do("POST", "/v1/vaults/notes/compact", nil)
	if resp.StatusCode != 200 {
		t.Errorf("compact without a body: %s %s", resp.Status, body)
	}
	for _, d := range []string{"2026-13-01", "tomorrow"} {
		resp, body = f.do("POST", "/v1/vaults/notes/compact", api.VaultCompactRequest{Before: d})
		wantError(t, resp, body, http.StatusBadRequest, "invalid")
	}
	resp, body = f.do("POST", "/v1/vaults/nope/compact", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}

// TestVaultScheduleRoutes: PATCH /v1/vaults/{name} sets the schedule and
// the summarizer, a bad value is 400; GET .../events lists the
// compactions.
func TestVaultScheduleRoutes(t *testing.T) {
	f := newVaultFixture(t)
	resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes", Compact: "weekly"})
	var v api.Vault
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &v) != nil || v.Compact != "weekly" || v.NextCompaction == nil {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	resp, body = f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "other", Compact: "hourly"})
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	daily, cmd := "daily", "llm summarize"
	resp, body = f.do("PATCH", "/v1/vaults/notes", api.VaultUpdate{Compact: &daily, Summarizer: &cmd})
	if resp.StatusCode != 200 || json.Unmarshal(body, &v) != nil || v.Compact != "daily" || v.Summarizer != cmd {
		t.Errorf("patch: %s %s", resp.Status, body)
	}
	// A field not given is kept.
	off := "off"
	resp, body = f.do("PATCH", "/v1/vaults/notes", api.VaultUpdate{Compact: &off})
	v = api.Vault{}
	if resp.StatusCode != 200 || json.Unmarshal(body, &v) != nil || v.Compact != "" || v.NextCompaction != nil || v.Summarizer != cmd {
		t.Errorf("patch off: %s %s", resp.Status, body)
	}
	for _, bad := range []any{api.VaultUpdate{Compact: &cmd}, map[string]any{"compact": 3}, map[string]any{"nope": 1}} {
		resp, body = f.do("PATCH", "/v1/vaults/notes", bad)
		wantError(t, resp, body, http.StatusBadRequest, "invalid")
	}
	resp, body = f.do("PATCH", "/v1/vaults/nope", api.VaultUpdate{Compact: &off})
	wantError(t, resp, body, http.StatusNotFound, "not_found")

	// The vault's summarizer needs sandboxes, which this server has not:
	// 503, and the vault's event says so.
	resp, body = f.do("POST", "/v1/vaults/notes/compact", api.VaultCompactRequest{Before: "2030-01-01"})
	wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
	resp, body = f.do("GET", "/v1/vaults/notes/events", nil)
	var evs api.VaultEvents
	if resp.StatusCode != 200 || json.Unmarshal(body, &evs) != nil || len(evs.Events) != 1 || evs.Events[0].Kind != "compact" ||
		!strings.Contains(evs.Events[0].Error, "no summarizer commands") || evs.Events[0].Trigger != "api" {
		t.Errorf("events: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/events?limit=0", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/nope/events", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}
