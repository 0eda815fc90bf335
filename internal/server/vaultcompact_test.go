package server

import (
	"encoding/json"
	"net/http"
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
