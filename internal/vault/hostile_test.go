package vault_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/vault"
)

// A push larger than MaxPush is refused, whole: 413 when the client says
// its length, git's own limit on the pack when it streams it.
func TestPushTooLarge(t *testing.T) {
	e := newEnvMax(t, 256<<10)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	commitFile(t, a, "small.md", "x\n")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	big := make([]byte, 2<<20)
	rand.Read(big)
	commitFile(t, a, "big.bin", string(big))
	out, err := git(t, a, "push", "origin", "HEAD:main")
	if err == nil || !strings.Contains(out, "maximum allowed size") {
		t.Fatalf("a streamed push over the limit: %v, want git's limit on the pack:\n%s", err, out)
	}
	// With a small postBuffer... and with a length given: 413.
	out, err = git(t, a, "-c", "http.postBuffer=16777216", "push", "origin", "HEAD:main")
	if err == nil || !strings.Contains(out, "413") {
		t.Errorf("a push with a length over the limit: %v\n%s", err, out)
	}
	v, _ := e.svc.Get(ctx, "notes")
	if v.Packs != 1 {
		t.Errorf("after refused pushes the vault has %d packs, want 1", v.Packs)
	}
	req, _ := http.NewRequest("POST", e.srv.URL+vault.GitPath("notes")+"/git-receive-pack", io.LimitReader(zero{}, 2<<20))
	req.ContentLength = 2 << 20
	req.SetBasicAuth("x", "acme-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a raw POST over the limit: %v %v, want 413", resp.Status, err)
	}
}

type zero struct{}

func (zero) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A malformed pack is refused with git's message, and changes nothing.
func TestMalformedPack(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	zeros := strings.Repeat("0", 40)
	cmd := fmt.Sprintf("%s %s refs/heads/main\x00report-status", zeros, "1234567890123456789012345678901234567890")
	body := pushBody(cmd, []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x05garbage that is no pack at all"))
	code, b := e.postPush("acme-key", "notes", body)
	if !strings.Contains(b, "unpack") || strings.Contains(b, "unpack ok") {
		t.Errorf("a malformed pack: %d %q, want git's unpack error", code, b)
	}
	v, _ := e.svc.Get(ctx, "notes")
	if v.Head != "" || v.Packs != 0 {
		t.Errorf("after a malformed pack: %+v", v)
	}
	// The dumb protocol and other paths are not served.
	for _, p := range []string{"/HEAD", "/objects/info/packs", "/info/refs", "/../../etc/passwd", "/config"} {
		req, _ := http.NewRequest("GET", e.srv.URL+vault.GitPath("notes")+p, nil)
		req.SetBasicAuth("x", "acme-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("GET %s: %s, want an error", p, resp.Status)
		}
	}
}

// Names that mean something on a disk are only names in a vault: stored
// as pushed, read back as bytes, never followed. A tree with a ".." or
// ".git" entry is refused (git's fsck).
func TestHostileTrees(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	os.MkdirAll(filepath.Join(a, "d"), 0o755)
	os.WriteFile(filepath.Join(a, "..%2F..%2Fescape.md"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(a, "-rf"), []byte("y\n"), 0o644)
	if err := os.Symlink("/etc/passwd", filepath.Join(a, "d", "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../", filepath.Join(a, "up")); err != nil {
		t.Fatal(err)
	}
	mustGit(t, a, "add", "-A")
	// A submodule (a gitlink to a commit the vault does not hold) too.
	mustGit(t, a, "update-index", "--add", "--cacheinfo", "160000,1234567890123456789012345678901234567890,sub")
	mustGit(t, a, "commit", "-q", "-m", "hostile names")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	for p, want := range map[string]string{"d/passwd": "/etc/passwd", "..%2F..%2Fescape.md": "x\n", "-rf": "y\n"} {
		got, err := e.svc.Show(ctx, "notes", p, "")
		if err != nil || string(got) != want {
			t.Errorf("Show(%s) = %q, %v; want %q", p, got, err, want)
		}
	}
	if got, err := e.svc.Show(ctx, "notes", "sub", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Show of a submodule = %q, %v; want not found (never followed)", got, err)
	}
	if out := mustGit(t, e.clone("acme-key", "notes"), "ls-files", "-s", "sub"); !strings.HasPrefix(out, "160000 1234567890") {
		t.Errorf("the submodule entry came back as %q", out)
	}
	for _, p := range []string{"up/etc/passwd", "../x", "/etc/passwd", "d/../../x"} {
		if got, err := e.svc.Show(ctx, "notes", p, ""); err == nil {
			t.Errorf("Show(%s) = %q, want an error", p, got)
		}
	}
	if got, err := e.svc.Show(ctx, "notes", "-rf", "--output=/tmp/x"); err == nil {
		t.Errorf("Show at an option as revision = %q, want an error", got)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "escape.md")); err == nil {
		t.Error("a pushed name wrote outside the vault")
	}
	// Trees with a ".." or ".git" entry, made by hand: git's fsck refuses
	// them.
	id := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD:-rf"))
	raw := make([]byte, 20)
	fmt.Sscanf(id, "%x", &raw)
	for _, c := range []struct{ name, msg string }{{"..", "Dotdot"}, {".git", "Dotgit"}, {".GIT", "Dotgit"}} {
		var tree bytes.Buffer
		fmt.Fprintf(&tree, "100644 %s\x00%s", c.name, raw)
		treeFile := filepath.Join(t.TempDir(), "tree")
		os.WriteFile(treeFile, tree.Bytes(), 0o644)
		bad := strings.TrimSpace(mustGit(t, a, "hash-object", "-w", "--literally", "-t", "tree", treeFile))
		commit := strings.TrimSpace(mustGit(t, a, "commit-tree", bad, "-p", "HEAD", "-m", c.name))
		out, err := git(t, a, "push", "origin", commit+":refs/heads/main")
		if err == nil || !strings.Contains(out, c.msg) {
			t.Errorf("a tree with a %s entry: %v, want git's fsck refusal (%s):\n%s", c.name, err, c.msg, out)
		}
		if v, _ := e.svc.Get(ctx, "notes"); v.Head == commit {
			t.Errorf("the commit with a %s entry is the vault's head", c.name)
		}
	}
}

// Thousands of refs are refused.
func TestTooManyRefs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	commitFile(t, a, "a.md", "a\n")
	var refs bytes.Buffer
	head := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD"))
	for i := range vault.MaxRefs + 5 {
		fmt.Fprintf(&refs, "create refs/tags/t%d %s\n", i, head)
	}
	upd := exec.Command("git", "update-ref", "--stdin")
	upd.Dir, upd.Stdin = a, &refs
	if out, err := upd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := git(t, a, "push", "origin", "--tags", "HEAD:main")
	if err == nil || !strings.Contains(out, "refs at most") {
		t.Errorf("a push of %d refs: %v\n%.500s", vault.MaxRefs+5, err, out)
	}
	if v, _ := e.svc.Get(ctx, "notes"); len(v.Refs) != 0 {
		t.Errorf("after a refused push the vault has %d refs", len(v.Refs))
	}
}

// The hooks' port refuses what is not a push under way, and a connection
// that sends nothing does not hold the service's Close.
func TestHookPort(t *testing.T) {
	e := newEnv(t)
	addr := vault.HookAddr(e.svc)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "no-such-token\n\n\n")
	ans, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasPrefix(string(ans), "refused\n") {
		t.Errorf("a made-up token: %q, want refused", ans)
	}
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	done := make(chan struct{})
	go func() { e.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for an idle hook connection")
	}
}

// A body cut short of the length its request declared (a client that goes
// away mid-push, or lies) leaves no git process behind: git http-backend
// loops forever on a standard input that ends before CONTENT_LENGTH, so it
// must never be told one.
func TestBodyCutShort(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	for _, service := range []string{"git-receive-pack", "git-upload-pack"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST %s/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Basic eDphY21lLWtleQ==\r\n"+
			"Content-Type: application/x-%s-request\r\nContent-Length: 1468\r\n\r\n0094", vault.GitPath("notes"), service, service)
		time.Sleep(100 * time.Millisecond) // the server has started git
		conn.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := gitProcessesIn(t, e.dir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left { // else the server's Close waits on them for ever
				var pid int
				fmt.Sscan(p, &pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("10 s after two requests were cut short, git processes still run in the vaults: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gitProcessesIn lists the processes whose working directory is under dir.
func gitProcessesIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, ent := range ents {
		cwd, err := os.Readlink(filepath.Join("/proc", ent.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir) {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "comm"))
		found = append(found, ent.Name()+" "+strings.TrimSpace(string(comm)))
	}
	return found
}
