package vault_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestLayers makes the layers of two commits of a vault, the second from
// the first (its files linked, the changed ones written), and checks
// each is a clean clone of its commit, owned by the sandbox's user, and
// that the second is what a layer made whole is.
func TestLayers(t *testing.T) {
	testenv.RequireRoot(t) // files of uid 1000, an overlay mounted
	e := newEnv(t)
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	a := e.clone("acme-key", "notes")
	for name, body := range map[string]string{"a.md": "# A\n", "dir/b.md": "b\n", "deep/x/y.md": "y\n", "keep/k.md": "k\n"} {
		os.MkdirAll(filepath.Join(a, filepath.Dir(name)), 0o755)
		os.WriteFile(filepath.Join(a, name), []byte(body), 0o644)
	}
	os.WriteFile(filepath.Join(a, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("a.md", filepath.Join(a, "link"))
	mustGit(t, a, "add", "-A")
	mustGit(t, a, "commit", "-qm", "one")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	id, c1, err := e.svc.Head(ctx, "notes")
	if err != nil || c1 == "" {
		t.Fatal(id, c1, err)
	}
	const mnt = "/home/user/memory/notes"
	spec := vault.LayerSpec{Vault: id, Tenant: "acme", Name: "notes", Commit: c1, Path: mnt, UID: 1000, GID: 1000,
		Dirs: vault.TemplateDirs(nil, mnt, 1000, 1000)}
	for _, bad := range [][]vault.LayerDir{{{Path: "../etc"}}, {{Path: "home"}, {Path: "etc"}}, {{Path: "home/user"}}} {
		b := spec
		b.Dirs = bad
		if _, err := e.svc.Stack(ctx, b); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("a layer with directories %+v: %v", bad, err)
		}
	}
	l1 := stack(t, e.svc, spec, 1)[0]
	checkClone(t, l1, mnt, c1, map[string]string{"a.md": "# A\n", "dir/b.md": "b\n", "run.sh": "#!/bin/sh\n"})

	// A second commit: a file changed, one removed (its directory
	// emptied), one added, a directory made a file, the link a file.
	os.WriteFile(filepath.Join(a, "a.md"), []byte("# A, changed\n"), 0o644)
	os.RemoveAll(filepath.Join(a, "dir"))
	os.RemoveAll(filepath.Join(a, "deep/x"))
	os.WriteFile(filepath.Join(a, "deep/x"), []byte("x is a file\n"), 0o644)
	os.Remove(filepath.Join(a, "link"))
	os.WriteFile(filepath.Join(a, "link"), []byte("not a link\n"), 0o644)
	os.MkdirAll(filepath.Join(a, "new/sub"), 0o755)
	os.WriteFile(filepath.Join(a, "new/sub/c.md"), []byte("c\n"), 0o644)
	mustGit(t, a, "add", "-A")
	mustGit(t, a, "commit", "-qm", "two")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	_, c2, _ := e.svc.Head(ctx, "notes")
	spec.Commit = c2
	// Files become directories and the reverse: a whole layer, made
	// from the last whole one.
	l2 := stack(t, e.svc, spec, 1)[0]
	checkClone(t, l2, mnt, c2, map[string]string{"a.md": "# A, changed\n", "deep/x": "x is a file\n", "link": "not a link\n", "new/sub/c.md": "c\n", "keep/k.md": "k\n"})
	for _, gone := range []string{"dir", "deep/x/y.md"} {
		if _, err := os.Lstat(filepath.Join(l2, mnt, gone)); err == nil {
			t.Errorf("%s is in the second layer", gone)
		}
	}
	// The first is as it was; the second links what did not change.
	checkClone(t, l1, mnt, c1, map[string]string{"a.md": "# A\n", "dir/b.md": "b\n"})
	if ino(t, filepath.Join(l1, mnt, "keep/k.md")) != ino(t, filepath.Join(l2, mnt, "keep/k.md")) {
		t.Error("an unchanged file was written again, not linked")
	}
	whole := filepath.Join(t.TempDir(), "whole")
	if err := vault.LayerWhole(e.svc, ctx, spec, whole); err != nil {
		t.Fatal(err)
	}
	if got, want := treeOf(t, l2), treeOf(t, whole); got != want {
		t.Errorf("the layer made from the last differs from one made whole:\n%s\n---\n%s", got, want)
	}

	// A third commit of a few files: a layer of its changes over the
	// second's, which an overlay of the two shows as the layer made
	// whole.
	os.WriteFile(filepath.Join(a, "a.md"), []byte("# A, again\n"), 0o644)
	os.Remove(filepath.Join(a, "new/sub/c.md"))
	os.WriteFile(filepath.Join(a, "new/d.md"), []byte("d\n"), 0o644)
	os.WriteFile(filepath.Join(a, "keep/k3.md"), []byte("k3\n"), 0o644)
	mustGit(t, a, "add", "-A")
	mustGit(t, a, "commit", "-qm", "three")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	_, c3, _ := e.svc.Head(ctx, "notes")
	spec.Commit = c3
	l3 := stack(t, e.svc, spec, 2)
	if l3[1] != l2 {
		t.Errorf("the third commit's changes are over %s, not the second's layer", l3[1])
	}
	if fi, err := os.Lstat(filepath.Join(l3[0], mnt, "new/sub/c.md")); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("the removed file is not a whiteout: %v %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(l3[0], mnt, "keep/k.md")); err == nil {
		t.Error("an unchanged file is in the layer of changes")
	}
	merged := filepath.Join(t.TempDir(), "merged")
	os.Mkdir(merged, 0o755)
	if err := syscall.Mount("overlay", merged, "overlay", syscall.MS_RDONLY, "lowerdir="+l3[0]+":"+l3[1]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(merged, syscall.MNT_DETACH)
	os.Remove(filepath.Join(merged, mnt, "new/sub")) // emptied: stays in the layers
	checkClone(t, merged, mnt, c3, map[string]string{"a.md": "# A, again\n", "new/d.md": "d\n", "keep/k3.md": "k3\n", "keep/k.md": "k\n"})
	whole3 := filepath.Join(t.TempDir(), "whole")
	spec.From = ""
	if err := vault.LayerWhole(e.svc, ctx, spec, whole3); err != nil {
		t.Fatal(err)
	}
	got := strings.ReplaceAll(treeOf(t, merged), "home/user/memory/notes/new/sub drwxr-xr-x 1000 \n", "")
	if want := treeOf(t, whole3); got != want {
		t.Errorf("the overlay of a layer of changes differs from the layer made whole:\n%s\n---\n%s", got, want)
	}

	// The sweep: layers asked for in the last minute stay, then those
	// kept (a sandbox's) and the head's of a mount made; the rest go.
	if n := e.svc.SweepLayers(ctx, map[string]bool{}); n != 0 {
		t.Errorf("the sweep removed %d fresh layers", n)
	}
	vault.AgeLayers(e.svc, 2*time.Minute)
	spec.Commit = c1
	if n := e.svc.SweepLayers(ctx, map[string]bool{vault.LayerKey(spec): true}); n != 0 {
		t.Errorf("the sweep removed %d kept layers", n)
	}
	if n := e.svc.SweepLayers(ctx, map[string]bool{}); n != 1 {
		t.Errorf("the sweep removed %d layers, want 1", n)
	}
	if _, err := os.Stat(l1); err == nil {
		t.Error("the first commit's layer, kept by nothing, is still there")
	}
	if _, err := os.Stat(l2); err != nil {
		t.Errorf("the head's layer: %v", err)
	}
}

// stack makes the layers of spec, wanting n of them, and returns their
// directories.
func stack(t *testing.T, svc *vault.Service, spec vault.LayerSpec, n int) []string {
	t.Helper()
	chain, err := svc.Stack(ctxOf(spec.Tenant), spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != n || (n > 1) != (chain[0].From != "") {
		t.Fatalf("the layers of %s: %+v, want %d", spec.Commit, chain, n)
	}
	dirs, err := svc.LayersOf(ctxOf(spec.Tenant), chain)
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// checkClone checks the clone in layer at mnt: a clean clone at commit,
// files of the sandbox's user, with the contents want.
func checkClone(t *testing.T, layer, mnt, commit string, want map[string]string) {
	t.Helper()
	work := filepath.Join(layer, mnt)
	for name, body := range want {
		if got, err := os.ReadFile(filepath.Join(work, name)); err != nil || string(got) != body {
			t.Errorf("%s: %q, %v; want %q", name, got, err, body)
		}
	}
	// A copy: git refreshes the index, which a layer never is.
	cp := filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command("cp", "-a", work, cp).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	safe := "safe.directory=*" // the clone is the sandbox user's, git runs as root
	if got := mustGit(t, cp, "-c", safe, "status", "--porcelain"); got != "" {
		t.Errorf("the clone is not clean: %s", got)
	}
	if got := strings.TrimSpace(mustGit(t, cp, "-c", safe, "rev-parse", "HEAD", "origin/main")); got != commit+"\n"+commit {
		t.Errorf("HEAD, origin/main: %s; want %s", got, commit)
	}
	mustGit(t, cp, "-c", safe, "fsck", "--full")
	filepath.WalkDir(filepath.Join(layer, "home/user/memory"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s is %d:%d's", p, st.Uid, st.Gid)
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(layer, "home")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("/home in the layer: %v %v", fi, err)
	}
}

// treeOf lists dir's files: path, type and mode, owner, contents.
func treeOf(t *testing.T, dir string) string {
	var b bytes.Buffer
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := d.Info()
		st := fi.Sys().(*syscall.Stat_t)
		var body string
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			body, _ = os.Readlink(p)
		case d.Type().IsRegular() && !strings.HasSuffix(p, ".git/index"):
			c, _ := os.ReadFile(p)
			body = string(c)
		}
		b.WriteString(rel + " " + fi.Mode().String() + " " + strconv.Itoa(int(st.Uid)) + " " + body + "\n")
		return nil
	})
	return b.String()
}

func ino(t *testing.T, p string) uint64 {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
