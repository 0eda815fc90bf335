package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestVaultSearchE2E: a push to a real `atoll serve`, then `atoll vault
// search` and `atoll vault links` see it.
func TestVaultSearchE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	d, _, _ := startRooted(t)
	if out, code := d.cli("vault", "create", "notes", "--layout", "agent"); code != 0 {
		t.Fatalf("vault create: %d %s", code, out)
	}
	a := filepath.Join(testenv.Dir(t), "a")
	mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), a)
	os.WriteFile(filepath.Join(a, "entities", "ada.md"), []byte("---\ntitle: Ada Lovelace\ntype: person\ntags: [math]\n---\nWrote the first program.\n"), 0o644)
	os.MkdirAll(filepath.Join(a, "timeline", "2026", "12"), 0o755)
	os.WriteFile(filepath.Join(a, "timeline", "2026", "12", "02.md"), []byte("# Wed\nmet [[Ada Lovelace]] and [[Babbage]]\n"), 0o644)
	mustVaultGit(t, a, "add", "-A")
	mustVaultGit(t, a, "commit", "-q", "-m", "today")
	mustVaultGit(t, a, "push", "-q")

	out, code := d.cli("vault", "search", "notes", "first", "program")
	if code != 0 || !strings.Contains(out, "entities/ada.md  Ada Lovelace") || !strings.Contains(out, "**first** **program**") {
		t.Errorf("vault search: %d\n%s", code, out)
	}
	out, code = d.cli("vault", "links", "notes", "entities/ada.md")
	if code != 0 || !strings.Contains(out, "type: person") || !strings.Contains(out, "  timeline/2026/12/02.md [[Ada Lovelace]]") {
		t.Errorf("vault links PATH: %d\n%s", code, out)
	}
	out, code = d.cli("vault", "links", "notes")
	if code != 0 || strings.TrimSpace(out) != "timeline/2026/12/02.md: [[Babbage]]" {
		t.Errorf("vault links: %d\n%s", code, out)
	}
	if out, code = d.cli("vault", "search", "notes", `"unbalanced`); code == 0 || !strings.Contains(out, "search query") {
		t.Errorf("a query that does not parse: %d\n%s", code, out)
	}
}

// TestVaultCompactE2E: `atoll vault compact` against a real `atoll
// serve` rolls a pushed day into its week file.
func TestVaultCompactE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	d, _, _ := startRooted(t)
	if out, code := d.cli("vault", "create", "notes", "--layout", "agent"); code != 0 {
		t.Fatalf("vault create: %d %s", code, out)
	}
	a := filepath.Join(testenv.Dir(t), "a")
	mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), a)
	os.MkdirAll(filepath.Join(a, "timeline", "2026", "11"), 0o755)
	os.WriteFile(filepath.Join(a, "timeline", "2026", "11", "03.md"), []byte("# Tue\nmet [[Ada Lovelace]]. Later more.\n"), 0o644)
	mustVaultGit(t, a, "add", "-A")
	mustVaultGit(t, a, "commit", "-q", "-m", "a day")
	mustVaultGit(t, a, "push", "-q")

	if out, code := d.cli("vault", "compact", "notes", "--before", "2026-13-01"); code == 0 || !strings.Contains(out, "YYYY-MM-DD") {
		t.Errorf("a bad date: %d\n%s", code, out)
	}
	out, code := d.cli("vault", "compact", "notes", "--before", "2026-11-10")
	if code != 0 || !strings.Contains(out, "timeline/weekly/2026-W45.md: 1 days") {
		t.Errorf("vault compact: %d\n%s", code, out)
	}
	if out, code = d.cli("vault", "compact", "notes", "--before", "2026-11-10"); code != 0 || !strings.Contains(out, "nothing to compact") {
		t.Errorf("vault compact again: %d\n%s", code, out)
	}
	if out, code = d.cli("vault", "links", "notes"); code != 0 || !strings.Contains(out, "timeline/weekly/2026-W45.md: [[Ada Lovelace]]") {
		t.Errorf("broken links after the compaction: %d\n%s", code, out)
	}
}
