package vault_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestCompactMonths: weeks that ended before the weeks' window go into
// their month's file (a "## YYYY-Www" section a week, the week's
// headings one level down), in the commit that rolls the days into them;
// links to the days and weeks rolled up resolve to the month's file; the
// commit message lists both.
func TestCompactMonths(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Layout: api.VaultLayoutAgent}); err != nil {
		t.Fatal(err)
	}
	dir := e.clone("acme-key", "mem")
	// Monday 2026-09-28 (W40, Thursday in October) to Sunday 2026-11-15.
	writeDays(t, dir, time.Date(2026, 9, 28, 0, 0, 0, 0, time.UTC), 49)
	commitFile(t, dir, "entities/ada.md", "# Ada\n\nSee [[timeline/2026/10/06]], [[2026-W41]] and [[timeline/2026/11/03]].\n")
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")

	// First the days only, as before: weeks W40 to W46.
	res, err := e.svc.CompactWith(ctx, "mem", vault.CompactOptions{Before: time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)})
	if err != nil || len(res.Weeks) != 5 || res.Months != nil {
		t.Fatalf("days only: %+v, %v", res, err)
	}
	// Then the rest of the days and the weeks that ended before November.
	res, err = e.svc.CompactWith(ctx, "mem", vault.CompactOptions{Before: time.Date(2026, 11, 16, 0, 0, 0, 0, time.UTC), WeeksBefore: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	// W40 (Thursday 2026-10-01) to W44 (Monday 2026-10-26, Sunday 11-01,
	// which is not before 11-01): W40 to W43 into October; W44 to W46 stay.
	wantMonths := map[string][]string{"timeline/monthly/2026-10.md": {"timeline/weekly/2026-W40.md", "timeline/weekly/2026-W41.md", "timeline/weekly/2026-W42.md", "timeline/weekly/2026-W43.md"}}
	if len(res.Months) != 1 || strings.Join(res.Months["timeline/monthly/2026-10.md"], ",") != strings.Join(wantMonths["timeline/monthly/2026-10.md"], ",") {
		t.Errorf("months: %v, want %v", res.Months, wantMonths)
	}
	if len(res.Weeks["timeline/weekly/2026-W45.md"]) != 7 || len(res.Weeks["timeline/weekly/2026-W46.md"]) != 7 {
		t.Errorf("weeks: %v", res.Weeks)
	}
	fresh := e.clone("acme-key", "mem")
	weeks, _ := filepath.Glob(filepath.Join(fresh, "timeline", "weekly", "*.md"))
	var names []string
	for _, w := range weeks {
		names = append(names, filepath.Base(w))
	}
	if strings.Join(names, ",") != "2026-W44.md,2026-W45.md,2026-W46.md" {
		t.Errorf("week files at the tip: %v", names)
	}
	if days, _ := filepath.Glob(filepath.Join(fresh, "timeline", "20*", "*", "*.md")); len(days) != 0 {
		t.Errorf("day files at the tip: %v", days)
	}
	oct, err := os.ReadFile(filepath.Join(fresh, "timeline/monthly/2026-10.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# 2026-10\n", "\n## 2026-W40\n", "\n## 2026-W43\n", "\n### 2026-10-06\n", "#### Standup 2026-10-06\n", "[[workflows/deploy]]"} {
		if !strings.Contains(string(oct), want) {
			t.Errorf("the month file lacks %q:\n%s", want, oct)
		}
	}
	if strings.Contains(string(oct), "\n# 2026-W4") || strings.Count(string(oct), "\n## 2026-W") != 4 {
		t.Errorf("the month file has the weeks' titles, or not a section a week:\n%s", oct)
	}
	// History keeps the week files; the message lists both roll-ups.
	if got, err := e.svc.Show(ctx, "mem", "timeline/weekly/2026-W41.md", "main~1"); err != nil || !strings.Contains(string(got), "## 2026-10-06") {
		t.Errorf("the week at main~1: %q, %v", got, err)
	}
	msg := mustGit(t, fresh, "log", "-1", "--format=%B")
	for _, want := range []string{"14 days into 2 weeks, 4 weeks into 1 months", "timeline/weekly/2026-W41.md -> timeline/monthly/2026-10.md#2026-W41", "timeline/2026/11/15.md -> timeline/weekly/2026-W46.md#2026-11-15"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the commit message lacks %q:\n%s", want, msg)
		}
	}
	// Links to a rolled-up day and week resolve to the month; to a day of
	// a week still there, to the week.
	l, err := e.svc.Links(ctx, "mem", "entities/ada.md")
	if err != nil {
		t.Fatal(err)
	}
	var to []string
	for _, k := range l.Links {
		to = append(to, k.To)
	}
	if strings.Join(to, ",") != "timeline/monthly/2026-10.md,timeline/monthly/2026-10.md,timeline/weekly/2026-W45.md" {
		t.Errorf("links of ada: %+v", l.Links)
	}

	// A late day of a week already in its month: a new week file, then a
	// second section of that week in the month.
	commitFile(t, fresh, "timeline/2026/10/07.md", "# Late\n\nA late note.\n")
	mustGit(t, fresh, "push", "-q")
	res, err = e.svc.CompactWith(ctx, "mem", vault.CompactOptions{Before: time.Date(2026, 11, 16, 0, 0, 0, 0, time.UTC), WeeksBefore: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil || len(res.Months["timeline/monthly/2026-10.md"]) != 1 {
		t.Fatalf("a late day: %+v, %v", res, err)
	}
	oct, _ = e.svc.Show(ctx, "mem", "timeline/monthly/2026-10.md", "")
	if strings.Count(string(oct), "\n## 2026-W41\n") != 2 || !strings.Contains(string(oct), "A late note.") {
		t.Errorf("October after a late day:\n%s", oct)
	}
	if _, err := e.svc.Show(ctx, "mem", "timeline/weekly/2026-W41.md", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the late week's file is at the tip: %v", err)
	}
}

func TestMonthPath(t *testing.T) {
	for week, want := range map[string]string{
		"timeline/weekly/2026-W01.md": "timeline/monthly/2026-01.md", // Thu 2026-01-01
		"timeline/weekly/2026-W44.md": "timeline/monthly/2026-10.md", // Thu 10-29
		"timeline/weekly/2026-W45.md": "timeline/monthly/2026-11.md", // Thu 11-05
		"timeline/weekly/2026-W53.md": "timeline/monthly/2026-12.md", // 2026 has 53 weeks: Thu 12-31
		"timeline/weekly/2025-W53.md": "",                            // 2025 has 52
		"timeline/weekly/2026-W1.md":  "",
		"entities/x.md":               "",
	} {
		if got := vault.MonthPath(week); got != want {
			t.Errorf("MonthPath(%s) = %q, want %q", week, got, want)
		}
	}
}

// localSandboxes run summarizer commands with bash in a directory of the
// test's: the vault's side of a command summarizer (the sandbox's side
// is cmd/atoll's TestVaultScheduleE2E).
type localSandboxes struct {
	t      *testing.T
	opened int
	closed int
}

func (l *localSandboxes) Open(ctx context.Context) (vault.Sandbox, error) {
	l.opened++
	return localSandbox{l, l.t.TempDir()}, nil
}

type localSandbox struct {
	l   *localSandboxes
	dir string
}

func (s localSandbox) Run(ctx context.Context, shell string, env map[string]string, stdin []byte) ([]byte, []byte, int, error) {
	cmd := exec.CommandContext(ctx, "bash", "-c", shell)
	cmd.Dir = s.dir
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), errb.Bytes(), ee.ExitCode(), nil
	}
	return out.Bytes(), errb.Bytes(), 0, err
}

func (s localSandbox) Close() { s.l.closed++ }

// TestCompactCommandSummarizer: a command's output is each section; a
// command that fails or prints nothing leaves the vault as it was, and
// says why in the vault's events.
func TestCompactCommandSummarizer(t *testing.T) {
	e := newEnv(t)
	e.stop()
	sbs := &localSandboxes{t: t}
	e.sbs = sbs
	e.start()
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	dir := e.clone("acme-key", "mem")
	writeDays(t, dir, time.Date(2026, 10, 26, 0, 0, 0, 0, time.UTC), 7)
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	head := func() string { v, _ := e.svc.Get(ctx, "mem"); return v.Head }
	h0 := head()

	for _, tc := range []struct{ cmd, want string }{
		{"echo boom >&2; exit 3", "the summarizer exited 3: boom"},
		{"cat >/dev/null; echo '  '", "the summarizer printed nothing"},
	} {
		_, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Before: "2026-11-02", Summarizer: tc.cmd})
		if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want conflict %q", tc.cmd, err, tc.want)
		}
		if head() != h0 {
			t.Errorf("%q moved the head", tc.cmd)
		}
		evs, _ := e.svc.Events(ctx, "mem", 1)
		if len(evs) != 1 || !strings.Contains(evs[0].Error, tc.want) || evs[0].Trigger != "api" || evs[0].Commit != "" {
			t.Errorf("%q: events %+v", tc.cmd, evs)
		}
	}
	// The vault's summarizer, used when the request gives none.
	cmd := `printf 'Summary of %s (%s into %s#%s): %s lines\n' "$ATOLL_ROLLUP_KIND" "$ATOLL_ROLLUP_PATH" "$ATOLL_ROLLUP_INTO" "$ATOLL_ROLLUP_SECTION" "$(wc -l)"`
	if v, err := e.svc.Update(ctx, "mem", api.VaultUpdate{Summarizer: &cmd}); err != nil || v.Summarizer != cmd || v.Compact != "" {
		t.Fatalf("Update: %+v, %v", v, err)
	}
	res, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Before: "2026-11-02", WeeksBefore: "2026-11-02"})
	if err != nil || res.Commit == "" {
		t.Fatalf("Compact: %+v, %v", res, err)
	}
	oct, _ := e.svc.Show(ctx, "mem", "timeline/monthly/2026-10.md", "")
	// The week's file as this compaction made it went into the command:
	// its title and 7 days, each a section of the command's one line, 29
	// lines.
	for _, want := range []string{"# 2026-10\n\n## 2026-W44\n\nSummary of week (timeline/weekly/2026-W44.md into timeline/monthly/2026-10.md#2026-W44): 29 lines\n"} {
		if !strings.Contains(string(oct), want) {
			t.Errorf("the month lacks %q:\n%s", want, oct)
		}
	}
	if got, _ := e.svc.Show(ctx, "mem", "timeline/weekly/2026-W44.md", "main"); got != nil {
		t.Errorf("the week file stayed")
	}
	evs, _ := e.svc.Events(ctx, "mem", 10)
	if len(evs) != 3 || evs[0].Commit != res.Commit || evs[0].Error != "" || !strings.Contains(evs[0].Detail, "7 days into 1 weeks, 1 weeks into 1 months") {
		t.Errorf("events: %+v", evs)
	}
	if sbs.opened != 3 || sbs.closed != 3 {
		t.Errorf("sandboxes opened %d, closed %d; want 3 and 3 (one per compaction)", sbs.opened, sbs.closed)
	}
	// Nothing to roll up: no sandbox made.
	if _, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Before: "2026-11-02"}); err != nil || sbs.opened != 3 {
		t.Errorf("an empty compaction: %v, %d sandboxes", err, sbs.opened)
	}
	if _, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Summarizer: strings.Repeat("x", vault.MaxSummarizer+1)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a summarizer too long: %v", err)
	}
}

// TestCompactSummarizerUnavailable: without sandboxes, a command
// summarizer is refused, 503.
func TestCompactSummarizerUnavailable(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem"})
	if _, err := e.svc.Compact(ctx, "mem", api.VaultCompactRequest{Summarizer: "cat"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("%v, want unavailable", err)
	}
}

// TestSchedule: a schedule turned on is due at once; of two services on
// one store, one makes the compaction; then the next is due at the next
// boundary; off, nothing is due; bad values are 400.
func TestSchedule(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	v, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "mem", Compact: api.VaultCompactDaily})
	if err != nil || v.Compact != "daily" || v.NextCompaction == nil || time.Since(*v.NextCompaction) > time.Minute {
		t.Fatalf("Create: %+v, %v", v, err)
	}
	dir := e.clone("acme-key", "mem")
	writeDays(t, dir, time.Now().UTC().AddDate(0, 0, -60), 61)
	mustGit(t, dir, "push", "-q", "origin", "HEAD:main")
	// A second service over the same store and objects, as a second node.
	other, err := vault.New(vault.Config{Store: e.st, Blob: e.blob, Dir: filepath.Join(t.TempDir(), "vaults")})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	done := make(chan struct{})
	go func() { vault.RunDue(other, context.Background()); close(done) }()
	vault.RunDue(e.svc, context.Background())
	<-done
	evs, _ := e.svc.Events(ctx, "mem", 10)
	if len(evs) != 1 || evs[0].Trigger != "schedule" || evs[0].Commit == "" || evs[0].Error != "" {
		t.Fatalf("events after the due run: %+v", evs)
	}
	v, _ = e.svc.Get(ctx, "mem")
	if v.Head != evs[0].Commit {
		t.Errorf("head %s, compaction %s", v.Head, evs[0].Commit)
	}
	if want := vault.NextRun("daily", time.Now()); v.NextCompaction == nil || !v.NextCompaction.Equal(want) {
		t.Errorf("next compaction %v, want %v", v.NextCompaction, want)
	}
	today := "timeline/" + time.Now().UTC().Format("2006/01/02") + ".md"
	if _, err := e.svc.Show(ctx, "mem", today, ""); err != nil {
		t.Errorf("today's file was rolled up: %v", err)
	}
	vault.RunDue(e.svc, context.Background())
	if evs, _ := e.svc.Events(ctx, "mem", 10); len(evs) != 1 {
		t.Errorf("a second run before the boundary: %+v", evs)
	}
	off := api.VaultCompactOff
	if v, err := e.svc.Update(ctx, "mem", api.VaultUpdate{Compact: &off}); err != nil || v.Compact != "" || v.NextCompaction != nil {
		t.Errorf("off: %+v, %v", v, err)
	}
	for _, bad := range []string{"hourly", "DAILY"} {
		if _, err := e.svc.Update(ctx, "mem", api.VaultUpdate{Compact: &bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("compact %q: %v, want invalid", bad, err)
		}
		if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "x", Compact: bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("create with compact %q: %v, want invalid", bad, err)
		}
	}
	if _, err := e.svc.Update(ctxOf("other"), "mem", api.VaultUpdate{Compact: &off}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's: %v, want not found", err)
	}
}

func TestNextRun(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC) // a Thursday
	if got := vault.NextRun("daily", at); !got.Equal(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("daily: %v", got)
	}
	if got := vault.NextRun("weekly", at); !got.Equal(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("weekly: %v", got)
	}
	if got := vault.NextRun("weekly", time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 12, 14, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("weekly on a Monday's midnight: %v", got)
	}
}
