package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// adminKeys returns the keys of a real store of the test's own, and its
// first, admin, key.
func adminKeys(t *testing.T) (*auth.Keys, string) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := auth.New(st)
	admin, err := keys.EnsureFirst(context.Background(), func(string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return keys, admin
}

// TestKeyRoutes runs the key routes and the admin check over real keys in
// a real store: admin keys issue, list and revoke keys and change
// templates; other keys get 403, bad keys 401, bad input 400.
func TestKeyRoutes(t *testing.T) {
	keys, admin := adminKeys(t)
	s, err := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Templates: newMemTemplates(),
		Auth: keys, Keys: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	f := &fixture{t: t, s: s, url: ts.URL}
	as := func(key string) []string { return []string{"X-API-Key", key} }

	resp, body := f.do("POST", "/v1/keys", `{"name":"team-a"}`, as(admin)...)
	if resp.StatusCode != 201 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	var a api.APIKey
	json.Unmarshal(body, &a)
	if a.Tenant != "team-a" || a.Admin || !strings.HasPrefix(a.Key, "atoll_") {
		t.Errorf("created %+v", a)
	}

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/keys", `{"name":"x"}`}, {"GET", "/v1/keys", ""}, {"DELETE", "/v1/keys/" + a.ID, ""},
		{"POST", "/v1/templates/import", `{"name":"x","ref":"example.com/x"}`},
		{"POST", "/v1/templates/build?name=x", ""}, {"DELETE", "/v1/templates/host", ""},
		{"POST", "/v1/templates/host/tag", `{"tag":"y"}`}, {"POST", "/v1/templates/bootstrap", `{}`},
	} {
		resp, body := f.do(c.method, c.path, c.body, as(a.Key)...)
		wantError(t, resp, body, 403, "forbidden")
		for _, bad := range []string{"", "atoll_wrong", strings.Repeat("k", 1000)} {
			resp, body := f.do(c.method, c.path, c.body, as(bad)...)
			wantError(t, resp, body, 401, "unauthorized")
		}
	}
	if resp, body := f.do("GET", "/v1/templates", nil, as(a.Key)...); resp.StatusCode != 200 {
		t.Errorf("list templates with a tenant's key: %d %s", resp.StatusCode, body)
	}
	for _, body := range []string{`{}`, `{"name":"a b"}`, `{"name":"ok","tenant":"UP"}`, `{"name":"ok","extra":1}`, `{"name":`, `"x"`} {
		resp, b := f.do("POST", "/v1/keys", body, as(admin)...)
		wantError(t, resp, b, 400, "invalid")
	}
	resp, body = f.do("POST", "/v1/keys", `{"name":"Team-A"}`, as(admin)...)
	wantError(t, resp, body, 409, "conflict")
	for _, id := range []string{"x", "ZZZZZZZZZZZZZZZZZZZZ", "0123456789abcdef0123456789"} {
		resp, body := f.do("DELETE", "/v1/keys/"+id, nil, as(admin)...)
		wantError(t, resp, body, 400, "invalid")
	}
	resp, body = f.do("DELETE", "/v1/keys/00000000000000000000", nil, as(admin)...)
	wantError(t, resp, body, 404, "not_found")

	resp, body = f.do("GET", "/v1/keys", nil, as(admin)...)
	var list api.APIKeyList
	if err := json.Unmarshal(body, &list); err != nil || resp.StatusCode != 200 || len(list.Keys) != 2 || strings.Contains(string(body), "atoll_") {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("DELETE", "/v1/keys/"+list.Keys[0].ID, nil, as(admin)...)
	wantError(t, resp, body, 409, "conflict")
	if resp, body := f.do("DELETE", "/v1/keys/"+a.ID, nil, as(admin)...); resp.StatusCode != 204 {
		t.Errorf("revoke: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/sandboxes", nil, as(a.Key)...)
	wantError(t, resp, body, 401, "unauthorized")
}
