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
// (timeline/weekly/YYYY-Www.md, a "## YYYY-MM-DD" section a day) and
// removes them from the tip in the same commit: they stay in history. The
// commit takes the path a seed does (commit in repo.go): its pack to the
// object store, then the main branch compare-and-set from the head it was
// made on; an agent's push in between makes the compare fail, and
// compaction starts again from the new head, as a pusher would after a
// non-fast-forward refusal.

// Summarizer turns one day's file into its section of the week's file.
// The default, Deterministic, needs no model; a command summarizer (run
// in a sandbox) is for later.
type Summarizer interface {
	Summarize(ctx context.Context, day time.Time, path, content string) (string, error)
}

// CompactResult is what a compaction did: its commit ("" if there was
// nothing to roll up) and the day files rolled into each week's file.
type CompactResult = api.VaultCompaction

// compactAttempts bounds the retries when pushes keep moving the branch.
const compactAttempts = 8

// dayPattern is a daily timeline file's path.
var dayPattern = regexp.MustCompile(`^timeline/([0-9]{4})/([0-9]{2})/([0-9]{2})\.md$`)

// WeekPath is the path of the week file day is rolled into.
func WeekPath(day time.Time) string {
	y, w := day.ISOWeek()
	return fmt.Sprintf("timeline/weekly/%04d-W%02d.md", y, w)
}

// DefaultBefore is the default window's end: the Monday that starts
// now's ISO week; days before it are rolled up.
func DefaultBefore(now time.Time) time.Time {
	d := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

// ParseBefore parses a compaction's "before" date (YYYY-MM-DD); ""
// is DefaultBefore(now).
func ParseBefore(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return DefaultBefore(now), nil
	}
	t, err := time.Parse("2006-01-02", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: before %.40q: want a date YYYY-MM-DD", errdefs.ErrInvalid, s)
	}
	return t, nil
}

// Compact rolls the daily timeline files of the context's tenant's
// vault name into their week files, with the default summarizer: those
// of the days before req.Before (default DefaultBefore(now)).
func (s *Service) Compact(ctx context.Context, name string, req api.VaultCompactRequest) (api.VaultCompaction, error) {
	before, err := ParseBefore(req.Before, time.Now().UTC())
	if err != nil {
		return api.VaultCompaction{}, err
	}
	return s.CompactBefore(ctx, name, before, nil)
}

// CompactBefore rolls the daily timeline files of vault name dated before
// before into their week files, with sum (nil: Deterministic).
func (s *Service) CompactBefore(ctx context.Context, name string, before time.Time, sum Summarizer) (CompactResult, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return CompactResult{}, err
	}
	if sum == nil {
		sum = Deterministic{}
	}
	for range compactAttempts {
		res, err := s.compactOnce(ctx, v, before, sum)
		if errors.Is(err, errCompactRaced) {
			continue
		}
		return res, err
	}
	return CompactResult{}, fmt.Errorf("%w: vault %s kept moving during compaction; try again", errdefs.ErrConflict, v.Name)
}

var errCompactRaced = errors.New("the branch moved")

func (s *Service) compactOnce(ctx context.Context, v store.Vault, before time.Time, sum Summarizer) (CompactResult, error) {
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
	var paths []string
	for _, l := range lines(out) {
		// "<mode> <type> <oid>\t<path>": files only, not symlinks or
		// submodules, which the server stores but never follows.
		meta, p, ok := strings.Cut(l, "\t")
		m := dayPattern.FindStringSubmatch(p)
		if !ok || m == nil || !strings.HasPrefix(meta, "100644 blob ") && !strings.HasPrefix(meta, "100755 blob ") {
			continue
		}
		d, err := time.Parse("2006-01-02", m[1]+"-"+m[2]+"-"+m[3])
		if err != nil || !d.Before(before) {
			continue
		}
		days[p] = d
		paths = append(paths, p)
	}
	if len(paths) == 0 {
		return res, nil // nothing to do: no commit, not even an empty one
	}
	sort.Slice(paths, func(i, j int) bool { return days[paths[i]].Before(days[paths[j]]) })
	var weeks []string
	for _, p := range paths {
		w := WeekPath(days[p])
		if res.Weeks[w] == nil {
			weeks = append(weeks, w)
		}
		res.Weeks[w] = append(res.Weeks[w], p)
	}
	// One cat-file for the days and the week files there are already.
	want := append(append([]string{}, paths...), weeks...)
	content, err := s.catFiles(ctx, dir, head, want)
	if err != nil {
		return res, err
	}
	var files []File
	var msg strings.Builder
	fmt.Fprintf(&msg, "Compact the timeline: %d days into %d weeks\n\n", len(paths), len(weeks))
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
			sec, err := sum.Summarize(ctx, d, p, content[p])
			if err != nil {
				return res, fmt.Errorf("summarizing %s: %w", p, err)
			}
			fmt.Fprintf(&b, "\n## %s\n\n%s\n", d.Format("2006-01-02"), strings.TrimRight(sec, "\n"))
			fmt.Fprintf(&msg, "%s -> %s#%s\n", p, w, d.Format("2006-01-02"))
		}
		files = append(files, File{Path: w, Content: b.String()})
	}
	commit, err := s.commitOn(ctx, v, dir, head, files, paths, msg.String())
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
			// The pack stays in the object store unreferenced: garbage,
			// as a refused push's would be.
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

func (Deterministic) Summarize(_ context.Context, _ time.Time, p, content string) (string, error) {
	n := parseNote(p, content)
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
