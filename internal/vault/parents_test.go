package vault_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/vault"
)

// TestQuarantineParents reads commits' parents from packs git made, as
// git itself does: a merge's two, a root commit's none; an object not in
// the packs, or not a commit, is "not found".
func TestQuarantineParents(t *testing.T) {
	dir := t.TempDir()
	mustGit(t, dir, "init", "-q", "-b", "main")
	var commits []string
	for i := range 40 {
		commits = append(commits, commitFile(t, dir, fmt.Sprintf("f%d.md", i%3), strings.Repeat("x", i)+"\n"))
	}
	mustGit(t, dir, "checkout", "-q", "-b", "side", commits[10])
	side := commitFile(t, dir, "side.md", "s\n")
	mustGit(t, dir, "checkout", "-q", "main")
	mustGit(t, dir, "merge", "-q", "--no-edit", "side")
	merge := strings.TrimSpace(mustGit(t, dir, "rev-parse", "HEAD"))
	mustGit(t, dir, "repack", "-q", "-a", "-d")
	objects := filepath.Join(dir, ".git", "objects")
	check := func(oid string) {
		t.Helper()
		want := strings.Fields(mustGit(t, dir, "rev-list", "--parents", "-n1", oid))[1:]
		got, ok := vault.QuarantineParents(objects, oid)
		if ok && !slices.Equal(got, want) {
			t.Errorf("parents of %s: %v, want %v", oid, got, want)
		}
		if !ok && oid == merge {
			t.Errorf("the merge's parents were not read")
		}
	}
	check(merge)
	check(commits[0])
	check(commits[39])
	for _, c := range commits[:39] {
		check(c)
	}
	if p, ok := vault.QuarantineParents(objects, commits[0]); ok && len(p) != 0 {
		t.Errorf("a root commit's parents: %v", p)
	}
	tree := strings.TrimSpace(mustGit(t, dir, "rev-parse", "HEAD^{tree}"))
	for _, oid := range []string{tree, strings.Repeat("0", 40), "xyz", side[:10]} {
		if _, ok := vault.QuarantineParents(objects, oid); ok {
			t.Errorf("%s: found as a commit", oid)
		}
	}
	if _, ok := vault.QuarantineParents("", merge); ok {
		t.Errorf("no quarantine: found")
	}
}
