package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/vault"
)

// newVaultFixture is a server whose vaults are a real vault.Service on a
// SQLite store and a blob directory.
func newVaultFixture(t *testing.T) *fixture {
	t.Helper()
	testenv.RequireCommand(t, "git")
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := blob.Open(context.Background(), "file://"+filepath.Join(dir, "blob"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	vs, err := vault.New(vault.Config{Store: st, Blob: b, Dir: filepath.Join(dir, "vaults")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vs.Close() })
	s, err := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keyAuth(testKey), Vaults: vs})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return &fixture{t: t, s: s, url: ts.URL}
}

func TestVaultRoutes(t *testing.T) {
	f := newVaultFixture(t)
	resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	var v api.Vault
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &v) != nil || v.Head == "" || v.GitPath != "/git/notes.git" {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	resp, body = f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes"})
	wantError(t, resp, body, http.StatusConflict, "conflict")
	for _, name := range []string{"../etc", "a/b", "a..b", ""} {
		resp, body = f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: name})
		wantError(t, resp, body, http.StatusBadRequest, "invalid")
	}
	resp, body = f.do("POST", "/v1/vaults", `{"name":"`+strings.Repeat("a", MaxJSONBody)+`"}`)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, "too_large")

	resp, body = f.do("GET", "/v1/vaults", nil)
	var list api.VaultList
	if resp.StatusCode != 200 || json.Unmarshal(body, &list) != nil || len(list.Vaults) != 1 {
		t.Errorf("list: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes", nil)
	if resp.StatusCode != 200 {
		t.Errorf("get: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/log?limit=5", nil)
	var log api.VaultLog
	if resp.StatusCode != 200 || json.Unmarshal(body, &log) != nil || len(log.Commits) != 1 || log.Commits[0].ID != v.Head {
		t.Errorf("log: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/log?limit=0", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/notes/log?rev=--output=x", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/notes/log?rev=nosuchbranch", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")

	resp, body = f.do("GET", "/v1/vaults/notes/files/entities/README.md?rev="+v.Head, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "frontmatter") {
		t.Errorf("show: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes/files/entities", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("GET", "/v1/vaults/notes/files/nope.md", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	resp, body = f.do("GET", "/v1/vaults/notes/files/a%2F..%2F..%2Fetc%2Fpasswd", nil)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")

	// The git endpoint asks git for a key with a Basic challenge.
	req, _ := http.NewRequest("GET", f.url+"/git/notes.git/info/refs?service=git-upload-pack", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("git without a key: %s %q", r.Status, r.Header.Get("WWW-Authenticate"))
	}
	req.SetBasicAuth("x", testKey)
	if r, err = http.DefaultClient.Do(req); err != nil || r.StatusCode != 200 {
		t.Errorf("git with the key as password: %v %v", r.Status, err)
	}
	r.Body.Close()

	resp, body = f.do("DELETE", "/v1/vaults/notes", nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("delete: %s %s", resp.Status, body)
	}
	resp, body = f.do("GET", "/v1/vaults/notes", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}

func TestVaultRoutesWithoutVaults(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("GET", "/v1/vaults", nil)
	wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
}

// TestVaultCredentialsRoute: the route's answers without a minter (the
// minting itself is internal/vault's TestCredentials).
func TestVaultCredentialsRoute(t *testing.T) {
	f := newVaultFixture(t)
	if resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes"}); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	resp, body := f.do("POST", "/v1/vaults/notes/credentials", nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")
	resp, body = f.do("POST", "/v1/vaults/notes/credentials", api.VaultCredentialsRequest{TTLSeconds: 60})
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("POST", "/v1/vaults/notes/credentials", `{"ttl_seconds":"900"}`)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("POST", "/v1/vaults/nope/credentials", api.VaultCredentialsRequest{})
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}
