package auth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/tenant"
)

func TestKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := New(st)
	var saved string
	first, err := k.EnsureFirst(ctx, func(key string) error { saved = key; return nil })
	if err != nil || first == "" || first != saved || !strings.HasPrefix(first, "atoll_") || len(first) != 6+48 {
		t.Fatalf("first key %q (saved %q), %v", first, saved, err)
	}
	if again, err := k.EnsureFirst(ctx, func(string) error { return errors.New("called") }); err != nil || again != "" {
		t.Errorf("second EnsureFirst: %q, %v", again, err)
	}
	if got, err := k.Authenticate(ctx, first); err != nil || got != tenant.Default {
		t.Errorf("first key: %q, %v", got, err)
	}
	// "team.a" is no tenant name: such a key needs a tenant named.
	if _, err := k.Create(ctx, api.CreateKeyRequest{Name: "Team.A"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("create Team.A: %v", err)
	}
	if _, err := k.Create(ctx, api.CreateKeyRequest{Name: "ci.bot", Tenant: "bots"}); err != nil {
		t.Errorf("create ci.bot for bots: %v", err)
	}
	team, err := k.Create(ctx, api.CreateKeyRequest{Name: "Team-A"})
	if err != nil || team.Tenant != "team-a" || team.Admin || team.Key == "" || team.ID != store.KeyID(Hash(team.Key)) {
		t.Fatalf("create Team-A: %+v, %v", team, err)
	}
	// A name used again does not join the tenant by chance; naming it does.
	for _, name := range []string{"team-a", "default", "Default"} {
		if _, err := k.Create(ctx, api.CreateKeyRequest{Name: name}); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("create %s again: %v", name, err)
		}
	}
	if joined, err := k.Create(ctx, api.CreateKeyRequest{Name: "team-a", Tenant: "team-a"}); err != nil || joined.Tenant != "team-a" {
		t.Errorf("another key of team-a: %+v, %v", joined, err)
	}
	if got, err := k.Authenticate(ctx, " "+team.Key+"\n"); err != nil || got != "team-a" {
		t.Errorf("team key: %q, %v", got, err)
	}
	for _, bad := range []string{"", "atoll_00", strings.Repeat("k", 300), first + "x"} {
		if _, err := k.Authenticate(ctx, bad); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("key %.20q: %v", bad, err)
		}
	}
	// The database holds hashes, never keys.
	var db []byte
	for _, p := range []string{path, path + "-wal"} {
		b, _ := os.ReadFile(p)
		db = append(db, b...)
	}
	if len(db) == 0 || strings.Contains(string(db), team.Key) || strings.Contains(string(db), first) {
		t.Error("the database holds a key")
	}
	ks, err := k.List(ctx)
	if err != nil || len(ks) != 4 || ks[0].Tenant != tenant.Default || !ks[0].Admin || ks[1].Key != "" {
		t.Errorf("list: %+v, %v", ks, err)
	}
	if err := k.Delete(ctx, ks[0].ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting the last admin key: %v", err)
	}
	if err := k.Delete(ctx, "nothex"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("malformed ID: %v", err)
	}
	// Revoking takes effect at once, cache or not.
	if err := k.Delete(ctx, team.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(ctx, team.Key); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("revoked key: %v", err)
	}
}
