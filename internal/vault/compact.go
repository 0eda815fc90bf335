package vault

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Compaction rolls a vault's daily timeline files (timeline/YYYY/MM/DD.md)
// older than a window into their ISO week's file
// (timeline/weekly/YYYY-Www.md, a "## YYYY-MM-DD" section a day), and
// the week files older than a second window into their month's file
// (timeline/monthly/YYYY-MM.md, a "## YYYY-Www" section a week), and
// removes what it rolled up from the tip in the same commit: it stays in
// history. The commit takes the path a seed does (commit in repo.go): its
// pack to the object store, then the main branch compare-and-set from the
// head it was made on; an agent's push in between makes the compare fail,
// and compaction starts again from the new head, as a pusher would after
// a non-fast-forward refusal.

// Rollup is one file rolled up: a day's into its week's file, or a
// week's into its month's.
type Rollup struct {
	Kind    string // RollupDay or RollupWeek
	Path    string // the file rolled up (a week's may exist only in this compaction)
	Into    string // the file it goes into
	Section string // its section's heading there: YYYY-MM-DD or YYYY-Www
	Content string // the file's content
}

// Rollup kinds.
const (
	RollupDay  = "day"
	RollupWeek = "week"
)

// Summarizer turns a file rolled up into its section of the file it goes
// into. The default, Deterministic, needs no model; a command of the
// user's run in a sandbox (summarizer.go) is the other.
type Summarizer interface {
	Summarize(ctx context.Context, r Rollup) (string, error)
}

// CompactResult is what a compaction did: its commit ("" if there was
// nothing to roll up), the day files rolled into each week's file and the
// week files rolled into each month's.
type CompactResult = api.VaultCompaction

// CompactOptions say what a compaction rolls up, and how.
type CompactOptions struct {
	// Before: the days before it are rolled into their weeks; zero, none.
	Before time.Time
	// WeeksBefore: the weeks that ended before it are rolled into their
	// months; zero, none.
	WeeksBefore time.Time
	// Summarizer makes the sections; nil, Deterministic.
	Summarizer Summarizer
}

// compactAttempts bounds the retries when pushes keep moving the branch.
const compactAttempts = 8

// dayPattern is a daily timeline file's path; weekPattern a week file's.
var (
	dayPattern  = regexp.MustCompile(`^timeline/([0-9]{4})/([0-9]{2})/([0-9]{2})\.md$`)
	weekPattern = regexp.MustCompile(`^timeline/weekly/([0-9]{4})-W([0-9]{2})\.md$`)
)

// WeekPath is the path of the week file day is rolled into.
func WeekPath(day time.Time) string {
	y, w := day.ISOWeek()
	return fmt.Sprintf("timeline/weekly/%04d-W%02d.md", y, w)
}

// MonthPath is the path of the month file week file (a WeekPath) is
// rolled into: its Thursday's month, as ISO gives a week its year; ""
// if week is no week file.
func MonthPath(week string) string {
	mon, ok := weekMonday(week)
	if !ok {
		return ""
	}
	return "timeline/monthly/" + mon.AddDate(0, 0, 3).Format("2006-01") + ".md"
}

// weekMonday is the Monday that starts week file p's ISO week.
func weekMonday(p string) (time.Time, bool) {
	m := weekPattern.FindStringSubmatch(p)
	if m == nil {
		return time.Time{}, false
	}
	y, _ := strconv.Atoi(m[1])
	w, _ := strconv.Atoi(m[2])
	// January 4th is always in week 1.
	jan4 := time.Date(y, 1, 4, 0, 0, 0, 0, time.UTC)
	mon := jan4.AddDate(0, 0, -((int(jan4.Weekday())+6)%7)+7*(w-1))
	if yy, ww := mon.ISOWeek(); yy != y || ww != w {
		return time.Time{}, false // W53 of a year of 52
	}
	return mon, true
}

// DefaultBefore is the default window's end: the Monday that starts
// now's ISO week; days before it are rolled up.
func DefaultBefore(now time.Time) time.Time {
	d := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

// DefaultWeeksBefore is the weeks' window's end for a days' window that
// ends at before: the first day of before's month; the weeks that ended
// before it are rolled up.
func DefaultWeeksBefore(before time.Time) time.Time {
	return time.Date(before.Year(), before.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// ParseBefore parses a compaction's "before" date (YYYY-MM-DD); ""
// is DefaultBefore(now).
func ParseBefore(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return DefaultBefore(now), nil
	}
	return parseDate("before", s)
}

func parseDate(what, s string) (time.Time, error) {
	t, err := time.Parse("2006-01-02", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s %.40q: want a date YYYY-MM-DD", errdefs.ErrInvalid, what, s)
	}
	return t, nil
}

// Compact compacts the context's tenant's vault name as req says: the
// days before req.Before (default DefaultBefore(now)) into weeks, the
// weeks that ended before req.WeeksBefore (default DefaultWeeksBefore)
// into months, with req's summarizer, else the vault's, else the
// deterministic one. What it did or why it failed is also the vault's
// event.
func (s *Service) Compact(ctx context.Context, name string, req api.VaultCompactRequest) (api.VaultCompaction, error) {
	before, err := ParseBefore(req.Before, time.Now().UTC())
	if err != nil {
		return api.VaultCompaction{}, err
	}
	weeks := DefaultWeeksBefore(before)
	if req.WeeksBefore != "" {
		if weeks, err = parseDate("weeks_before", req.WeeksBefore); err != nil {
			return api.VaultCompaction{}, err
		}
	}
	if err := checkSummarizer(req.Summarizer); err != nil {
		return api.VaultCompaction{}, err
	}
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.VaultCompaction{}, err
	}
	cmd := req.Summarizer
	if cmd == "" {
		sc, err := s.cfg.Store.VaultSchedule(ctx, v.ID)
		if err != nil {
			return api.VaultCompaction{}, err
		}
		cmd = sc.Summarizer
	}
	return s.compactLogged(ctx, v, CompactOptions{Before: before, WeeksBefore: weeks}, cmd, "api")
}

// compactLogged compacts v with the command summarizer cmd ("" for the
// deterministic one) and records the vault's event of it.
func (s *Service) compactLogged(ctx context.Context, v store.Vault, opts CompactOptions, cmd, trigger string) (CompactResult, error) {
	var res CompactResult
	var err error
	if cmd != "" {
		var c *command
		if c, err = s.commandSummarizer(cmd); err == nil {
			defer c.close()
			opts.Summarizer = c
		}
	}
	if err == nil {
		res, err = s.compact(ctx, v, opts)
	}
	ev := store.VaultEvent{VaultID: v.ID, At: time.Now().UTC(), Kind: "compact", Trigger: trigger, Commit: res.Commit}
	switch {
	case err != nil:
		ev.Error = err.Error()
	case res.Commit == "":
		ev.Detail = "nothing to roll up"
	default:
		n := 0
		for _, d := range res.Weeks {
			n += len(d)
		}
		ev.Detail = fmt.Sprintf("%d days into %d weeks, %d weeks into %d months", n, len(res.Weeks), countValues(res.Months), len(res.Months))
	}
	if lerr := s.cfg.Store.AddVaultEvent(context.WithoutCancel(ctx), ev); lerr != nil && !errors.Is(lerr, errdefs.ErrNotFound) {
		s.log.Warn("recording a vault's event", "vault", v.ID, "err", lerr)
	}
	return res, err
}

func countValues(m map[string][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// CompactBefore rolls the daily timeline files of vault name dated before
// before into their week files, with sum (nil: Deterministic).
func (s *Service) CompactBefore(ctx context.Context, name string, before time.Time, sum Summarizer) (CompactResult, error) {
	return s.CompactWith(ctx, name, CompactOptions{Before: before, Summarizer: sum})
}

// CompactWith compacts the context's tenant's vault name as opts say.
func (s *Service) CompactWith(ctx context.Context, name string, opts CompactOptions) (CompactResult, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return CompactResult{}, err
	}
	return s.compact(ctx, v, opts)
}

func (s *Service) compact(ctx context.Context, v store.Vault, opts CompactOptions) (CompactResult, error) {
	if opts.Summarizer == nil {
		opts.Summarizer = Deterministic{}
	}
	for range compactAttempts {
		res, err := s.compactOnce(ctx, v, opts)
		if errors.Is(err, errCompactRaced) {
			continue
		}
		return res, err
	}
	return CompactResult{Weeks: map[string][]string{}}, fmt.Errorf("%w: vault %s kept moving during compaction; try again", errdefs.ErrConflict, v.Name)
}

var errCompactRaced = errors.New("the branch moved")

// isRegular reports whether ls-tree's "<mode> <type> <oid>" is a file's:
// not a symlink's or a submodule's, which the server stores but never
// follows.
func isRegular(meta string) bool {
	return strings.HasPrefix(meta, "100644 blob ") || strings.HasPrefix(meta, "100755 blob ")
}

func (s *Service) compactOnce(ctx context.Context, v store.Vault, opts CompactOptions) (CompactResult, error) {
	res := CompactResult{Weeks: map[string][]string{}}
	dir, err := s.ready(ctx, v)
	if err != nil {
		return res, err
	}
	// The head is the cache's, whose objects are there to read: if the
	// store has moved on since, the compare-and-set fails and the next
	// attempt reads the newer one.
	refs, err := s.localRefs(ctx, dir)
	head := refs[mainRef]
	if err != nil || head == "" {
		return res, err
	}
	out, err := s.run(ctx, dir, nil, nil, "ls-tree", "-r", "--full-tree", head, "--", "timeline/")
	if err != nil {
		return res, err
	}
	days := map[string]time.Time{}
	var paths []string            // the days rolled up
	existing := map[string]bool{} // the regular files under timeline/
	for _, l := range lines(out) {
		meta, p, ok := strings.Cut(l, "\t")
		if !ok || !isRegular(meta) {
			continue
		}
		existing[p] = true
		m := dayPattern.FindStringSubmatch(p)
		if m == nil || opts.Before.IsZero() {
			continue
		}
		d, err := time.Parse("2006-01-02", m[1]+"-"+m[2]+"-"+m[3])
		if err != nil || !d.Before(opts.Before) {
			continue
		}
		days[p] = d
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return days[paths[i]].Before(days[paths[j]]) })
	var weeks []string // the week files written or rolled up, in order
	for _, p := range paths {
		w := WeekPath(days[p])
		if res.Weeks[w] == nil {
			weeks = append(weeks, w)
		}
		res.Weeks[w] = append(res.Weeks[w], p)
	}
	// The weeks that go into their months: those that ended before the
	// window, already files or made by this compaction.
	rolled := map[string]bool{}
	if !opts.WeeksBefore.IsZero() {
		for p := range existing {
			if mon, ok := weekMonday(p); ok && mon.AddDate(0, 0, 7).Compare(opts.WeeksBefore) <= 0 && res.Weeks[p] == nil {
				weeks = append(weeks, p)
			}
		}
		for _, w := range weeks {
			if mon, ok := weekMonday(w); ok && mon.AddDate(0, 0, 7).Compare(opts.WeeksBefore) <= 0 {
				rolled[w] = true
			}
		}
	}
	sort.SliceStable(weeks, func(i, j int) bool { return weeks[i] < weeks[j] }) // YYYY-Www sorts as time
	if len(paths) == 0 && len(rolled) == 0 {
		return res, nil // nothing to do: no commit, not even an empty one
	}
	var months []string
	res.Months = map[string][]string{}
	for _, w := range weeks {
		if rolled[w] {
			m := MonthPath(w)
			if res.Months[m] == nil {
				months = append(months, m)
			}
			res.Months[m] = append(res.Months[m], w)
		}
	}
	// One cat-file for the days, and the week and month files there are
	// already.
	want := append(append(append([]string{}, paths...), weeks...), months...)
	content, err := s.catFiles(ctx, dir, head, want)
	if err != nil {
		return res, err
	}
	var files []File
	gone := append([]string{}, paths...)
	var msg strings.Builder
	fmt.Fprintf(&msg, "Compact the timeline: %d days into %d weeks, %d weeks into %d months\n\n", len(paths), len(res.Weeks), countValues(res.Months), len(months))
	weekText := map[string]string{}
	for _, w := range weeks {
		var b strings.Builder
		if old, ok := content[w]; ok {
			b.WriteString(strings.TrimRight(old, "\n"))
			b.WriteString("\n")
		} else {
			fmt.Fprintf(&b, "# %s\n", strings.TrimSuffix(filepath.Base(w), ".md"))
		}
		for _, p := range res.Weeks[w] {
			d := days[p]
			sec, err := opts.Summarizer.Summarize(ctx, Rollup{Kind: RollupDay, Path: p, Into: w, Section: d.Format("2006-01-02"), Content: content[p]})
			if err != nil {
				return res, fmt.Errorf("summarizing %s: %w", p, err)
			}
			fmt.Fprintf(&b, "\n## %s\n\n%s\n", d.Format("2006-01-02"), strings.TrimRight(sec, "\n"))
			fmt.Fprintf(&msg, "%s -> %s#%s\n", p, w, d.Format("2006-01-02"))
		}
		weekText[w] = b.String()
		switch {
		case rolled[w]:
			if existing[w] {
				gone = append(gone, w)
			}
		default:
			files = append(files, File{Path: w, Content: weekText[w]})
		}
	}
	for _, m := range months {
		var b strings.Builder
		if old, ok := content[m]; ok {
			b.WriteString(strings.TrimRight(old, "\n"))
			b.WriteString("\n")
		} else {
			fmt.Fprintf(&b, "# %s\n", strings.TrimSuffix(filepath.Base(m), ".md"))
		}
		for _, w := range res.Months[m] {
			sec := strings.TrimSuffix(filepath.Base(w), ".md")
			text, err := opts.Summarizer.Summarize(ctx, Rollup{Kind: RollupWeek, Path: w, Into: m, Section: sec, Content: weekText[w]})
			if err != nil {
				return res, fmt.Errorf("summarizing %s: %w", w, err)
			}
			fmt.Fprintf(&b, "\n## %s\n\n%s\n", sec, strings.TrimRight(text, "\n"))
			fmt.Fprintf(&msg, "%s -> %s#%s\n", w, m, sec)
		}
		files = append(files, File{Path: m, Content: b.String()})
	}
	if len(res.Months) == 0 {
		res.Months = nil
	}
	commit, err := s.commitOn(ctx, v, dir, head, files, gone, msg.String())
	if err != nil {
		return res, err
	}
	res.Commit = commit
	return res, nil
}

// catFiles reads the files at paths in commit, those that exist.
func (s *Service) catFiles(ctx context.Context, dir, commit string, paths []string) (map[string]string, error) {
	var in bytes.Buffer
	for _, p := range paths {
		fmt.Fprintf(&in, "%s:%s\n", commit, p)
	}
	out, err := s.run(ctx, dir, nil, &in, "cat-file", "--batch")
	if err != nil {
		return nil, err
	}
	r := bufio.NewReader(bytes.NewReader(out))
	got := map[string]string{}
	for _, p := range paths {
		hdr, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		f := strings.Fields(hdr)
		if len(f) == 2 && f[1] == "missing" {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("git cat-file: unexpected %.80q", hdr)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n+1)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		if f[1] == "blob" {
			got[p] = string(buf[:n])
		}
	}
	return got, nil
}

// commitOn commits files (written) and gone (removed) on head, v's main
// branch, as commit does a seed; errCompactRaced if the branch is no
// longer at head in the store.
func (s *Service) commitOn(ctx context.Context, v store.Vault, dir, head string, files []File, gone []string, message string) (string, error) {
	scratch := filepath.Join(s.cfg.Dir, "scratch-"+newID())
	defer os.RemoveAll(scratch)
	if _, err := s.run(ctx, s.cfg.Dir, nil, nil, "init", "--quiet", "--bare", scratch); err != nil {
		return "", err
	}
	// The scratch repository reads head's objects from the cache's; its
	// pack holds the new objects only.
	alt := filepath.Join(scratch, "objects", "info", "alternates")
	if err := os.WriteFile(alt, []byte(filepath.Join(dir, "objects")+"\n"), 0o600); err != nil {
		return "", err
	}
	var in bytes.Buffer
	now := time.Now().Unix()
	fmt.Fprintf(&in, "commit %s\ncommitter atoll <atoll@localhost> %d +0000\ndata %d\n%s\nfrom %s\n", mainRef, now, len(message), message, head)
	for _, p := range gone {
		fmt.Fprintf(&in, "D %s\n", p)
	}
	for _, f := range files {
		fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n%s\n", f.Path, len(f.Content), f.Content)
	}
	in.WriteString("done\n")
	if _, err := s.run(ctx, scratch, nil, &in, "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--done"); err != nil {
		return "", err
	}
	nb, err := s.run(ctx, scratch, nil, nil, "rev-parse", mainRef)
	if err != nil {
		return "", err
	}
	nu := strings.TrimSpace(string(nb))
	packs, _ := filepath.Glob(filepath.Join(scratch, "objects", "pack", "pack-*.pack"))
	if len(packs) == 0 {
		return "", errors.New("git fast-import wrote no pack")
	}
	if s.beforeCompactCommit != nil {
		s.beforeCompactCommit()
	}
	var names []string
	for _, p := range packs {
		name, err := s.storePack(ctx, v, p)
		if err != nil {
			return "", err
		}
		names = append(names, name)
	}
	up := store.RefUpdate{Name: mainRef, Old: head, New: nu}
	if err := s.cfg.Store.UpdateVaultRefs(ctx, v.ID, []store.RefUpdate{up}, names); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			// The pack stays in the object store unrecorded, for the
			// sweep (packs.go), as a refused push's would.
			return "", errCompactRaced
		}
		return "", err
	}
	if _, err := s.ready(ctx, v); err != nil { // the cache follows the store
		return "", err
	}
	s.indexSoon(v)
	return nu, nil
}

// Deterministic is the default summarizer: no model. Of each entry of a
// day (a heading and what follows it; the text before the first heading
// is an entry too) it keeps the heading, the first sentence, the
// [[links]] and the #tags, and counts entries and links.
type Deterministic struct{}

var tagPattern = regexp.MustCompile(`(?:^|\s)#([A-Za-z][A-Za-z0-9_/-]*)`)

func (Deterministic) Summarize(_ context.Context, r Rollup) (string, error) {
	if r.Kind == RollupWeek {
		// A week file is summaries already: it goes into its month
		// whole, its title dropped (the section names the week) and its
		// headings one level down, under the week's.
		return demote(dropTitle(r.Content)), nil
	}
	p := r.Path
	n := parseNote(p, r.Content)
	type entry struct {
		heading string
		text    []string
	}
	var entries []entry
	cur := entry{}
	flush := func() {
		if cur.heading != "" || strings.TrimSpace(strings.Join(cur.text, "")) != "" {
			entries = append(entries, cur)
		}
	}
	fenced := false
	for _, line := range strings.Split(n.Body, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(t, "#") {
			if h := strings.TrimLeft(t, "#"); strings.HasPrefix(h, " ") {
				flush()
				cur = entry{heading: strings.TrimSpace(h)}
				continue
			}
		}
		cur.text = append(cur.text, line)
	}
	flush()
	var b strings.Builder
	links := 0
	for _, e := range entries {
		body := strings.Join(e.text, "\n")
		if e.heading != "" {
			fmt.Fprintf(&b, "### %s\n\n", e.heading)
		}
		if s := firstSentence(body); s != "" {
			fmt.Fprintf(&b, "%s\n", s)
		}
		ls := parseLinks(body)
		links += len(ls)
		if len(ls) > 0 {
			b.WriteString("Links:")
			for _, l := range ls {
				fmt.Fprintf(&b, " [[%s]]", l)
			}
			b.WriteString("\n")
		}
		var tags []string
		seen := map[string]bool{}
		for _, m := range tagPattern.FindAllStringSubmatch(stripCode(body), -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				tags = append(tags, "#"+m[1])
			}
		}
		if len(tags) > 0 {
			fmt.Fprintf(&b, "Tags: %s\n", strings.Join(tags, " "))
		}
		b.WriteString("\n")
	}
	head := fmt.Sprintf("_%d entries, %d links (from %s)_\n", len(entries), links, p)
	if len(n.Tags) > 0 {
		head += "Tags: " + strings.Join(n.Tags, ", ") + "\n"
	}
	return head + "\n" + b.String(), nil
}

// firstSentence is text's first sentence: up to the first ". ", "! "
// or "? ", or its first paragraph, on one line.
func firstSentence(text string) string {
	var words []string
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if t == "" {
			if len(words) > 0 {
				break
			}
			continue
		}
		words = append(words, strings.TrimLeft(t, "-*+ "))
	}
	s := strings.Join(words, " ")
	for i := 0; i+1 < len(s); i++ {
		if (s[i] == '.' || s[i] == '!' || s[i] == '?') && s[i+1] == ' ' {
			return s[:i+1]
		}
	}
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

// dropTitle is text without its first line if that is a level-1
// heading.
func dropTitle(text string) string {
	first, rest, _ := strings.Cut(text, "\n")
	if strings.HasPrefix(first, "# ") {
		return strings.TrimLeft(rest, "\n")
	}
	return text
}

// demote puts text's ATX headings one level down (at most 6), outside
// fenced code blocks.
func demote(text string) string {
	ls := strings.Split(text, "\n")
	fenced := false
	for i, line := range ls {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if n := len(line) - len(h); n < 6 && (h == "" || h[0] == ' ') {
			ls[i] = "#" + line
		}
	}
	return strings.Join(ls, "\n")
}
