package archtest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// doc is the file whose "## Layers" table is the one statement of the
// layers: the test reads it rather than a copy, so the two cannot differ.
const doc = "docs/architecture.md"

// layer is one row of the table: its name and the package patterns it
// holds, relative to the module ("internal/runtime/ns/...").
type layer struct {
	name     string
	patterns []string
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// parseLayers reads the table under the "## Layers" heading, bottom layer
// first.
func parseLayers(text string) ([]layer, error) {
	var layers []layer
	in := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "## ") {
			in = line == "## Layers"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 2 || strings.Trim(cells[0], " -") == "" || strings.TrimSpace(cells[0]) == "Layer" {
			continue // the separator row and the header
		}
		l := layer{name: strings.TrimSpace(cells[0])}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			l.patterns = append(l.patterns, m[1])
		}
		if len(l.patterns) == 0 {
			return nil, fmt.Errorf("layer %q names no packages", l.name)
		}
		layers = append(layers, l)
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("no layers table under a \"## Layers\" heading")
	}
	return layers, nil
}

// matches reports whether pattern covers pkg, and how specifically (the
// pattern's length, for the longest match to win).
func matches(pattern, pkg string) (int, bool) {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return len(base), pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return len(pattern), pkg == pattern
}

// placement maps packages to the index of their layer.
type placement struct {
	layers []layer
	used   map[string]bool // patterns that placed some package
}

// of returns the index of pkg's layer: that of the longest pattern covering
// it.
func (p *placement) of(pkg string) (int, bool) {
	best, at, pat := -1, -1, ""
	for i, l := range p.layers {
		for _, pattern := range l.patterns {
			if n, ok := matches(pattern, pkg); ok && n > best {
				best, at, pat = n, i, pattern
			}
		}
	}
	if at >= 0 && p.used != nil {
		p.used[pat] = true
	}
	return at, at >= 0
}

// pkg is what the test reads of `go list -json`: only non-test imports.
type pkg struct {
	ImportPath string
	Imports    []string
}

// check returns a problem for each package of module that no layer places
// and each import from a lower layer to a higher one.
func check(p *placement, module string, pkgs []pkg) []string {
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	var problems []string
	for _, pk := range pkgs {
		from, ok := rel(pk.ImportPath)
		if !ok {
			continue
		}
		lf, ok := p.of(from)
		if !ok {
			problems = append(problems, fmt.Sprintf("package %s has no layer in %s: add it to the table", from, doc))
			continue
		}
		for _, imp := range pk.Imports {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			if lt, ok := p.of(to); ok && lt > lf {
				problems = append(problems, fmt.Sprintf("%s (layer %s) imports %s (layer %s, higher)", from, p.layers[lf].name, to, p.layers[lt].name))
			}
		}
	}
	return problems
}

// TestLayers checks the real tree: every package placed, every import
// pointing down the layers, every pattern of the table in use.
func TestLayers(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := parseLayers(string(text))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Module", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var module string
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			pkg
			Module *struct {
				Path string
				Main bool
			}
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		// -deps lists the standard library and other modules too; only
		// this module's packages are placed.
		if p.Module == nil || !p.Module.Main {
			continue
		}
		module = p.Module.Path
		pkgs = append(pkgs, p.pkg)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of the module; want the whole tree", len(pkgs))
	}
	pl := &placement{layers: layers, used: map[string]bool{}}
	for _, problem := range check(pl, module, pkgs) {
		t.Error(problem)
	}
	for _, l := range layers {
		for _, pattern := range l.patterns {
			if !pl.used[pattern] {
				t.Errorf("%s: layer %s names %s, which places no package", doc, l.name, pattern)
			}
		}
	}
}

// TestCheck shows that check catches what it is for, on a made-up graph.
func TestCheck(t *testing.T) {
	layers, err := parseLayers(`# x

## Layers

| Layer | Packages | What |
|---|---|---|
| low | ` + "`internal/low` `internal/leaf/...`" + ` | |
| high | ` + "`internal/high/...` `internal/leaf/up`" + ` | |

## After
| not | ` + "`internal/ignored`" + ` | |
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 || layers[0].name != "low" || len(layers[1].patterns) != 2 {
		t.Fatalf("parsed %+v", layers)
	}
	const m = "example.com/m"
	pkgs := []pkg{
		{ImportPath: m + "/internal/high/x", Imports: []string{m + "/internal/low", "fmt"}}, // down: fine
		{ImportPath: m + "/internal/low", Imports: []string{m + "/internal/leaf/a"}},        // same layer: fine
		{ImportPath: m + "/internal/leaf/a", Imports: []string{m + "/internal/high/x"}},     // up
		{ImportPath: m + "/internal/leaf/b", Imports: []string{m + "/internal/leaf/up"}},    // up, by the longer pattern
		{ImportPath: m + "/internal/stray", Imports: nil},                                   // unplaced
		{ImportPath: "other.org/x", Imports: []string{m + "/internal/high/x"}},              // not ours
		{ImportPath: m + "/internal/ignored", Imports: []string{m + "/internal/high/x"}},    // only after the table: unplaced
	}
	got := check(&placement{layers: layers}, m, pkgs)
	want := []string{
		"internal/leaf/a (layer low) imports internal/high/x (layer high, higher)",
		"internal/leaf/b (layer low) imports internal/leaf/up (layer high, higher)",
		"package internal/stray has no layer in " + doc + ": add it to the table",
		"package internal/ignored has no layer in " + doc + ": add it to the table",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
