package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestDataDirPaths checks that the data directory's paths are distinct and
// inside it.
func TestDataDirPaths(t *testing.T) {
	d := dataDir("/var/lib/atoll")
	paths := append([]string{d.Store(), d.Layers(), d.Bin(), d.Lowers(), d.Run("ns"), d.Run("gvisor"), d.Run("vm"),
		d.Checkpoints(), d.Archive(), d.PortKey(), d.E2BTokenKey(), d.URL(), d.TLSURL(), d.APIKey(), d.CACert()}, d.OldLowers()...)
	seen := map[string]bool{}
	for _, p := range paths {
		if seen[p] {
			t.Errorf("%s named twice", p)
		}
		seen[p] = true
		if rel, err := filepath.Rel(string(d), p); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			t.Errorf("%s is not inside %s", p, d)
		}
	}
	if d.Run("ns") != "/var/lib/atoll/run" || d.Run("vm") != "/var/lib/atoll/run-vm" {
		t.Errorf("runtime directories moved: %s, %s (existing data directories hold them there)", d.Run("ns"), d.Run("vm"))
	}
}
