package vault

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseNote(t *testing.T) {
	for _, tc := range []struct {
		name, path, content string
		want                note
	}{
		{"no frontmatter", "a/b.md", "# B\n[[x]]", note{Title: "b", Body: "# B\n[[x]]", Links: []string{"x"}}},
		{"frontmatter", "e/ada.md", "---\ntitle: \"Ada: Countess\"\ntype: person\ntags: [a, 'b', ]\nupdated: 2026-12-02\nnested:\n  k: v\n---\nbody [[X|alias]] [[Y#h]] [[X]]\n",
			note{Title: "Ada: Countess", Type: "person", Tags: []string{"a", "b"}, Updated: "2026-12-02", Body: "body [[X|alias]] [[Y#h]] [[X]]\n", Links: []string{"X", "Y"}}},
		{"block list, CRLF", "n.md", "---\r\ntags:\r\n  - one\r\n  - \"two\"\r\ntitle: T\r\n---\r\nx", note{Title: "T", Tags: []string{"one", "two"}, Body: "x"}},
		{"never closed", "n.md", "---\ntitle: T\nno end", note{Title: "n", Body: "---\ntitle: T\nno end"}},
		{"not at the top", "n.md", "x\n---\ntitle: T\n---\n", note{Title: "n", Body: "x\n---\ntitle: T\n---\n"}},
		{"code is no link", "n.md", "```\n[[a]]\n```\n`[[b]]` [[c]] [[]] [[ ]] [[d\n]]", note{Title: "n", Body: "```\n[[a]]\n```\n`[[b]]` [[c]] [[]] [[ ]] [[d\n]]", Links: []string{"c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.Path = tc.path
			if diff := cmp.Diff(tc.want, parseNote(tc.path, tc.content), cmp.AllowUnexported(note{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// Hostile sizes: a note of only links, a frontmatter of a million keys.
	n := parseNote("x.md", strings.Repeat("[[a]][[b]]", 100_000)+strings.Repeat("[[x", 10_000))
	if len(n.Links) != 2 {
		t.Errorf("links: %d", len(n.Links))
	}
	var many strings.Builder
	for i := range 5000 {
		many.WriteString("[[n" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "]]\n")
	}
	if n := parseNote("x.md", many.String()); len(n.Links) > maxLinks {
		t.Errorf("%d links, want at most %d", len(n.Links), maxLinks)
	}
	parseNote("x.md", "---\n"+strings.Repeat("k: v\n- x\n  - y\n", 100_000)+"---\n")
}

func TestResolve(t *testing.T) {
	r := newResolver([]note{
		{Path: "entities/ada.md", Title: "Ada Lovelace"},
		{Path: "people/deep/ada.md", Title: "ada"},
		{Path: "index.md", Title: "Index"},
		{Path: "x/Index.md", Title: "Index"},
	})
	for target, want := range map[string]string{
		"entities/ada.md": "entities/ada.md",
		"entities/ada":    "entities/ada.md",
		"/entities/ada":   "entities/ada.md",
		"ADA LOVELACE":    "entities/ada.md",
		"ada":             "people/deep/ada.md", // a title before a file name
		"index":           "index.md",           // the shortest path of a title
		"nobody":          "",
		"../index":        "",
	} {
		if got := r.resolve(target); got != want {
			t.Errorf("resolve(%q) = %q, want %q", target, got, want)
		}
	}
}
