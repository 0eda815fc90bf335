package vault_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/stscreds"
)

// TestCredentials mints a vault's credentials through a real
// stscreds.Minter whose STS is a local server speaking AssumeRole's query
// API: the session names the tenant and the vault's ID, the policy's
// prefix is where the vault's packs are, and another tenant's vault is
// not found before STS is asked.
func TestCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIASERVER")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "server-secret")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	var mu sync.Mutex
	var forms []url.Values
	sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm)
		mu.Unlock()
		fmt.Fprint(w, `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>`+
			`<AccessKeyId>ASIA1</AccessKeyId><SecretAccessKey>s</SecretAccessKey><SessionToken>tok</SessionToken>`+
			`<Expiration>2030-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>`)
	}))
	defer sts.Close()
	// The vaults' store is a directory; the credentials name a bucket
	// laid out the same, as they would an s3:// store's.
	m, err := stscreds.New(context.Background(), stscreds.Config{RoleARN: "arn:aws:iam::1:role/vaults", BlobURL: "s3://archive?region=us-east-1", STSEndpoint: sts.URL})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: t.TempDir(), creds: m}
	e.blobURL = "file://" + filepath.Join(e.dir, "blob")
	e.blobDir = filepath.Join(e.dir, "blob")
	e.start()
	if _, err := e.svc.Create(ctxOf("acme"), api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent}); err != nil {
		t.Fatal(err)
	}
	packs, _ := filepath.Glob(filepath.Join(e.blobDir, "vaults", "*", "packs", "*"))
	if len(packs) == 0 {
		t.Fatal("no packs in the store")
	}
	id := filepath.Base(filepath.Dir(filepath.Dir(packs[0])))

	c, err := e.svc.Credentials(ctxOf("acme"), "notes", api.VaultCredentialsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessKeyID != "ASIA1" || c.Bucket != "archive" || c.Prefix != "vaults/"+id+"/" || !c.ReadOnly {
		t.Fatalf("credentials %+v", c)
	}
	rel, _ := filepath.Rel(e.blobDir, packs[0])
	if !strings.HasPrefix(filepath.ToSlash(rel), c.Prefix) {
		t.Errorf("pack %s is outside the credentials' prefix %s", rel, c.Prefix)
	}
	f := forms[0]
	policy, _ := stscreds.Policy("archive", "vaults/"+id+"/", true)
	if f.Get("RoleSessionName") != "atoll-acme-"+id || f.Get("DurationSeconds") != "900" || f.Get("Policy") != policy {
		t.Errorf("STS request %v", f)
	}
	if _, err := e.svc.Credentials(ctxOf("acme"), "notes", api.VaultCredentialsRequest{TTLSeconds: 3600, ReadWrite: true}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("read-write credentials of a vault without allow_rewrite: %v, want forbidden", err)
	}
	if _, err := e.svc.Create(ctxOf("acme"), api.CreateVaultRequest{Name: "raw", AllowRewrite: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Credentials(ctxOf("acme"), "raw", api.VaultCredentialsRequest{TTLSeconds: 3600, ReadWrite: true}); err != nil {
		t.Fatal(err)
	}
	if f := forms[1]; f.Get("DurationSeconds") != "3600" || !strings.Contains(f.Get("Policy"), "s3:DeleteObject") {
		t.Errorf("read-write STS request %v", f)
	}

	for _, tc := range []struct {
		name, tenant, vault string
		ttl                 int
		want                error
	}{
		{"another tenant's vault", "other", "notes", 900, errdefs.ErrNotFound},
		{"no such vault", "acme", "nope", 900, errdefs.ErrNotFound},
		{"bad name", "acme", "../x", 900, errdefs.ErrInvalid},
		{"ttl too short", "acme", "notes", 899, errdefs.ErrInvalid},
		{"ttl too long", "acme", "notes", 12*3600 + 1, errdefs.ErrInvalid},
		{"ttl negative", "acme", "notes", -1, errdefs.ErrInvalid},
		// (1<<55 + 1800) s in nanoseconds wraps to 1800 s.
		{"ttl that wraps", "acme", "notes", 1<<55 + 1800, errdefs.ErrInvalid},
	} {
		if _, err := e.svc.Credentials(ctxOf(tc.tenant), tc.vault, api.VaultCredentialsRequest{TTLSeconds: tc.ttl}); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if len(forms) != 2 {
		t.Errorf("%d STS requests, want 2", len(forms))
	}
}

// TestCredentialsOff: without a Minter (no S3 store or no role), a
// vault's credentials are a conflict that says what is missing.
func TestCredentialsOff(t *testing.T) {
	e := newEnv(t)
	if _, err := e.svc.Create(ctxOf("acme"), api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.svc.Credentials(ctxOf("acme"), "notes", api.VaultCredentialsRequest{})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "--vault-sts-role") {
		t.Errorf("%v, want ErrConflict naming --vault-sts-role", err)
	}
	if _, err := e.svc.Credentials(ctxOf("other"), "notes", api.VaultCredentialsRequest{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's: %v, want ErrNotFound", err)
	}
}
