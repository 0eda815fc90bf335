package vault_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/vault"
)

func hitPaths(s api.VaultSearch) []string {
	var out []string
	for _, h := range s.Hits {
		out = append(out, h.Path)
	}
	return out
}

// After a push, a search sees it: the new note, its title from the
// frontmatter, a snippet around the match, the better match first.
func TestSearchAfterPush(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	commitFile(t, dir, "entities/ada.md", "---\ntitle: Ada Lovelace\ntype: person\ntags: [math, engines]\nupdated: 2026-12-02\n---\n# Ada\n\nWrote the first program for the analytical engine.\n")
	commitFile(t, dir, "entities/babbage.md", "---\ntitle: Charles Babbage\ntags:\n  - engines\n  - \"math\"\n---\nDesigned the engine; Ada wrote its notes. Met [[Ada Lovelace]].\n")
	head := commitFile(t, dir, "notes/misc.md", "nothing about anyone\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")

	got, err := e.svc.Search(ctx, "mem", "lovelace", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Commit != head || len(got.Hits) != 2 {
		t.Fatalf("search lovelace: %+v, want 2 hits at %s", got, head)
	}
	// The title matches weigh more than the body's.
	want := api.VaultNote{Path: "entities/ada.md", Title: "Ada Lovelace", Type: "person", Tags: []string{"math", "engines"}, Updated: "2026-12-02"}
	if diff := cmp.Diff(want, got.Hits[0].VaultNote); diff != "" {
		t.Errorf("the first hit (-want +got):\n%s", diff)
	}
	if got.Hits[0].Score <= got.Hits[1].Score || got.Hits[1].Path != "entities/babbage.md" {
		t.Errorf("hits out of order: %+v", got.Hits)
	}
	if got.Hits[1].Tags == nil || got.Hits[1].Tags[1] != "math" {
		t.Errorf("block-list tags: %+v", got.Hits[1].Tags)
	}
	got, err = e.svc.Search(ctx, "mem", "program", 0)
	if err != nil || len(got.Hits) != 1 || !strings.Contains(got.Hits[0].Snippet, "**program**") {
		t.Errorf("search program: %+v, %v; want one hit with the match marked", got, err)
	}
	// Stemmed, prefixed, phrases; nothing of the frontmatter's keys.
	for q, want := range map[string][]string{
		"engines":          {"entities/babbage.md", "entities/ada.md"},
		"programs":         {"entities/ada.md"},
		"lovel*":           {"entities/ada.md", "entities/babbage.md"},
		`"first program"`:  {"entities/ada.md"},
		"title:babbage":    {"entities/babbage.md"},
		"updated":          nil,
		"nobody":           nil,
		"anyone OR nobody": {"notes/misc.md"},
	} {
		got, err := e.svc.Search(ctx, "mem", q, 0)
		if err != nil {
			t.Errorf("search %q: %v", q, err)
			continue
		}
		if diff := cmp.Diff(want, hitPaths(got)); diff != "" && q != "engines" {
			t.Errorf("search %q (-want +got):\n%s", q, diff)
		} else if q == "engines" && len(got.Hits) != 2 {
			t.Errorf("search engines: %v", hitPaths(got))
		}
	}
	// An edit is seen by the next search.
	commitFile(t, dir, "notes/misc.md", "now about Lovelace too\n")
	mustGit(t, dir, "push", "-q")
	if got, _ := e.svc.Search(ctx, "mem", "lovelace", 0); len(got.Hits) != 3 {
		t.Errorf("after the edit: %v, want 3 hits", hitPaths(got))
	}
	if got, _ := e.svc.Search(ctx, "mem", "lovelace", 1); len(got.Hits) != 1 {
		t.Errorf("limit 1: %v", hitPaths(got))
	}
}

func TestLinks(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	commitFile(t, dir, "entities/ada.md", "---\ntitle: Ada Lovelace\n---\nSee [[babbage]] and [[Nobody]].\n")
	commitFile(t, dir, "entities/babbage.md", "Met [[Ada Lovelace|Ada]] and [[entities/ada.md#Life]], wrote [[notes/engine]].\n```\n[[not a link]]\n```\n")
	commitFile(t, dir, "notes/engine.md", "[[ada lovelace]] [[Babbage]] [[Babbage]]\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")

	l, err := e.svc.Links(ctx, "mem", "entities/ada.md")
	if err != nil {
		t.Fatal(err)
	}
	want := api.VaultLinks{Commit: l.Commit,
		Note: &api.VaultNote{Path: "entities/ada.md", Title: "Ada Lovelace"},
		Links: []api.VaultLink{
			{From: "entities/ada.md", Target: "babbage", To: "entities/babbage.md"},
			{From: "entities/ada.md", Target: "Nobody"},
		},
		Backlinks: []api.VaultLink{
			{From: "entities/babbage.md", Target: "Ada Lovelace", To: "entities/ada.md"},
			{From: "entities/babbage.md", Target: "entities/ada.md", To: "entities/ada.md"},
			{From: "notes/engine.md", Target: "ada lovelace", To: "entities/ada.md"},
		},
	}
	if diff := cmp.Diff(want, l); diff != "" {
		t.Errorf("links of ada (-want +got):\n%s", diff)
	}
	l, err = e.svc.Links(ctx, "mem", "")
	if err != nil || !cmp.Equal(l.Broken, []api.VaultLink{{From: "entities/ada.md", Target: "Nobody"}}) {
		t.Errorf("broken links: %+v, %v", l.Broken, err)
	}

	// A rename: ada.md moves, keeping its title, so [[Ada Lovelace]]
	// follows it, while the link by path breaks; babbage.md moves under a
	// new name and [[babbage]] breaks.
	os.Mkdir(filepath.Join(dir, "people"), 0o755)
	mustGit(t, dir, "mv", "entities/ada.md", "people/ada-l.md")
	mustGit(t, dir, "mv", "entities/babbage.md", "people/charles.md")
	mustGit(t, dir, "commit", "-q", "-m", "rename")
	mustGit(t, dir, "push", "-q")
	l, err = e.svc.Links(ctx, "mem", "people/ada-l.md")
	if err != nil {
		t.Fatal(err)
	}
	wantBack := []api.VaultLink{
		{From: "notes/engine.md", Target: "ada lovelace", To: "people/ada-l.md"},
		{From: "people/charles.md", Target: "Ada Lovelace", To: "people/ada-l.md"},
	}
	if diff := cmp.Diff(wantBack, l.Backlinks); diff != "" {
		t.Errorf("backlinks after the rename (-want +got):\n%s", diff)
	}
	l, _ = e.svc.Links(ctx, "mem", "")
	wantBroken := []api.VaultLink{
		{From: "notes/engine.md", Target: "Babbage"},
		{From: "people/ada-l.md", Target: "Nobody"},
		{From: "people/ada-l.md", Target: "babbage"},
		{From: "people/charles.md", Target: "entities/ada.md"},
	}
	if diff := cmp.Diff(wantBroken, l.Broken); diff != "" {
		t.Errorf("broken links after the rename (-want +got):\n%s", diff)
	}
	if _, err := e.svc.Links(ctx, "mem", "entities/ada.md"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("links of a renamed-away note: %v, want not found", err)
	}
	// An edit fixes a link.
	commitFile(t, dir, "notes/engine.md", "[[ada lovelace]] [[people/charles]]\n")
	mustGit(t, dir, "push", "-q")
	l, _ = e.svc.Links(ctx, "mem", "people/charles.md")
	if len(l.Backlinks) != 1 || l.Backlinks[0].From != "notes/engine.md" {
		t.Errorf("backlinks of charles after the fix: %+v", l.Backlinks)
	}
}

// Queries FTS5 cannot parse, too long or empty are invalid, never a
// server error; another tenant's vault is not found.
func TestSearchHostile(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Layout: api.VaultLayoutAgent})
	for _, q := range []string{`"unbalanced`, `NEAR(`, `NEAR(a b`, `a AND`, `)`, `*`, `nocolumn:x`, `AND OR NOT`, "", "   ",
		strings.Repeat("a ", 600), strings.Repeat("(", 2000), strings.Repeat("(", 990) + "a", strings.Repeat("a OR ", 199) + "(", "a\x00b", "\xff\xfe"} {
		if _, err := e.svc.Search(ctx, "mem", q, 0); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("search %.40q: %v, want invalid", q, err)
		}
	}
	// A query that parses but matches nothing, with SQL in it, is only text.
	if got, err := e.svc.Search(ctx, "mem", `"'; DROP TABLE notes; --"`, 0); err != nil || len(got.Hits) != 0 {
		t.Errorf("an SQL-looking phrase: %+v, %v", got, err)
	}
	if got, err := e.svc.Search(ctx, "mem", "memory", 0); err != nil || len(got.Hits) == 0 {
		t.Errorf("the index survives the hostile queries: %+v, %v", got, err)
	}
	if _, err := e.svc.Search(ctxOf("other"), "mem", "memory", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's search: %v, want not found", err)
	}
	if _, err := e.svc.Links(ctxOf("other"), "mem", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's links: %v, want not found", err)
	}
	for _, p := range []string{"../etc/passwd", "/etc/passwd", "a//b"} {
		if _, err := e.svc.Links(ctx, "mem", p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("links of %q: %v, want invalid", p, err)
		}
	}
	// An empty vault has nothing to find.
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "empty"})
	if got, err := e.svc.Search(ctx, "empty", "x", 0); err != nil || len(got.Hits) != 0 || got.Commit != "" {
		t.Errorf("search of an empty vault: %+v, %v", got, err)
	}
}

// Symlinks, non-Markdown files and big notes: only regular *.md files are
// indexed, each up to vault.MaxIndexedNote bytes.
func TestIndexWhatIsIndexed(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	commitFile(t, dir, "a.txt", "zebra\n")
	os.Symlink("/etc/passwd", filepath.Join(dir, "link.md"))
	big := "zebra " + strings.Repeat("filler ", 300_000) + " quokka\n" // > 1 MiB: quokka is past the cap
	commitFile(t, dir, "big.md", big)
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	if got, err := e.svc.Search(ctx, "mem", "zebra", 0); err != nil || !cmp.Equal(hitPaths(got), []string{"big.md"}) {
		t.Errorf("zebra: %v, %v; want big.md only", hitPaths(got), err)
	}
	if got, _ := e.svc.Search(ctx, "mem", "quokka", 0); len(got.Hits) != 0 {
		t.Errorf("a word past the cap was indexed: %v", hitPaths(got))
	}
	if got, _ := e.svc.Search(ctx, "mem", "root", 0); len(got.Hits) != 0 {
		t.Errorf("a symlink was followed: %v", hitPaths(got))
	}
}

// The index is derived: with the cache gone, and the service restarted,
// a search builds it again from the stores.
func TestIndexRebuiltWithoutCache(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	commitFile(t, dir, "ada.md", "analytical engine\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	if got, err := e.svc.Search(ctx, "mem", "engine", 0); err != nil || len(got.Hits) != 1 {
		t.Fatalf("before: %+v, %v", got, err)
	}
	idx, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git", "atoll-index.db"))
	if len(idx) != 1 {
		t.Fatalf("index files: %v, want 1", idx)
	}
	e.stop()
	// A restart with the index in place reuses it (same commit).
	e.start()
	if got, err := e.svc.Search(ctx, "mem", "engine", 0); err != nil || len(got.Hits) != 1 {
		t.Errorf("after a restart: %+v, %v", got, err)
	}
	// A garbled index file is built anew, and so is a later one, from it.
	e.stop()
	if err := os.WriteFile(idx[0], []byte("SQLite format 3\x00garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got, err := e.svc.Search(ctx, "mem", "engine", 0); err != nil || len(got.Hits) != 1 {
		t.Errorf("after the index file was garbled: %+v, %v", got, err)
	}
	commitFile(t, dir, "b.md", "difference engine\n")
	mustGit(t, dir, "push", "-q", e.url("acme-key", "mem"), "HEAD:main")
	if got, err := e.svc.Search(ctx, "mem", "engine", 0); err != nil || len(got.Hits) != 2 {
		t.Errorf("the push after: %+v, %v", got, err)
	}
	e.restartWithoutCache()
	if got, err := e.svc.Search(ctx, "mem", "analytical", 0); err != nil || len(got.Hits) != 1 || got.Hits[0].Path != "ada.md" {
		t.Errorf("after the cache was deleted: %+v, %v", got, err)
	}
	if idx, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git", "atoll-index.db")); len(idx) != 1 {
		t.Errorf("index files after the rebuild: %v", idx)
	}
	// Deleting the vault drops its index with it.
	if err := e.svc.Delete(ctx, "mem", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Search(ctx, "mem", "engine", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("search of a deleted vault: %v", err)
	}
}

// The index follows pushes by changing the rows of the files that
// changed; after a series of edits, deletions, renames and a note turned
// symlink, it answers as an index built anew from the last commit does.
func TestIndexUpdatedAsBuiltAnew(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Layout: api.VaultLayoutAgent})
	dir := e.clone("acme-key", "mem")
	steps := []func(){
		func() {
			commitFile(t, dir, "entities/ada.md", "---\ntitle: Ada Lovelace\n---\nengine notes, see [[Babbage]] and [[index]]\n")
			commitFile(t, dir, "entities/babbage.md", "engine designer, knew [[Ada Lovelace]]\n")
		},
		func() {
			commitFile(t, dir, "entities/ada.md", "---\ntitle: Countess\n---\nengine poetry, see [[Babbage]]\n")
		},
		func() {
			os.Mkdir(filepath.Join(dir, "people"), 0o755)
			mustGit(t, dir, "mv", "entities/babbage.md", "people/babbage.md")
			mustGit(t, dir, "commit", "-q", "-m", "mv")
		},
		func() {
			os.Remove(filepath.Join(dir, "people/babbage.md"))
			os.Symlink("../entities/ada.md", filepath.Join(dir, "people/babbage.md"))
			commitFile(t, dir, "timeline/2026/12/02.md", "met [[Countess]] about the engine\n")
		},
		func() {
			os.Remove(filepath.Join(dir, "index.md"))
			commitFile(t, dir, "notes.txt", "engine\n")
		},
	}
	type answer struct {
		Search api.VaultSearch
		Links  []api.VaultLinks
	}
	ask := func() answer {
		var a answer
		var err error
		if a.Search, err = e.svc.Search(ctx, "mem", "engine OR countess OR babbage", 0); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"", "entities/ada.md", "timeline/2026/12/02.md"} {
			l, err := e.svc.Links(ctx, "mem", p)
			if errors.Is(err, errdefs.ErrNotFound) {
				l = api.VaultLinks{Commit: "none"}
			} else if err != nil {
				t.Fatalf("links %q: %v", p, err)
			}
			a.Links = append(a.Links, l)
		}
		return a
	}
	for _, step := range steps {
		step()
		mustGit(t, dir, "push", "-q")
		ask() // the index of this push, made from the last one's
	}
	updated := ask()
	if want := []string{"entities/ada.md", "timeline/2026/12/02.md", "entities/README.md"}; !cmp.Equal(hitPaths(updated.Search), want) {
		t.Errorf("hits after the steps: %v, want %v", hitPaths(updated.Search), want)
	}
	e.stop()
	idx, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git", "atoll-index.db"))
	if len(idx) != 1 || os.Remove(idx[0]) != nil {
		t.Fatalf("index files: %v", idx)
	}
	e.start()
	anew := ask()
	// Scores depend on how FTS5 merged its segments: compared rounded.
	round := cmp.Transformer("round", func(f float64) float64 { return float64(int64(f*1e6)) / 1e6 })
	if diff := cmp.Diff(anew, updated, round); diff != "" {
		t.Errorf("the updated index differs from one built anew (-anew +updated):\n%s", diff)
	}
}

// Two nodes of a cluster share the stores and keep caches of their own: a
// search through one, right after a push through the other, sees the push
// (its index built from the durable truth).
func TestSearchOtherNode(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	st, err := sqlite.Open(filepath.Join(e.dir, "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := blob.Open(context.Background(), e.blobURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	other, err := vault.New(vault.Config{Store: st, Blob: b, Dir: filepath.Join(t.TempDir(), "node2")})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dir := e.clone("acme-key", "mem")
	for i, word := range []string{"aardvark", "bonobo", "capybara"} {
		commitFile(t, dir, "n.md", "about the "+word+"\n")
		if i == 0 {
			mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
		} else {
			mustGit(t, dir, "push", "-q")
		}
		got, err := other.Search(ctx, "mem", word, 0)
		if err != nil || len(got.Hits) != 1 {
			t.Errorf("the other node's search of %s: %+v, %v", word, got, err)
		}
	}
}
