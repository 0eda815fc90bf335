package vault

import (
	"path"
	"regexp"
	"strings"
	"time"
)

// Notes: what the index reads of a Markdown file. Its frontmatter (a
// block of "key: value" lines between two "---" lines at the top, the
// subset of YAML that notes use: scalars, quoted or not, and lists as
// [a, b] or as "- a" lines) and its links, [[Title]] or [[path]],
// optionally with a #heading or an |alias, as Obsidian writes them.

// note is one Markdown file of a vault, parsed.
type note struct {
	Path    string
	Title   string // frontmatter title, else the file's name without .md
	Type    string
	Tags    []string
	Updated string
	Body    string   // the text after the frontmatter
	Links   []string // the targets of its [[links]], in order, each once
}

// parseNote parses the Markdown file at p.
func parseNote(p, content string) note {
	n := note{Path: p, Body: content}
	if fm, body, ok := splitFrontmatter(content); ok {
		n.Body = body
		for k, v := range parseFrontmatter(fm) {
			switch k {
			case "title":
				n.Title = scalar(v)
			case "type":
				n.Type = scalar(v)
			case "updated":
				n.Updated = scalar(v)
			case "tags":
				n.Tags = v
			}
		}
	}
	if n.Title == "" {
		n.Title = strings.TrimSuffix(path.Base(p), ".md")
	}
	n.Links = parseLinks(n.Body)
	return n
}

func scalar(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return strings.Join(v, ", ")
}

// splitFrontmatter cuts the frontmatter off content: the lines between a
// first line "---" and the next "---" (or "...").
func splitFrontmatter(content string) (fm, body string, ok bool) {
	content = strings.TrimPrefix(content, "\ufeff")
	rest, ok := strings.CutPrefix(content, "---\n")
	if !ok {
		if rest, ok = strings.CutPrefix(content, "---\r\n"); !ok {
			return "", content, false
		}
	}
	for off := 0; off < len(rest); {
		end := strings.IndexByte(rest[off:], '\n')
		line := rest[off:]
		next := len(rest)
		if end >= 0 {
			line, next = rest[off:off+end], off+end+1
		}
		if l := strings.TrimRight(line, " \t\r"); l == "---" || l == "..." {
			return rest[:off], rest[next:], true
		}
		off = next
	}
	return "", content, false // never closed: no frontmatter
}

// parseFrontmatter reads fm's top-level keys: a scalar is a list of one,
// a flow list [a, b] or the block list of "- x" lines below the key is a
// list of its items. What it does not understand (nested maps, multi-line
// strings) it skips.
func parseFrontmatter(fm string) map[string][]string {
	out := map[string][]string{}
	var key string // the key whose block list the "- x" lines extend
	for _, line := range strings.Split(fm, "\n") {
		line = strings.TrimRight(line, " \t\r")
		t := strings.TrimSpace(line)
		if t == "" || t[0] == '#' {
			continue
		}
		if item, ok := strings.CutPrefix(t, "- "); ok && key != "" && line != t {
			out[key] = append(out[key], unquote(item))
			continue
		}
		if line != t { // indented, not a list item: nested, skipped
			continue
		}
		k, v, ok := strings.Cut(t, ":")
		if !ok {
			key = ""
			continue
		}
		key = strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		switch {
		case v == "":
			out[key] = nil
		case strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]"):
			var items []string
			for _, it := range strings.Split(v[1:len(v)-1], ",") {
				if it = unquote(strings.TrimSpace(it)); it != "" {
					items = append(items, it)
				}
			}
			out[key], key = items, ""
		default:
			out[key], key = []string{unquote(v)}, ""
		}
	}
	return out
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' && s[len(s)-1] == '"' || s[0] == '\'' && s[len(s)-1] == '\'') {
		return s[1 : len(s)-1]
	}
	return s
}

// linkPattern is a [[link]]: its target, then an optional #heading and
// |alias, which do not take part in resolving it.
var linkPattern = regexp.MustCompile(`\[\[([^\[\]\n|#]+)(?:#[^\[\]\n|]*)?(?:\|[^\[\]\n]*)?\]\]`)

// maxLinks bounds the links read of one note.
const maxLinks = 1000

// parseLinks returns the targets of body's [[links]], each once, outside
// fenced code blocks (where [[x]] is an example, not a link).
func parseLinks(body string) []string {
	var out []string
	seen := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(body, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.Contains(line, "[[") {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(stripCode(line), -1) {
			t := strings.TrimSpace(m[1])
			if t == "" || seen[t] || len(out) >= maxLinks {
				continue
			}
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// stripCode removes line's `code spans`, where [[x]] is an example.
func stripCode(line string) string {
	if !strings.Contains(line, "`") {
		return line
	}
	var b strings.Builder
	for i, part := range strings.Split(line, "`") {
		if i%2 == 0 {
			b.WriteString(part)
		}
	}
	return b.String()
}

// resolver resolves link targets to the paths of a vault's notes: as a
// path (with or without .md), else as a title (frontmatter title, then
// file name), case-insensitively; of several notes of one title, the one
// with the shortest path, then the first in order, so that the answer
// does not depend on the order the files were read in.
type resolver struct {
	paths   map[string]bool
	byTitle map[string]string // lower-cased title → path
	byName  map[string]string // lower-cased file name without .md → path
}

func newResolver(notes []note) *resolver {
	r := &resolver{paths: map[string]bool{}, byTitle: map[string]string{}, byName: map[string]string{}}
	better := func(m map[string]string, k, p string) {
		if old, ok := m[k]; !ok || len(p) < len(old) || len(p) == len(old) && p < old {
			m[k] = p
		}
	}
	for _, n := range notes {
		r.paths[n.Path] = true
		better(r.byTitle, strings.ToLower(n.Title), n.Path)
		better(r.byName, strings.ToLower(strings.TrimSuffix(path.Base(n.Path), ".md")), n.Path)
	}
	return r
}

// resolve returns the path target names, or "" for a broken link.
func (r *resolver) resolve(target string) string {
	t := strings.TrimPrefix(target, "/")
	for _, p := range []string{t, t + ".md"} {
		if r.paths[p] {
			return p
		}
	}
	k := strings.ToLower(t)
	if p, ok := r.byTitle[k]; ok {
		return p
	}
	if p, ok := r.byName[strings.TrimSuffix(k, ".md")]; ok {
		return p
	}
	return r.rolledUp(t)
}

// dayLink is a link to a day: timeline/YYYY/MM/DD or YYYY-MM-DD;
// weekLink to a week: timeline/weekly/YYYY-Www or YYYY-Www.
var (
	dayLink  = regexp.MustCompile(`^(?:timeline/([0-9]{4})/([0-9]{2})/([0-9]{2})(?:\.md)?|([0-9]{4})-([0-9]{2})-([0-9]{2}))$`)
	weekLink = regexp.MustCompile(`^(?:timeline/weekly/)?([0-9]{4}-W[0-9]{2})(?:\.md)?$`)
)

// rolledUp resolves a link to a day or a week whose file compaction
// removed (compact.go): a day to the week file it was rolled into, which
// holds its section "## YYYY-MM-DD", or once that week went into its
// month, to the month file (whose "## YYYY-Www" section holds the day's);
// a week to its month file. "" if there is none.
func (r *resolver) rolledUp(t string) string {
	week := ""
	if m := dayLink.FindStringSubmatch(t); m != nil {
		ymd := m[1] + "-" + m[2] + "-" + m[3]
		if m[1] == "" {
			ymd = m[4] + "-" + m[5] + "-" + m[6]
		}
		d, err := time.Parse("2006-01-02", ymd)
		if err != nil {
			return ""
		}
		if week = WeekPath(d); r.paths[week] {
			return week
		}
	} else if m := weekLink.FindStringSubmatch(t); m != nil {
		week = "timeline/weekly/" + m[1] + ".md"
	}
	if month := MonthPath(week); month != "" && r.paths[month] {
		return month
	}
	return ""
}
