package vault_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestPushInProcess checks that the common pushes (the first, then
// commits that edit, add and nest files, which git sends as thin packs)
// are taken in-process, and that what they leave is what git would: the
// store's head, a cache git fsck passes, a clone elsewhere that reads the
// files, and the same after the cache is lost. The pushes it must leave
// to git (a .gitmodules file, a tag, a deletion, a non-fast-forward, a
// branch made at an existing commit) still end as git decides.
func TestPushInProcess(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	a := e.clone("acme-key", "notes")
	want := map[string]string{}
	write := func(name, content string) string {
		want[name] = content
		return commitFile(t, a, name, content)
	}
	fast := func(what string, n int64) {
		t.Helper()
		if got := vault.InProcess(e.svc); got != n {
			t.Errorf("after %s: %d pushes taken in-process, want %d", what, got, n)
		}
	}
	head := write("index.md", strings.Repeat("# Index\nsome text that deltas well\n", 50))
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	fast("the first push", 1)
	for i := range 5 {
		head = write("index.md", want["index.md"]+fmt.Sprintf("line %d\n", i))
		write(fmt.Sprintf("timeline/2026/12/%02d.md", i+1), "entry\n")
		if i == 0 {
			write(".gitignore", "*.tmp\n")
		}
		mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	}
	fast("5 pushes that edit and add, a .gitignore among them", 6)
	// Two commits in one push, one of them a merge of a side branch.
	mustGit(t, a, "checkout", "-q", "-b", "side")
	write("side.md", "side\n")
	mustGit(t, a, "checkout", "-q", "main")
	write("main.md", "main\n")
	mustGit(t, a, "merge", "-q", "--no-edit", "side")
	head = strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD"))
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	fast("a push with a merge", 7)
	// A new branch with a new commit.
	mustGit(t, a, "checkout", "-q", "-b", "topic")
	commitFile(t, a, "topic.md", "t\n")
	mustGit(t, a, "push", "-q", "origin", "topic")
	mustGit(t, a, "checkout", "-q", "main")
	fast("a new branch", 8)

	v, err := e.svc.Get(ctx, "notes")
	if err != nil || v.Head != head {
		t.Fatalf("the store's head: %+v, %v; want %s", v, err, head)
	}
	check := func(dir string) {
		t.Helper()
		mustGit(t, dir, "fsck", "--strict")
		for name, content := range want {
			if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != content {
				t.Errorf("%s reads %.40q, %v", name, got, err)
			}
		}
	}
	check(e.clone("acme-key", "notes"))
	cache, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git"))
	for _, c := range cache {
		mustGit(t, c, "fsck", "--strict")
	}
	if len(cache) == 0 {
		t.Error("no cache repository to check")
	}

	// Left to git: each push below is not taken in-process.
	n := vault.InProcess(e.svc)
	mustGit(t, a, "checkout", "-q", "-b", "sub")
	commitFile(t, a, ".gitmodules", "[submodule \"x\"]\n\tpath = x\n\turl = ./x\n")
	mustGit(t, a, "push", "-q", "origin", "sub")
	mustGit(t, a, "checkout", "-q", "main")
	mustGit(t, a, "tag", "v1")
	mustGit(t, a, "push", "-q", "origin", "v1")
	mustGit(t, a, "push", "-q", "origin", "main:other") // an existing commit
	if out, err := git(t, a, "push", "origin", ":other"); err == nil {
		t.Errorf("a deletion was taken:\n%s", out)
	}
	mustGit(t, a, "reset", "-q", "--hard", "HEAD~1")
	write("diverged.md", "x\n")
	delete(want, "diverged.md")
	if out, err := git(t, a, "push", "origin", "HEAD:main"); err == nil {
		t.Errorf("a non-fast-forward push was taken:\n%s", out)
	}
	fast("the pushes left to git", n)
	mustGit(t, a, "reset", "-q", "--hard", "origin/main")

	// The cache lost: made again from the store, the packs written
	// in-process among them.
	e.restartWithoutCache()
	b := e.clone("acme-key", "notes")
	check(b)
	mustGit(t, b, "fetch", "-q", "origin", "topic")
	write("after.md", "after restart\n")
	mustGit(t, a, "remote", "set-url", "origin", e.url("acme-key", "notes"))
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	if got := vault.InProcess(e.svc); got != 1 {
		t.Errorf("the push after a restart without the cache: %d taken in-process, want 1", got)
	}
	check(e.clone("acme-key", "notes"))
}

// TestPushInProcessIncomplete posts, by hand, pushes whose packs parse but
// leave something out (a commit's tree, its parent, the pushed commit
// itself) or carry what git's fsck refuses: none is taken in-process, and
// git, which then decides, refuses each; the vault does not move.
func TestPushInProcessIncomplete(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	base := commitFile(t, a, "a.md", "a\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	n := vault.InProcess(e.svc)
	who := "t <t@example.com> 1700000000 +0000"
	missing := strings.Repeat("ab", 20)
	tree := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD^{tree}"))
	noTree := hashObject(t, a, "commit", "tree "+missing+"\nparent "+base+"\nauthor "+who+"\ncommitter "+who+"\n\nno tree\n")
	noParent := hashObject(t, a, "commit", "tree "+tree+"\nparent "+missing+"\nauthor "+who+"\ncommitter "+who+"\n\nno parent\n")
	badIdent := hashObject(t, a, "commit", "tree "+tree+"\nparent "+base+"\nauthor nobody\ncommitter "+who+"\n\nbad author\n")
	good := hashObject(t, a, "commit", "tree "+tree+"\nparent "+base+"\nauthor "+who+"\ncommitter "+who+"\n\ngood\n")
	for _, c := range []struct {
		name, new string
		pack      []byte
	}{
		{"a commit without its tree", noTree, packOf(t, a, noTree)},
		{"a commit without its parent", noParent, packOf(t, a, noParent)},
		{"a commit with a bad author", badIdent, packOf(t, a, badIdent)},
		{"a branch at a commit the pack does not carry", good, packOf(t, a, noTree)},
	} {
		cmd := fmt.Sprintf("%s %s refs/heads/main\x00report-status side-band-64k", base, c.new)
		body := pushBody(cmd, c.pack)
		code, b := e.postPush("acme-key", "notes", body)
		if code >= 500 || strings.Contains(b, "ok refs/heads/main") {
			t.Errorf("%s: %d %q, want refused", c.name, code, b)
		}
		if v, _ := e.svc.Get(ctx, "notes"); v.Head != base {
			t.Errorf("%s: the vault's head moved to %s", c.name, v.Head)
		}
	}
	if got := vault.InProcess(e.svc); got != n {
		t.Errorf("%d of the incomplete pushes taken in-process", got-n)
	}
	mustGit(t, e.clone("acme-key", "notes"), "fsck", "--strict")
}

// hashObject writes an object of type typ holding content to the
// repository at dir, as it is (git checks nothing), and returns its name.
func hashObject(t *testing.T, dir, typ, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "obj")
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(mustGit(t, dir, "hash-object", "-w", "--literally", "-t", typ, f))
}

// packOf is a pack of the objects ids of the repository at dir, as git
// pack-objects makes it.
func packOf(t *testing.T, dir string, ids ...string) []byte {
	t.Helper()
	cmd := exec.Command("git", "pack-objects", "--stdout", "-q")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(strings.Join(ids, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pushBody is a push request's body: command (its first line, with its
// capabilities), a flush, then pack.
func pushBody(command string, pack []byte) *bytes.Buffer {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%04x%s0000", len(command)+4, command)
	b.Write(pack)
	return &b
}
