package vault_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/vault"
)

// writeDays writes a daily timeline file for each day from first for n
// days in the clone at dir, and commits them.
func writeDays(t testing.TB, dir string, first time.Time, n int) {
	t.Helper()
	for i := range n {
		d := first.AddDate(0, 0, i)
		p := filepath.Join(dir, "timeline", d.Format("2006/01/02")+".md")
		os.MkdirAll(filepath.Dir(p), 0o755)
		body := fmt.Sprintf("---\ntags: [day]\n---\n# Standup %s\n\nTalked to [[entities/ada]] about engines. Then lunch.\n\n## Deploy\n\nShipped v%d #release, see [[workflows/deploy]].\n", d.Format("2006-01-02"), i)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustGit(t, dir, "add", "-A")
	mustGit(t, dir, "commit", "-q", "-m", "days")
}

func TestCompact(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Layout: api.VaultLayoutAgent}); err != nil {
		t.Fatal(err)
	}
	dir := e.clone("acme-key", "mem")
	// Monday 2026-10-26 (W44) to Monday 2026-11-16 (W47), which stays.
	writeDays(t, dir, time.Date(2026, 10, 26, 0, 0, 0, 0, time.UTC), 22)
	commitFile(t, dir, "entities/ada.md", "# Ada\n\nSee [[timeline/2026/11/03]] and [[2026-11-04]].\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")

	// An agent pushes while the compaction is being made: the compaction
	// starts again from the agent's head, and rolls up the agent's old day.
	other := e.clone("acme-key", "mem")
	raced := 0
	vault.SetBeforeCompactCommit(e.svc, func() {
		if raced++; raced == 1 {
			commitFile(t, other, "timeline/2026/10/25.md", "# Sunday\n\nQuiet day.\n")
			commitFile(t, other, "entities/agent.md", "# Agent\n")
			mustGit(t, other, "push", "-q", "origin", "HEAD:main")
		}
	})
	before, _ := vault.ParseBefore("2026-11-16", time.Now())
	res, err := e.svc.CompactBefore(ctx, "mem", before, nil)
	if err != nil {
		t.Fatal(err)
	}
	if raced != 2 {
		t.Errorf("the compaction was made %d times, want 2 (once more after the agent's push)", raced)
	}
	wantWeeks := map[string]int{"timeline/weekly/2026-W43.md": 1, "timeline/weekly/2026-W44.md": 7, "timeline/weekly/2026-W45.md": 7, "timeline/weekly/2026-W46.md": 7}
	if len(res.Weeks) != len(wantWeeks) {
		t.Errorf("weeks: %v", res.Weeks)
	}
	for w, n := range wantWeeks {
		if len(res.Weeks[w]) != n {
			t.Errorf("%s: %d days rolled, want %d", w, len(res.Weeks[w]), n)
		}
	}
	v, _ := e.svc.Get(ctx, "mem")
	if v.Head != res.Commit {
		t.Errorf("head %s, compaction commit %s", v.Head, res.Commit)
	}
	fresh := e.clone("acme-key", "mem")
	if _, err := os.Stat(filepath.Join(fresh, "entities/agent.md")); err != nil {
		t.Errorf("the agent's push was lost: %v", err)
	}
	days, _ := filepath.Glob(filepath.Join(fresh, "timeline", "20*", "*", "*.md"))
	if len(days) != 1 || !strings.HasSuffix(days[0], "2026/11/16.md") {
		t.Errorf("day files at the tip: %v, want 2026/11/16.md only", days)
	}
	w45, err := os.ReadFile(filepath.Join(fresh, "timeline/weekly/2026-W45.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# 2026-W45\n", "\n## 2026-11-02\n", "\n## 2026-11-08\n", "### Standup 2026-11-03\n",
		"Talked to [[entities/ada]] about engines.\n", "### Deploy\n", "[[workflows/deploy]]", "#release", "_2 entries, 2 links (from timeline/2026/11/03.md)_", "Tags: day"} {
		if !strings.Contains(string(w45), want) {
			t.Errorf("the week file lacks %q:\n%s", want, w45)
		}
	}
	if strings.Contains(string(w45), "Then lunch") {
		t.Errorf("the week file keeps more than the first sentence:\n%s", w45)
	}
	// History keeps the raw days; the message lists them.
	got, err := e.svc.Show(ctx, "mem", "timeline/2026/11/03.md", "main~1")
	if err != nil || !strings.Contains(string(got), "Then lunch") {
		t.Errorf("Show @main~1 = %q, %v", got, err)
	}
	if _, err := e.svc.Show(ctx, "mem", "timeline/2026/11/03.md", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Show at the tip: %v, want not found", err)
	}
	msg := mustGit(t, fresh, "log", "-1", "--format=%B")
	for _, want := range []string{"Compact the timeline: 22 days into 4 weeks", "timeline/2026/10/25.md -> timeline/weekly/2026-W43.md#2026-10-25", "timeline/2026/11/15.md -> timeline/weekly/2026-W46.md#2026-11-15"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the commit message lacks %q:\n%s", want, msg)
		}
	}
	// Links into rolled-up days resolve to their week's file.
	l, err := e.svc.Links(ctx, "mem", "entities/ada.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Links) != 2 || l.Links[0].To != "timeline/weekly/2026-W45.md" || l.Links[1].To != "timeline/weekly/2026-W45.md" {
		t.Errorf("links of ada: %+v", l.Links)
	}

	// Again: nothing to do, no commit.
	res, err = e.svc.CompactBefore(ctx, "mem", before, nil)
	if err != nil || res.Commit != "" {
		t.Errorf("second compaction: %+v, %v; want no commit", res, err)
	}
	if v2, _ := e.svc.Get(ctx, "mem"); v2.Head != v.Head {
		t.Errorf("the second compaction moved the head")
	}
	// A later window appends the next week's day to a new week file, and
	// a day of a week already rolled up to that week's file.
	commitFile(t, fresh, "timeline/2026/11/02.md", "# Late\n\nA late note.\n")
	mustGit(t, fresh, "push", "-q")
	res, err = e.svc.CompactBefore(ctx, "mem", time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), nil)
	if err != nil || len(res.Weeks) != 2 {
		t.Fatalf("third compaction: %+v, %v", res, err)
	}
	w45, _ = e.svc.Show(ctx, "mem", "timeline/weekly/2026-W45.md", "")
	if strings.Count(string(w45), "\n## 2026-11-02\n") != 2 || !strings.Contains(string(w45), "A late note.") {
		t.Errorf("W45 after a late day:\n%s", w45)
	}
}

func TestCompactBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	for _, s := range []string{"2026-13-01", "yesterday", "2026-11-16T00:00:00Z"} {
		if _, err := vault.ParseBefore(s, time.Now()); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseBefore(%q) = %v, want invalid", s, err)
		}
	}
	if _, err := e.svc.CompactBefore(ctxOf("other"), "mem", time.Now(), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's vault: %v, want not found", err)
	}
	if _, err := e.svc.CompactBefore(ctx, "../x", time.Now(), nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad name: %v, want invalid", err)
	}
	// An empty vault has nothing to compact.
	if res, err := e.svc.CompactBefore(ctx, "mem", time.Now(), nil); err != nil || res.Commit != "" {
		t.Errorf("empty vault: %+v, %v", res, err)
	}
}

func TestDefaultBefore(t *testing.T) {
	for now, want := range map[string]string{"2026-12-02": "2026-11-30", "2026-11-30": "2026-11-30", "2026-12-06": "2026-11-30", "2027-01-01": "2026-12-28"} {
		n, _ := time.Parse("2006-01-02", now)
		if got := vault.DefaultBefore(n.Add(13 * time.Hour)).Format("2006-01-02"); got != want {
			t.Errorf("DefaultBefore(%s) = %s, want %s", now, got, want)
		}
	}
}

// TestCompactYear measures the compaction of a year of daily files.
func TestCompactYear(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	writeDays(t, dir, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), 365)
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	start := time.Now()
	res, err := e.svc.CompactBefore(ctx, "mem", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), nil)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range res.Weeks {
		n += len(d)
	}
	if n != 365 || len(res.Weeks) != 53 {
		t.Errorf("%d days into %d weeks, want 365 into 53", n, len(res.Weeks))
	}
	t.Logf("compaction of 365 daily files into %d weeks: %v", len(res.Weeks), took)
}

func TestCompactRequest(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	writeDays(t, dir, time.Now().UTC().AddDate(0, 0, -30), 31)
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	if _, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Before: "2026-02-30"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad date: %v, want invalid", err)
	}
	// The default window keeps the current week's days.
	res, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{})
	if err != nil || res.Commit == "" {
		t.Fatalf("Compact: %+v, %v", res, err)
	}
	monday := vault.DefaultBefore(time.Now().UTC())
	if _, err := e.svc.Show(ctx, "mem", "timeline/"+time.Now().UTC().Format("2006/01/02")+".md", ""); err != nil {
		t.Errorf("today's file was rolled up: %v", err)
	}
	for _, days := range res.Weeks {
		for _, d := range days {
			if dt, _ := time.Parse("timeline/2006/01/02.md", d); !dt.Before(monday) {
				t.Errorf("%s rolled up, on or after %s", d, monday)
			}
		}
	}
}

// TestCompactSkipsSymlinks: a symlink at a day's path is stored, never
// followed nor rolled up.
func TestCompactSkipsSymlinks(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	os.MkdirAll(filepath.Join(dir, "timeline/2026/01"), 0o755)
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "timeline/2026/01/05.md")); err != nil {
		t.Fatal(err)
	}
	commitFile(t, dir, "timeline/2026/01/06.md", "# Tue\n\nReal day.\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	res, err := e.svc.CompactBefore(ctx, "mem", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), nil)
	if err != nil || len(res.Weeks["timeline/weekly/2026-W02.md"]) != 1 || res.Weeks["timeline/weekly/2026-W02.md"][0] != "timeline/2026/01/06.md" {
		t.Fatalf("Compact: %+v, %v", res, err)
	}
	w, _ := e.svc.Show(ctx, "mem", "timeline/weekly/2026-W02.md", "")
	if strings.Contains(string(w), "root:") || strings.Contains(string(w), "2026-01-05") {
		t.Errorf("the symlink was followed or rolled up:\n%s", w)
	}
}
