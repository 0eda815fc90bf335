package server

import (
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

func TestPackageComment(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "server.go", nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), "Package server ") {
		t.Error("server.go has no package comment starting \"Package server \"")
	}
}
