package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
)

func TestParseVaultFlags(t *testing.T) {
	got, err := parseVaultFlags([]string{"notes", "hb:ro", "w:rw=/work/w", "x:ro=/srv/x"})
	want := []api.VaultMount{{Name: "notes"}, {Name: "hb", ReadOnly: true}, {Name: "w", Path: "/work/w"}, {Name: "x", ReadOnly: true, Path: "/srv/x"}}
	if err != nil || !cmp.Equal(got, want) {
		t.Fatalf("parseVaultFlags: %v %v", got, err)
	}
	for _, bad := range []string{"notes:wo", "notes:ro:rw", "notes:=/x"} {
		if _, err := parseVaultFlags([]string{bad}); err == nil {
			t.Errorf("--vault %q was taken", bad)
		}
	}
}
