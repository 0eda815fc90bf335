package layers

import (
	"errors"
	"testing"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TestEntryName checks tar entry names, including those archive/tar itself
// never returns (a NUL byte).
func TestEntryName(t *testing.T) {
	for name, want := range map[string]string{
		"a":           "a",
		"./a/b/":      "a/b",
		"a//b/./c":    "a/b/c",
		"a/../b":      "b",
		".":           ".",
		"./":          ".",
		"../a":        "",
		"a/../../b":   "",
		"..":          "",
		"/etc/passwd": "",
		"/":           "",
		"":            "",
		"a\x00b":      "",
	} {
		got, err := entryName(name)
		if want == "" {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("entryName(%q) = %q, %v; want invalid", name, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("entryName(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}
