package errdefs

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// TestOneTable checks that every kind this package declares has exactly one
// row in kinds, that every code of api.ErrorCodes but internal has exactly
// one kind, and that the OpenAPI spec lists the same codes.
func TestOneTable(t *testing.T) {
	// The kinds are the package's Err variables, read from its source so
	// that a new one without a row fails here.
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errdefs.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]error{
		"ErrInvalid": ErrInvalid, "ErrNotFound": ErrNotFound, "ErrConflict": ErrConflict,
		"ErrUnavailable": ErrUnavailable, "ErrUnauthorized": ErrUnauthorized, "ErrForbidden": ErrForbidden,
		"ErrQuota": ErrQuota, "ErrTooLarge": ErrTooLarge,
	}
	var names []string
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
			for _, spec := range g.Specs {
				for _, n := range spec.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	for _, name := range names {
		kind, ok := declared[name]
		if !ok {
			t.Errorf("%s is new: add it to this test and a row to kinds and api.ErrorCodes", name)
			continue
		}
		rows := 0
		for _, k := range kinds {
			if k.kind == kind {
				rows++
			}
		}
		if rows != 1 {
			t.Errorf("%s has %d rows in kinds, want 1", name, rows)
		}
		if got := FromCode(Code(fmt.Errorf("doing something: %w", kind))); got != kind {
			t.Errorf("%s: code %s reads back as %v", name, Code(kind), got)
		}
	}
	if len(names) != len(declared) {
		t.Errorf("errdefs.go declares %v, the test knows %d kinds", names, len(declared))
	}
	var codes []string
	for _, row := range api.ErrorCodes {
		codes = append(codes, row.Code)
		n := 0
		for _, k := range kinds {
			if k.code == row.Code {
				n++
			}
		}
		want := 1
		if row.Code == api.CodeInternal {
			want = 0 // errors of no kind
		}
		if n != want {
			t.Errorf("code %s has %d kinds, want %d", row.Code, n, want)
		}
	}
	for _, k := range kinds {
		if !slices.Contains(codes, k.code) {
			t.Errorf("kind %v: code %s is not in api.ErrorCodes", k.kind, k.code)
		}
	}
	if Code(errors.New("a bug")) != api.CodeInternal || Status(errors.New("a bug")) != 500 {
		t.Error("an error of no kind is not internal")
	}

	// The spec's enums of codes are the table's.
	spec, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(codes)
	enums := regexp.MustCompile(`enum: \[(invalid, [a-z_, ]+)\]`).FindAllSubmatch(spec, -1)
	if len(enums) == 0 {
		t.Fatal("no enum of error codes in api/openapi.yaml")
	}
	for _, m := range enums {
		got := strings.Split(string(m[1]), ", ")
		slices.Sort(got)
		if !slices.Equal(got, codes) {
			t.Errorf("openapi.yaml lists %v, api.ErrorCodes %v", got, codes)
		}
	}
}

func TestMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: no such sandbox", ErrNotFound), "no such sandbox"},
		{fmt.Errorf("creating: %w", fmt.Errorf("%w: no such template", ErrNotFound)), "creating: not found: no such template"},
		{&Busy{Kind: ErrUnavailable, Msg: "busy"}, "busy"},
		{errors.New("invalid argument: not a kind"), "invalid argument: not a kind"},
	} {
		if got := Message(c.err); got != c.want {
			t.Errorf("Message(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}
