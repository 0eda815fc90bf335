package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestVaultScheduleE2E: a real `atoll serve` compacts a vault on its
// schedule with a summarizer command run in a sandbox of the tenant's
// (as its user, not on the host): one that fails leaves the vault as it
// was and shows in `vault log`; one that works makes the commit, the old
// days in week files and the old weeks in month files, its sandbox
// deleted after. `vault compact --summarizer` does the same on demand.
func TestVaultScheduleE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	testenv.RequireRoot(t)
	d := startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: filepath.Join(testenv.Dir(t), "data"),
		env: []string{"ATOLL_VAULT_COMPACT_TICK=300ms"}, args: []string{"--warm-pool", "0", "--prestart", "0"}})
	c := d.client()
	ctx := context.Background()
	if out, code := d.cli("vault", "create", "notes", "--layout", "agent", "--compact", "hourly"); code == 0 || !strings.Contains(out, "daily, weekly or off") {
		t.Errorf("a bad schedule: %d\n%s", code, out)
	}
	if out, code := d.cli("vault", "create", "notes", "--layout", "agent"); code != 0 {
		t.Fatalf("vault create: %d %s", code, out)
	}
	a := filepath.Join(testenv.Dir(t), "a")
	mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), a)
	// 21 days from 100 days ago: before the current week, and their weeks
	// before the month of its Monday, whatever today is.
	first := time.Now().UTC().AddDate(0, 0, -100)
	for i := range 21 {
		day := first.AddDate(0, 0, i)
		p := filepath.Join(a, "timeline", day.Format("2006/01/02")+".md")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprintf("# Day %d\n\nmet [[Ada Lovelace]] about engines.\n", i)), 0o644)
	}
	mustVaultGit(t, a, "add", "-A")
	mustVaultGit(t, a, "commit", "-q", "-m", "days")
	mustVaultGit(t, a, "push", "-q")
	v0, _ := c.GetVault(ctx, "notes")

	// On demand, a summarizer that fails: nothing changes, and the log says why.
	if out, code := d.cli("vault", "compact", "notes", "--summarizer", "echo the model is down >&2; exit 7"); code == 0 || !strings.Contains(out, "the summarizer exited 7: the model is down") {
		t.Errorf("compact with a failing summarizer: %d\n%s", code, out)
	}
	// On the schedule, one that prints nothing.
	if out, code := d.cli("vault", "set", "notes", "--summarizer", "cat >/dev/null", "--compact", "daily"); code != 0 || !strings.Contains(out, "compact: daily, next") {
		t.Fatalf("vault set: %d\n%s", code, out)
	}
	log := waitOut(t, d, "vault log", func() (string, bool) {
		out, _ := d.cli("vault", "log", "notes")
		return out, strings.Contains(out, "compact (schedule) failed")
	})
	for _, want := range []string{"compact (schedule) failed: summarizing timeline/" + first.Format("2006/01/02") + ".md: conflict: the summarizer printed nothing", "compact (api) failed: summarizing timeline/" + first.Format("2006/01/02") + ".md: conflict: the summarizer exited 7: the model is down", "Seed the agent layout"} {
		if !strings.Contains(log, want) {
			t.Errorf("vault log lacks %q:\n%s", want, log)
		}
	}
	if v, _ := c.GetVault(ctx, "notes"); v.Head != v0.Head {
		t.Errorf("a failed compaction moved the head")
	}
	if v, _ := c.GetVault(ctx, "notes"); v.Compact != "daily" || v.NextCompaction == nil || time.Until(*v.NextCompaction) < 0 || time.Until(*v.NextCompaction) > 24*time.Hour {
		t.Errorf("after its run, the schedule: %s %v", v.Compact, v.NextCompaction)
	}

	// A summarizer that works, on a weekly schedule: it runs at once.
	sum := `printf 'by %s: %s, %s words\n' "$(id -un)" "$ATOLL_ROLLUP_SECTION" "$(wc -w)"`
	if out, code := d.cli("vault", "set", "notes", "--summarizer", sum, "--compact", "weekly"); code != 0 {
		t.Fatalf("vault set: %d\n%s", code, out)
	}
	waitOut(t, d, "the scheduled compaction", func() (string, bool) {
		v, _ := c.GetVault(ctx, "notes")
		return v.Head, v.Head != v0.Head
	})
	out, _ := d.cli("vault", "log", "notes", "-n", "1")
	if !strings.Contains(out, "Compact the timeline: 21 days into") {
		t.Errorf("vault log: %s", out)
	}
	b := filepath.Join(testenv.Dir(t), "b")
	mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), b)
	if days, _ := filepath.Glob(filepath.Join(b, "timeline", "20*", "*", "*.md")); len(days) != 0 {
		t.Errorf("day files left: %v", days)
	}
	if weeks, _ := filepath.Glob(filepath.Join(b, "timeline", "weekly", "*.md")); len(weeks) != 0 {
		t.Errorf("week files left: %v", weeks)
	}
	months, _ := filepath.Glob(filepath.Join(b, "timeline", "monthly", "*.md"))
	if len(months) == 0 {
		t.Fatalf("no month files")
	}
	m, _ := os.ReadFile(months[0])
	// Run as the sandbox's user, on the week as its days' summaries made
	// it.
	if !strings.Contains(string(m), "by user: "+weekSection(t, m)+", ") {
		t.Errorf("the month file:\n%s", m)
	}
	msg := mustVaultGit(t, b, "log", "-1", "--format=%B")
	if !strings.Contains(msg, "timeline/"+first.Format("2006/01/02")+".md -> timeline/weekly/") || !strings.Contains(msg, "-> timeline/monthly/") {
		t.Errorf("the commit message:\n%s", msg)
	}
	// The links to the days resolve (to the months): none broken.
	if out, code := d.cli("vault", "links", "notes"); code != 0 || strings.Contains(out, "timeline/") {
		t.Errorf("broken links: %d\n%s", code, out)
	}
	// The summarizers' sandboxes are gone.
	sbs, err := c.ListSandboxes(ctx, atoll.ListOptions{})
	if err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes left: %+v, %v", sbs, err)
	}
	evs, err := c.VaultEvents(ctx, "notes", 0)
	if err != nil || len(evs) < 3 || evs[0].Trigger != "schedule" || evs[0].Commit == "" || evs[0].Error != "" {
		t.Errorf("events: %+v, %v", evs, err)
	}
}

// weekSection is the first "## YYYY-Www" section heading of a month file.
func weekSection(t *testing.T, month []byte) string {
	for _, l := range strings.Split(string(month), "\n") {
		if strings.HasPrefix(l, "## ") {
			return strings.TrimPrefix(l, "## ")
		}
	}
	t.Fatalf("no week section in\n%s", month)
	return ""
}

// waitOut polls f until it reports done, for 60 s at most.
func waitOut(t *testing.T, d *daemon, what string, f func() (string, bool)) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, ok := f()
		if ok {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s\n%s", what, out, d.out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
