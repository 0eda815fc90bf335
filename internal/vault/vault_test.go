package vault_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/tenant"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
	"github.com/atoll-dev/atoll/internal/vault"
)

// env is a vault service on a real SQLite store and blob directory,
// served over HTTP with keys "admin-key" (the default tenant's, an
// admin's), "acme-key" and "other-key".
type env struct {
	t       testing.TB
	dir     string
	svc     *vault.Service
	srv     *httptest.Server
	blobDir string
	stopFn  func()
	maxPush int64
	pgURL   string // the store: PostgreSQL at pgURL if set, else SQLite
	blobURL string // the object store: a bucket's URL, default e.blobDir
	mounts  func(ctx context.Context, t, name string) (int, error)
	creds   vault.Minter    // Config.Credentials
	sbs     vault.Sandboxes // Config.Sandboxes
	st      vault.Store     // the store and the object store, while started
	blob    blob.Store
}

var keys = map[string]string{"admin-key": tenant.Default, "acme-key": "acme", "other-key": "other"}

func newEnv(t testing.TB) *env { return newEnvMax(t, 0) }

// newEnvMax is newEnv with Config.MaxPush maxPush.
func newEnvMax(t testing.TB, maxPush int64) *env {
	t.Helper()
	testenv.RequireCommand(t, "git")
	e := &env{t: t, dir: t.TempDir(), maxPush: maxPush}
	if usePostgres {
		e.pgURL = pgtest.NewURL(t, "vault")
	}
	e.blobURL = "file://" + filepath.Join(e.dir, "blob")
	if useS3 {
		// A prefix of the test's own in the test bucket.
		e.blobURL = testenv.S3URL(t) + "&prefix=" + filepath.Base(e.dir) + "-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "/"
	}
	e.blobDir = filepath.Join(e.dir, "blob")
	e.start()
	return e
}

// start opens the store, the blob directory and the service in e.dir:
// again after stop, it finds what was there.
func (e *env) start() {
	t := e.t
	var st interface {
		vault.Store
		Close() error
	}
	var err error
	if e.pgURL != "" {
		st, err = postgres.Open(context.Background(), e.pgURL)
	} else {
		st, err = sqlite.Open(filepath.Join(e.dir, "atoll.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := blob.Open(context.Background(), e.blobURL)
	if err != nil {
		t.Fatal(err)
	}
	e.st, e.blob = st, b
	e.svc, err = vault.New(vault.Config{Store: st, Blob: b, Dir: filepath.Join(e.dir, "vaults"), MaxPush: e.maxPush, Mounts: e.mounts, Credentials: e.creds, Sandboxes: e.sbs,
		Logger: slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	svc := e.svc
	mux := http.NewServeMux()
	mux.HandleFunc("/git/{repo}/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		_, key, _ := r.BasicAuth()
		tn, ok := keys[key]
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="atoll"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		name, ok := strings.CutSuffix(r.PathValue("repo"), ".git")
		if !ok {
			http.NotFound(w, r)
			return
		}
		svc.ServeGit(w, r.WithContext(tenant.NewContext(r.Context(), tn)), name, r.PathValue("rest"))
	})
	e.srv = httptest.NewServer(mux)
	stopped := false
	e.stopFn = func() {
		if !stopped {
			stopped = true
			e.srv.Close()
			svc.Close()
			b.Close()
			st.Close()
		}
	}
	t.Cleanup(e.stopFn)
}

func (e *env) stop() { e.stopFn() }

// restartWithoutCache stops the server, deletes its vault caches (as a
// lost disk would) and starts it again: vaults are made again from the
// store and the object store.
func (e *env) restartWithoutCache() {
	e.t.Helper()
	e.stop()
	if err := os.RemoveAll(filepath.Join(e.dir, "vaults")); err != nil {
		e.t.Fatal(err)
	}
	e.start()
}

// postPush posts body to vault name's receive-pack with key, as git
// would, and returns the answer's status code and body.
func (e *env) postPush(key, name string, body io.Reader) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+vault.GitPath(name)+"/git-receive-pack", body)
	req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
	req.SetBasicAuth("x", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// testWriter sends the service's log to the test's.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// ctx is a context of tenant t.
func ctxOf(t string) context.Context { return tenant.NewContext(context.Background(), t) }

// url is vault name's clone URL with key.
func (e *env) url(key, name string) string {
	return strings.Replace(e.srv.URL, "http://", "http://x:"+key+"@", 1) + vault.GitPath(name)
}

// git runs git in dir and returns its combined output and error.
func git(t testing.TB, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustGit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := git(t, dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// clone clones vault name with key into a new directory.
func (e *env) clone(key, name string) string {
	e.t.Helper()
	dir := filepath.Join(e.t.TempDir(), name)
	mustGit(e.t, filepath.Dir(dir), "clone", "-q", e.url(key, name), dir)
	return dir
}

// commitFile writes a file in the clone at dir and commits it.
func commitFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	mustGit(t, dir, "add", "-A")
	mustGit(t, dir, "commit", "-q", "-m", "write "+name)
	return strings.TrimSpace(mustGit(t, dir, "rev-parse", "HEAD"))
}

func TestCloneEmptyPushCloneElsewhere(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	a := e.clone("acme-key", "notes")
	head := commitFile(t, a, "people/ada.md", "# Ada\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")

	v, err := e.svc.Get(ctx, "notes")
	if err != nil || v.Head != head || v.Packs != 1 {
		t.Fatalf("after the push: %+v, %v; want head %s and one pack", v, err, head)
	}
	b := e.clone("acme-key", "notes")
	if got, _ := os.ReadFile(filepath.Join(b, "people/ada.md")); string(got) != "# Ada\n" {
		t.Errorf("the other clone reads %q", got)
	}
	// The pack is in the object store, under the vault's prefix.
	packs, _ := filepath.Glob(filepath.Join(e.blobDir, "vaults", "*", "packs", "pack-*.pack"))
	if len(packs) != 1 {
		t.Errorf("packs in the blob store: %v, want 1", packs)
	}
	got, err := e.svc.Show(ctx, "notes", "people/ada.md", "")
	if err != nil || string(got) != "# Ada\n" {
		t.Errorf("Show = %q, %v", got, err)
	}
	log, err := e.svc.Log(ctx, "notes", "", 0)
	if err != nil || len(log) != 1 || log[0].ID != head || log[0].Subject != "write people/ada.md" {
		t.Errorf("Log = %+v, %v", log, err)
	}
}

func TestSeededLayout(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	v, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Layout: api.VaultLayoutAgent})
	if err != nil || v.Head == "" {
		t.Fatalf("Create: %+v, %v", v, err)
	}
	dir := e.clone("acme-key", "mem")
	for _, f := range []string{"index.md", "entities/README.md", "workflows/README.md", "timeline/README.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the seeded clone lacks %s", f)
		}
	}
	// The seed went the way a push goes: its pack is in the object store.
	if v.Packs != 1 {
		t.Errorf("seeded vault has %d packs, want 1", v.Packs)
	}
	commitFile(t, dir, "timeline/2026/12/02.md", "# Wed\n")
	mustGit(t, dir, "push", "-q")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "x", Layout: "nope"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an unknown layout: %v, want invalid", err)
	}
}

func TestNames(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	for _, name := range []string{"", "a/b", "..", "a..b", "../etc", ".hidden", "-x", "x.git", "a b", strings.Repeat("a", 65), "a\x00b", "é"} {
		if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: name}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%q): %v, want invalid", name, err)
		}
	}
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second vault of one name: %v, want conflict", err)
	}
	// Another tenant's vault name is not found, over the API and git.
	if _, err := e.svc.Get(ctxOf("other"), "notes"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's Get: %v, want not found", err)
	}
	out, err := git(t, t.TempDir(), "clone", e.url("other-key", "notes"), "c")
	if err == nil || !strings.Contains(out, "not found") {
		t.Errorf("another tenant's clone: %v\n%s", err, out)
	}
	out, err = git(t, t.TempDir(), "clone", e.url("wrong-key", "notes"), "c")
	if err == nil || !strings.Contains(out, "Authentication failed") {
		t.Errorf("a wrong key's clone: %v\n%s", err, out)
	}
}

func TestAppendOnly(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes", AllowRewrite: true})
	a := e.clone("acme-key", "notes")
	first := commitFile(t, a, "a.md", "a\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	b := e.clone("acme-key", "notes")

	// Concurrent work: a pushes first, b's push is not a fast-forward.
	second := commitFile(t, a, "a.md", "a2\n")
	mustGit(t, a, "push", "-q")
	commitFile(t, b, "b.md", "b\n")
	if out, err := git(t, b, "push"); err == nil || !strings.Contains(out, "rejected") {
		t.Errorf("a non-fast-forward push: %v\n%s", err, out)
	}
	// Forced, it is refused by the server (an acme key is no admin's).
	out, err := git(t, b, "push", "--force")
	if err == nil || !strings.Contains(out, "append-only") {
		t.Errorf("a force-push: %v\n%s", err, out)
	}
	out, err = git(t, a, "push", "origin", ":main")
	if err == nil || !strings.Contains(out, "append-only") {
		t.Errorf("a ref deletion: %v\n%s", err, out)
	}
	mustGit(t, a, "tag", "v1", first)
	mustGit(t, a, "push", "-q", "origin", "v1")
	mustGit(t, a, "tag", "-f", "v1", second)
	if out, err := git(t, a, "push", "--force", "origin", "v1"); err == nil || !strings.Contains(out, "append-only") {
		t.Errorf("moving a tag: %v\n%s", err, out)
	}
	v, _ := e.svc.Get(ctx, "notes")
	if v.Head != second || v.Refs["refs/tags/v1"] != first {
		t.Errorf("after the refused pushes: %+v", v)
	}
	// b pulls, merges and pushes: that works.
	mustGit(t, b, "pull", "-q", "--no-rebase", "--no-edit")
	mustGit(t, b, "push", "-q")
}

func TestAdminRewrite(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf(tenant.Default)
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "rw", AllowRewrite: true})
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "ro"})
	for _, name := range []string{"rw", "ro"} {
		a := e.clone("admin-key", name)
		commitFile(t, a, "a.md", "a\n")
		mustGit(t, a, "push", "-q", "origin", "HEAD:main")
		commitFile(t, a, "b.md", "b\n")
		mustGit(t, a, "push", "-q")
		mustGit(t, a, "reset", "-q", "--hard", "HEAD~1")
		out, err := git(t, a, "push", "--force")
		if name == "rw" && err != nil {
			t.Errorf("an admin's force-push to an --allow-rewrite vault: %v\n%s", err, out)
		}
		if name == "ro" && (err == nil || !strings.Contains(out, "append-only")) {
			t.Errorf("an admin's force-push to a vault without --allow-rewrite: %v\n%s", err, out)
		}
	}
}

func TestRestartAndLostCache(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	var heads []string
	for i := range 3 {
		heads = append(heads, commitFile(t, a, fmt.Sprintf("n%d.md", i), "x\n"))
		mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	}
	// The cache is gone: the vault is rebuilt from the object store and
	// the store.
	e.restartWithoutCache()
	b := e.clone("acme-key", "notes")
	if got := strings.TrimSpace(mustGit(t, b, "rev-parse", "HEAD")); got != heads[2] {
		t.Errorf("after a restart without the cache, HEAD is %s, want %s", got, heads[2])
	}
	mustGit(t, b, "fsck", "--strict")
	commitFile(t, a, "n3.md", "x\n")
	mustGit(t, a, "remote", "set-url", "origin", e.url("acme-key", "notes"))
	mustGit(t, a, "push", "-q")
}

func TestDelete(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	if err := e.svc.Delete(ctxOf("other"), "notes", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's Delete: %v, want not found", err)
	}
	// While sandboxes mount it, only a forced delete removes it.
	e.stop()
	e.mounts = func(_ context.Context, tn, name string) (int, error) {
		if tn == "acme" && name == "notes" {
			return 2, nil
		}
		return 0, nil
	}
	e.start()
	if err := e.svc.Delete(ctx, "notes", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting a mounted vault: %v, want conflict", err)
	}
	if err := e.svc.Delete(ctx, "notes", true); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.blobDir, "vaults", "*", "packs", "*")); len(left) != 0 {
		t.Errorf("objects left after Delete: %v", left)
	}
	if _, err := e.svc.Get(ctx, "notes"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete: %v", err)
	}
	// Made again, the name starts empty.
	v, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	if err != nil || v.Head != "" {
		t.Errorf("made again: %+v, %v", v, err)
	}
}

// A cache whose ref is behind the store's (a crash after the store's
// commit, before git moved its own ref) is brought up to the store before
// the next request; so is one whose pack is missing.
func TestCacheBehindStore(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	first := commitFile(t, a, "a.md", "1\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	second := commitFile(t, a, "a.md", "2\n")
	mustGit(t, a, "push", "-q")
	caches, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git"))
	if len(caches) != 1 {
		t.Fatalf("caches: %v", caches)
	}
	mustGit(t, caches[0], "update-ref", "refs/heads/main", first)
	packs, _ := filepath.Glob(filepath.Join(caches[0], "objects", "pack", "pack-*"))
	for _, p := range packs {
		os.Remove(p)
	}
	b := e.clone("acme-key", "notes")
	if got := strings.TrimSpace(mustGit(t, b, "rev-parse", "HEAD")); got != second {
		t.Errorf("a clone from a cache behind the store is at %s, want %s", got, second)
	}
	mustGit(t, b, "fsck", "--strict")
}

// The stock client speaks protocol v2 with the server (git http-backend
// is given the client's Git-Protocol header).
func TestProtocolV2(t *testing.T) {
	e := newEnv(t)
	e.svc.Create(ctxOf("acme"), api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	dir := t.TempDir()
	cmd := exec.Command("git", "-c", "protocol.version=2", "clone", "-q", e.url("acme-key", "notes"), "c")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TRACE_PACKET=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version 2") {
		t.Errorf("clone: %v; want protocol version 2 in the trace:\n%.2000s", err, out)
	}
}

// Pushes racing from one base: one wins, the others are refused as git
// refuses a non-fast-forward, and the vault is one of the pushed commits.
func TestConcurrentPushes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	const n = 6
	heads := map[string]bool{}
	var clones []string
	for i := range n {
		c := e.clone("acme-key", "notes")
		heads[commitFile(t, c, fmt.Sprintf("c%d.md", i), "x\n")] = true
		clones = append(clones, c)
	}
	errs := make(chan error, n)
	for _, c := range clones {
		go func() {
			out, err := git(t, c, "push", "origin", "HEAD:main")
			if err != nil && !strings.Contains(out, "rejected") && !strings.Contains(out, "moved meanwhile") {
				err = fmt.Errorf("%v: %s", err, out)
			} else if err != nil {
				err = errRefused
			}
			errs <- err
		}()
	}
	won := 0
	for range n {
		switch err := <-errs; err {
		case nil:
			won++
		case errRefused:
		default:
			t.Errorf("a racing push failed otherwise: %v", err)
		}
	}
	v, _ := e.svc.Get(ctx, "notes")
	if won != 1 || !heads[v.Head] {
		t.Errorf("%d racing pushes won, head %s; want 1, one of the pushed", won, v.Head)
	}
	mustGit(t, e.clone("acme-key", "notes"), "fsck", "--strict")
}

var errRefused = errors.New("refused")

// A crash after the store's commit, before git moved its ref and answered:
// the push is stored though the client was told it failed; the cache
// catches up, and the client's retry finds it there.
func TestStoredNotAcknowledged(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	commitFile(t, a, "a.md", "1\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	head := commitFile(t, a, "a.md", "2\n")
	vault.SetAfterCommit(e.svc, func() error { return errors.New("crash") })
	if out, err := git(t, a, "push", "origin", "HEAD:main"); err == nil {
		t.Fatalf("the push was acknowledged:\n%s", out)
	}
	vault.SetAfterCommit(e.svc, nil)
	if v, _ := e.svc.Get(ctx, "notes"); v.Head != head {
		t.Errorf("the store's head is %s, want the committed %s", v.Head, head)
	}
	b := e.clone("acme-key", "notes")
	if got := strings.TrimSpace(mustGit(t, b, "rev-parse", "HEAD")); got != head {
		t.Errorf("a clone after the crash is at %s, want %s", got, head)
	}
	mustGit(t, b, "fsck", "--strict")
	out := mustGit(t, a, "push", "origin", "HEAD:main")
	if !strings.Contains(out, "up-to-date") {
		t.Errorf("the retried push: %s, want up-to-date", out)
	}
}

// usePostgres makes newEnv's stores PostgreSQL ones (TestPostgres).
var usePostgres bool

// TestPostgres runs the vault tests on the PostgreSQL store, the
// cluster's: the same promises hold.
func TestPostgres(t *testing.T) {
	pgtest.URL(t)
	usePostgres = true
	defer func() { usePostgres = false }()
	for name, test := range map[string]func(*testing.T){
		"CloneEmptyPushCloneElsewhere": TestCloneEmptyPushCloneElsewhere,
		"SeededLayout":                 TestSeededLayout,
		"AppendOnly":                   TestAppendOnly,
		"RestartAndLostCache":          TestRestartAndLostCache,
		"ConcurrentPushes":             TestConcurrentPushes,
		"StoredNotAcknowledged":        TestStoredNotAcknowledged,
		"Delete":                       TestDelete,
		"SearchAfterPush":              TestSearchAfterPush,
		"IndexUpdatedAsBuiltAnew":      TestIndexUpdatedAsBuiltAnew,
		"Compact":                      TestCompact,
		"Schedule":                     TestSchedule,
		"CompactCommandSummarizer":     TestCompactCommandSummarizer,
		"PushInProcess":                TestPushInProcess,
		"PackConsolidation":            TestPackConsolidation,
	} {
		t.Run(name, test)
	}
}

// useS3 makes newEnv's object stores S3 ones (TestS3).
var useS3 bool

// TestS3 runs the vault tests with the packs in S3, as in production.
func TestS3(t *testing.T) {
	testenv.S3URL(t)
	useS3 = true
	defer func() { useS3 = false }()
	for name, test := range map[string]func(*testing.T){
		"SeededLayout":          TestSeededLayout,
		"AppendOnly":            TestAppendOnly,
		"RestartAndLostCache":   TestRestartAndLostCache,
		"CacheBehindStore":      TestCacheBehindStore,
		"ConcurrentPushes":      TestConcurrentPushes,
		"StoredNotAcknowledged": TestStoredNotAcknowledged,
		"PushInProcess":         TestPushInProcess,
	} {
		t.Run(name, test)
	}
}
