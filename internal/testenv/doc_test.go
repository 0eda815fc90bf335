package testenv

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageComments checks that every package in the module says what it is
// for, in a comment "Package name ..." (or "Command name ..." for mains).
func TestPackageComments(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}} {{.Name}}", "github.com/atoll-dev/atoll/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, name, _ := strings.Cut(line, " ")
		pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range pkgs {
			for _, f := range p.Files {
				if f.Doc == nil {
					continue
				}
				text := f.Doc.Text()
				if strings.HasPrefix(text, "Package "+name+" ") || name == "main" && strings.HasPrefix(text, "Command ") {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: no package comment", filepath.Base(dir))
		}
	}
}
