package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// wildcardValues fill in the routes' path wildcards: well-formed IDs and
// names that name nothing, so that each route runs to its own answer.
var wildcardValues = map[string]string{
	"id": "sbxaaaaaaaaaaaaaaaaa", "snap": "snpaaaaaaaaaaaaaaaaa", "name": "base", "tenant": "acme",
	"key": "0123456789abcdef0123", "node": "n1", "pid": "1", "ctx": "c1", "webhook": "whkaaaaaaaaaaaaaaaaa", "path...": "notes.md",
}

// TestEveryChangeIsAudited walks the route table: every route whose
// method asks for a change, answered with whatever status, leaves an
// audit row naming the route, the key, its tenant and the target in the
// path; a request with a refused key leaves one too, without a tenant;
// reads leave none.
func TestEveryChangeIsAudited(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := audit.New(audit.Config{Journal: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer rec.Close()
	f := newFixture(t)
	s, err := New(Config{
		Sandboxes: f.sbs, Templates: f.tpls, Auth: rec.Auth(keyAuth(testKey)), Audit: rec,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(rec.Wrap(s.Handler()))
	defer ts.Close()

	want := map[string]string{} // route → target
	for _, rt := range s.routes() {
		if !audit.Mutating(rt.method) {
			continue
		}
		path := rt.path
		for name, v := range wildcardValues {
			path = strings.ReplaceAll(path, "{"+name+"}", v)
		}
		target := wildcardValues[wildcardOf(rt.path)]
		if strings.Contains(path, "{") {
			t.Fatalf("route %s: no value for a wildcard of it", rt.pattern())
		}
		req, _ := http.NewRequest(rt.method, ts.URL+path, strings.NewReader("{}"))
		req.Header.Set("X-API-Key", testKey)
		req.Header.Set("X-Request-Id", "req-"+rt.method)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", rt.pattern(), err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want[rt.pattern()] = target
	}
	if len(want) < 30 {
		t.Fatalf("only %d changing routes found; the walk is broken", len(want))
	}
	// A refused key, and two reads.
	for _, r := range []struct{ method, path, key string }{
		{"POST", "/v1/sandboxes/sbxaaaaaaaaaaaaaaaaa/stop", "wrong"},
		{"GET", "/v1/sandboxes", testKey},
		{"GET", "/v1/sandboxes/sbxaaaaaaaaaaaaaaaaa", testKey},
	} {
		req, _ := http.NewRequest(r.method, ts.URL+r.path, nil)
		req.Header.Set("X-API-Key", r.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	rec.Close() // writes what is queued

	entries, err := st.Audit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	keyID := store.KeyID(auth.Hash(testKey))
	seen := map[string]bool{}
	refused := 0
	for _, e := range entries {
		if !audit.Mutating(strings.Fields(e.Action)[0]) {
			t.Errorf("a read was recorded: %+v", e)
		}
		if e.KeyID != keyID {
			if e.Tenant != "" || e.KeyID != "" || e.Status != http.StatusUnauthorized || e.Target != "sbxaaaaaaaaaaaaaaaaa" {
				t.Errorf("entry of a refused key: %+v", e)
			}
			refused++
			continue
		}
		seen[e.Action] = true
		if e.Action == "POST /v1/sandboxes" && e.Status == http.StatusCreated && len(e.Target) != 20 {
			t.Errorf("a create's entry does not name the sandbox made: %+v", e)
		}
		// A create's target is what it made; the others' their path's.
		if e.Tenant != "default" || e.Source != "127.0.0.1" || e.Status < 200 || want[e.Action] != "" && e.Target != want[e.Action] ||
			e.RequestID != "req-"+strings.Fields(e.Action)[0] || e.At.IsZero() {
			t.Errorf("entry %+v: want tenant default, source 127.0.0.1, target %q", e, want[e.Action])
		}
	}
	for route := range want {
		if !seen[route] {
			t.Errorf("%s left no audit entry", route)
		}
	}
	if refused != 1 {
		t.Errorf("%d entries of a refused key, want 1", refused)
	}
}

// wildcardOf is the first wildcard's name in path.
func wildcardOf(path string) string {
	_, p, ok := strings.Cut(path, "{")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(p, "}")
	return name
}
