package server

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

func TestVaultSearchRoutes(t *testing.T) {
	f := newVaultFixture(t)
	resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/search?q=memory", nil)
	var res api.VaultSearch
	if resp.StatusCode != 200 || json.Unmarshal(body, &res) != nil || len(res.Hits) != 1 || res.Hits[0].Path != "index.md" ||
		res.Hits[0].Title != "Index" || res.Hits[0].Type != "index" || !strings.Contains(res.Hits[0].Snippet, "**memory**") {
		t.Errorf("search: %s %s", resp.Status, body)
	}
	for _, q := range []string{`"unbalanced`, "NEAR(", "", strings.Repeat("x", 1001), "a:b"} {
		resp, body = f.do("GET", "/v1/vaults/notes/search?q="+url.QueryEscape(q), nil)
		wantError(t, resp, body, http.StatusBadRequest, "invalid")
	}
	resp, body = f.do("GET", "/v1/vaults/notes/search?q=x&limit=0", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/nope/search?q=x", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")

	resp, body = f.do("GET", "/v1/vaults/notes/links?path=index.md", nil)
	var l api.VaultLinks
	if resp.StatusCode != 200 || json.Unmarshal(body, &l) != nil || l.Note == nil || len(l.Links) != 3 || l.Links[0].To != "entities/README.md" {
		t.Errorf("links: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/links", nil)
	if resp.StatusCode != 200 || json.Unmarshal(body, &l) != nil || len(l.Broken) != 0 {
		t.Errorf("broken links of the seeded layout: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/links?path=..%2Fx", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/notes/links?path=nope.md", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}
