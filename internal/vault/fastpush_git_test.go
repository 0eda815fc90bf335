package vault_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestPushInProcessAsGit posts hand-made pushes that git receive-pack
// (receive.fsckObjects) refuses, each once to a bare copy's git and once
// to the server: none may be taken in-process unless git takes it, and
// the vault must clone after each (a ref that is a directory of another,
// or a name longer than a file, stored, would break every request). The
// pushes that make a new ref go through git too (atomic is git's): the
// hook refuses the same refs.
func TestPushInProcessAsGit(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	commitFile(t, a, "d/x.md", "x\n")
	base := commitFile(t, a, "a.md", "a\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	mktree := func(lines ...string) string { // "mode name oid", sorted
		var b bytes.Buffer
		for _, l := range lines {
			f := strings.Fields(l)
			id, _ := hex.DecodeString(f[2])
			b.WriteString(f[0] + " " + f[1] + "\x00")
			b.Write(id)
		}
		return hashObject(t, a, "tree", b.String())
	}
	who := "t <t@example.com> 1700000000 +0000"
	commit := func(tree, msg string, hdr ...string) string {
		h := "tree " + tree + "\nparent " + base + "\nauthor " + who + "\ncommitter " + who + "\n"
		if len(hdr) > 0 {
			h = "tree " + tree + "\nparent " + base + "\n" + hdr[0]
		}
		return hashObject(t, a, "commit", h+"\n"+msg)
	}
	tree := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD^{tree}"))
	blobA := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD:a.md"))
	treeD := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD:d"))
	blob := hashObject(t, a, "blob", "hello\n")
	gm := hashObject(t, a, "blob", "[submodule \"../../x\"]\n\tpath = x\n\turl = ./x\n")
	cases := []struct {
		name, new, ref string
		objs           []string
	}{}
	add := func(name, ref, c string, objs ...string) {
		cases = append(cases, struct {
			name, new, ref string
			objs           []string
		}{name, c, ref, append(objs, c)})
	}
	c := commit(tree, "x", "author <t@example.com> 1700000000 +0000\ncommitter "+who+"\n")
	add("author without a name", "refs/heads/main", c)
	add("NUL in the message", "refs/heads/main", commit(tree, "a\x00b\n"))
	add("tree is an existing blob", "refs/heads/main", commit(blobA, "x\n"))
	t1 := mktree("100644 a.md "+blobA, "100644 f.md "+treeD)
	add("blob entry naming an existing tree", "refs/heads/main", commit(t1, "x\n"), t1)
	t2 := mktree("100644 a.md "+blobA, "120000 gi7eba~1 "+blob)
	add("symlink gi7eba~1", "refs/heads/main", commit(t2, "x\n"), t2, blob)
	t3 := mktree("100644 a.md "+blobA, "40000 gi7eba~1 "+treeD)
	add("directory gi7eba~1", "refs/heads/main", commit(t3, "x\n"), t3)
	t4 := mktree("100644 GI7EBA~1 " + gm)
	add("bad .gitmodules as GI7EBA~1", "refs/heads/main", commit(t4, "x\n"), t4, gm)
	add("D/F: refs/heads/main/x", "refs/heads/main/x", commit(tree, "df\n"))
	add("a 300-byte ref component", "refs/heads/"+strings.Repeat("a", 300), commit(tree, "long\n"))

	for i, c := range cases {
		name := fmt.Sprintf("n%d", i)
		e.svc.Create(ctx, api.CreateVaultRequest{Name: name})
		mustGit(t, a, "push", "-q", e.url("acme-key", name), "HEAD:main")
		pack := packOf(t, a, c.objs...)
		old := base
		if c.ref != "refs/heads/main" {
			old = strings.Repeat("0", 40)
		}
		cmd := fmt.Sprintf("%s %s %s\x00report-status", old, c.new, c.ref)
		body := pushBody(cmd, pack)
		// git's own verdict, on a fresh bare copy.
		ref := filepath.Join(t.TempDir(), "ref.git")
		mustGit(t, a, "clone", "-q", "--bare", "--no-local", ".", ref)
		mustGit(t, ref, "config", "receive.fsckObjects", "true")
		gc := exec.Command("git", "receive-pack", "--stateless-rpc", ".")
		gc.Dir, gc.Stdin = ref, bytes.NewReader(body.Bytes())
		gout, _ := gc.CombinedOutput()
		gitOK := bytes.Contains(gout, []byte("ok "+c.ref))
		n := vault.InProcess(e.svc)
		_, resp := e.postPush("acme-key", name, body)
		fast := vault.InProcess(e.svc) > n
		t.Logf("%-36s git ok=%v  in-process=%v  answer=%q", c.name, gitOK, fast, resp)
		if fast && !gitOK {
			t.Errorf("%s: taken in-process, git refuses: %q", c.name, gout)
		}
		if out, err := git(t, filepath.Dir(a), "clone", "-q", e.url("acme-key", name), filepath.Join(t.TempDir(), "c")); err != nil {
			t.Errorf("%s: the vault no longer clones: %v %s", c.name, err, out)
		}
		if c.ref != "refs/heads/main" { // the same through git: atomic is left to git
			name := name + "g"
			e.svc.Create(ctx, api.CreateVaultRequest{Name: name})
			mustGit(t, a, "push", "-q", e.url("acme-key", name), "HEAD:main")
			cmd := fmt.Sprintf("%s %s %s\x00report-status atomic", strings.Repeat("0", 40), c.new, c.ref)
			body := pushBody(cmd, pack)
			_, resp := e.postPush("acme-key", name, body)
			if strings.Contains(resp, "ok "+c.ref) {
				t.Errorf("%s, through git: taken: %q", c.name, resp)
			}
			if out, err := git(t, filepath.Dir(a), "clone", "-q", e.url("acme-key", name), filepath.Join(t.TempDir(), "c")); err != nil {
				t.Errorf("%s, through git: the vault no longer clones: %v %s", c.name, err, out)
			}
		}
	}
}
