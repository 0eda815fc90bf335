package server

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/vault"
)

// signedMounts checks tokens with vault.ParseToken and a set of running
// sandboxes: the server's side of the contract (cmd/atoll's vaultMounts,
// tested end to end, checks them against the store).
type signedMounts struct {
	key     []byte
	running map[string]bool
}

func (m *signedMounts) Check(ctx context.Context, ms []api.VaultMount) error {
	for _, v := range ms {
		if v.Name != "notes" {
			return fmt.Errorf("vault %s: %w", v.Name, errdefs.ErrNotFound)
		}
	}
	return nil
}
func (m *signedMounts) Mount(ctx context.Context, sb api.Sandbox) error { return nil }
func (m *signedMounts) Renew(ctx context.Context, sb api.Sandbox) error { return nil }
func (m *signedMounts) CheckToken(ctx context.Context, token, name string) (string, bool, error) {
	t, err := vault.ParseToken(m.key, token, time.Now())
	if err != nil {
		return "", false, err
	}
	if t.Name != name || !m.running[t.Sandbox] {
		return "", false, fmt.Errorf("%w: refused", errdefs.ErrUnauthorized)
	}
	return t.Tenant, t.ReadOnly, nil
}

func TestVaultTokens(t *testing.T) {
	f := newVaultFixture(t)
	m := &signedMounts{key: []byte("0123456789abcdef0123456789abcdef"), running: map[string]bool{"sb1": true}}
	if resp, body := f.do("POST", "/v1/vaults", api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent}); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s %s", resp.Status, body)
	}
	sign := func(sb string, ro bool, ttl time.Duration) string {
		return vault.Token{Vault: "v", Name: "notes", Tenant: "default", Sandbox: sb, ReadOnly: ro, Expires: time.Now().Add(ttl)}.Sign(m.key)
	}
	git := func(method, rest, pw string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, f.url+"/git/notes.git/"+rest, nil)
		req.SetBasicAuth("sandbox", pw)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// Without VaultMounts, a token is no key.
	if resp := git("GET", "info/refs?service=git-upload-pack", sign("sb1", false, time.Minute)); resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("a token on a server without mounts: %s", resp.Status)
	}
	f.s.cfg.VaultMounts = m
	for _, c := range []struct {
		what, method, rest, pw string
		want                   int
	}{
		{"fetch", "GET", "info/refs?service=git-upload-pack", sign("sb1", false, time.Minute), 200},
		{"push's advertisement", "GET", "info/refs?service=git-receive-pack", sign("sb1", false, time.Minute), 200},
		{"read-only fetch", "GET", "info/refs?service=git-upload-pack", sign("sb1", true, time.Minute), 200},
		{"read-only push's advertisement", "GET", "info/refs?service=git-receive-pack", sign("sb1", true, time.Minute), 403},
		{"read-only push", "POST", "git-receive-pack", sign("sb1", true, time.Minute), 403},
		{"expired", "GET", "info/refs?service=git-upload-pack", sign("sb1", false, -time.Second), 401},
		{"a sandbox not running", "GET", "info/refs?service=git-upload-pack", sign("sb2", false, time.Minute), 401},
		{"forged", "GET", "info/refs?service=git-upload-pack", vault.Token{Vault: "v", Name: "notes", Tenant: "default", Sandbox: "sb1", Expires: time.Now().Add(time.Hour)}.Sign([]byte("another key entirely, 32 bytes!!")), 401},
		{"garbage after the prefix", "GET", "info/refs?service=git-upload-pack", vault.TokenPrefix + "\x00..", 401},
	} {
		if resp := git(c.method, c.rest, c.pw); resp.StatusCode != c.want {
			t.Errorf("%s: %s, want %d", c.what, resp.Status, c.want)
		}
	}
	// A create asking for a vault the tenant lacks is 404 before any
	// sandbox is made; a server without mounts, 503.
	resp, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "nope"}}})
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	f.s.cfg.VaultMounts = nil
	resp, body = f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes"}}})
	wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
}
