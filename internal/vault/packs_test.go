package vault_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestPackConsolidation checks that a vault's packs, one per push, are
// made one past the limit: the store records the one pack, the object
// store and the cache keep only what the store records, and clones, a
// cache made anew and a cache left behind by the consolidation (another
// node's) all read every commit.
func TestPackConsolidation(t *testing.T) {
	vault.SetPackLimits(t, 3, 0)
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	sv, err := e.st.GetVault(ctx, "acme", "notes")
	if err != nil {
		t.Fatal(err)
	}
	id := sv.ID
	a := e.clone("acme-key", "notes")
	cacheDir := func() string {
		dirs, _ := filepath.Glob(filepath.Join(e.dir, "vaults", "*.git"))
		if len(dirs) != 1 {
			t.Fatalf("cache repositories: %v", dirs)
		}
		return dirs[0]
	}
	packsOf := func() []string {
		_, packs, err := e.st.VaultState(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return packs
	}
	localPacks := func(dir string) []string {
		ps, _ := filepath.Glob(filepath.Join(dir, "objects", "pack", "pack-*.pack"))
		for i := range ps {
			ps[i] = filepath.Base(ps[i])
		}
		return ps
	}
	blobPacks := func() []string {
		ps, _ := filepath.Glob(filepath.Join(e.blobDir, "vaults", id, "packs", "pack-*.pack"))
		for i := range ps {
			ps[i] = filepath.Base(ps[i])
		}
		return ps
	}
	settle := func(what string, within int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			p := packsOf()
			if len(p) <= within && slices.Equal(slices.Sorted(slices.Values(blobPacks())), slices.Sorted(slices.Values(p))) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the store records %v, the object store holds %v", what, p, blobPacks())
			}
		}
	}
	var heads []string
	push := func(n int) {
		for range n {
			heads = append(heads, commitFile(t, a, fmt.Sprintf("n%d.md", len(heads)), fmt.Sprintf("note %d\n", len(heads))))
			mustGit(t, a, "push", "-q", "origin", "HEAD:main")
		}
	}
	push(3)
	if got := len(packsOf()); got != 3 {
		t.Fatalf("3 pushes: %d packs, want 3 (none consolidated below the limit)", got)
	}
	// A copy of the cache as it is now: another node's, left behind.
	// (Copied again if the index, built meanwhile, renames a file under
	// cp.)
	stale := filepath.Join(t.TempDir(), "stale.git")
	for try := 0; ; try++ {
		os.RemoveAll(stale)
		out, err := exec.Command("cp", "-a", cacheDir(), stale).CombinedOutput()
		if err == nil {
			break
		}
		if try == 20 {
			t.Fatalf("cp: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	push(2)
	settle("5 pushes past a limit of 3", 3)
	if got, want := localPacks(cacheDir()), packsOf(); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the cache holds %v, the store records %v", got, want)
	}
	check := func(dir string) {
		t.Helper()
		mustGit(t, dir, "fsck", "--strict")
		if got := strings.TrimSpace(mustGit(t, dir, "rev-list", "--count", "HEAD")); got != fmt.Sprint(len(heads)) {
			t.Errorf("a clone holds %s commits, want %d", got, len(heads))
		}
	}
	check(e.clone("acme-key", "notes"))
	mustGit(t, cacheDir(), "fsck", "--strict")

	// The cache left behind, with the packs consolidated away and refs
	// behind the store's: the next request fetches the one pack and drops
	// the others.
	e.stop()
	dir := cacheDir()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", stale, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	e.start()
	check(e.clone("acme-key", "notes"))
	if got, want := localPacks(dir), packsOf(); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the cache left behind holds %v after a request, the store records %v", got, want)
	}
	mustGit(t, dir, "fsck", "--strict")

	// A cache made anew, and pushes after: consolidated again.
	e.restartWithoutCache()
	check(e.clone("acme-key", "notes"))
	mustGit(t, a, "remote", "set-url", "origin", e.url("acme-key", "notes"))
	push(4)
	settle("4 more pushes", 3)
	check(e.clone("acme-key", "notes"))
}
