package vault_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// TestAdvertisementFollowsRefs: the ref advertisement the server keeps
// (advert.go) is never one of refs that have moved: after a push from
// one clone, another sees the new head in ls-remote and fetch, and its
// push of a commit on the old head is refused by git as not a fast
// forward.
func TestAdvertisementFollowsRefs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	a, b := e.clone("acme-key", "notes"), e.clone("acme-key", "notes")
	for i := range 3 {
		// Twice each: the second from the kept advertisement.
		for range 2 {
			head := strings.Fields(mustGit(t, b, "ls-remote", "origin", "refs/heads/main"))[0]
			if want := strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD")); head != want {
				t.Fatalf("round %d: ls-remote says %s, the vault is at %s", i, head, want)
			}
		}
		commitFile(t, a, "a.md", strings.Repeat("a", i+1)+"\n")
		mustGit(t, a, "push", "-q")
	}
	commitFile(t, b, "b.md", "b\n")
	if out, err := git(t, b, "push"); err == nil || !strings.Contains(out, "fetch first") {
		t.Errorf("a push on an old head: %v\n%s", err, out)
	}
	mustGit(t, b, "pull", "-q", "--no-rebase", "--no-edit")
	mustGit(t, b, "push", "-q")
}

// TestCachesDroppedAfterReboot: the caches, written without fsync, are
// dropped when the machine has booted since they were written, and made
// again from the stores.
func TestCachesDroppedAfterReboot(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	v, _ := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent})
	a := e.clone("acme-key", "notes")
	commitFile(t, a, "n.md", "x\n")
	mustGit(t, a, "push", "-q")
	caches, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git"))
	if len(caches) != 1 {
		t.Fatalf("caches: %v", caches)
	}
	marker := filepath.Join(caches[0], "marker")
	os.WriteFile(marker, nil, 0o600)
	// A restart in the same boot keeps the cache.
	e.stop()
	e.start()
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("a restart dropped the cache: %v", err)
	}
	// A restart after a reboot (another boot ID) drops it.
	e.stop()
	os.WriteFile(filepath.Join(e.dir, "vaults", "boot-id"), []byte("another boot\n"), 0o600)
	e.start()
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the cache survived a reboot: %v", err)
	}
	b := e.clone("acme-key", "notes")
	if got, want := strings.TrimSpace(mustGit(t, b, "rev-parse", "HEAD")), strings.TrimSpace(mustGit(t, a, "rev-parse", "HEAD")); got != want {
		t.Errorf("after the reboot the vault is at %s, want %s (%s)", got, want, v.Head)
	}
}

// TestReceivePackContentType: a push's request of another content type
// is refused, 415, before git runs.
func TestReceivePackContentType(t *testing.T) {
	e := newEnv(t)
	e.svc.Create(ctxOf("acme"), api.CreateVaultRequest{Name: "notes"})
	req, _ := http.NewRequest("POST", e.srv.URL+"/git/notes.git/git-receive-pack", strings.NewReader("0000"))
	req.SetBasicAuth("x", "acme-key")
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("status %s, want 415", resp.Status)
	}
}
