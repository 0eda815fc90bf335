package main

// What a newcomer meets on a fresh machine, following README.md: each test
// here failed before its fix.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// pathWithout returns a PATH directory holding every command on PATH but
// the ones named.
func pathWithout(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			skip := false
			for _, n := range names {
				skip = skip || e.Name() == n
			}
			if !skip {
				os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name())) // the first on PATH wins
			}
		}
	}
	return dir
}

// TestRuntimesReason: a runtime the host cannot offer says why, naming the
// missing package, in GET /v1/runtimes and in `atoll runtimes`.
func TestRuntimesReason(t *testing.T) {
	testenv.RequireRoot(t)
	for _, c := range []string{"qemu-system-x86_64", "mkfs.ext4", "rsync"} {
		testenv.RequireCommand(t, c)
	}
	d := startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: testenv.Dir(t),
		env:  []string{"PATH=" + pathWithout(t, "rsync", "runsc")},
		args: []string{"--warm-pool", "0", "--prestart", "0"}})
	rts, err := d.client().Runtimes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"vm":     "rsync is not installed (package rsync)",
		"gvisor": "runsc (gVisor) is not installed",
	}
	for _, rt := range rts {
		if w, ok := want[rt.Name]; ok {
			if rt.Available || rt.Reason != w {
				t.Errorf("%s: available %v, reason %q; want %q", rt.Name, rt.Available, rt.Reason, w)
			}
			delete(want, rt.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v", want)
	}
	out, _ := d.cli("runtimes")
	if !strings.Contains(out, "rsync is not installed (package rsync)") {
		t.Errorf("atoll runtimes:\n%s", out)
	}
}

// TestServeDataNotTraversable: a --data under a directory other users
// cannot pass through (mktemp -d makes them 0700) is refused at start, with
// the directory and the fix named; before, the server started and every
// create failed.
func TestServeDataNotTraversable(t *testing.T) {
	testenv.RequireRoot(t)
	parent := filepath.Join(testenv.Dir(t), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(parent, "data")
	out, err := exec.Command(atollBinary(t), "serve", "--listen", "127.0.0.1:0", "--data", data, "--network", "off").CombinedOutput()
	if err == nil {
		t.Fatalf("atoll serve started with --data under a 0700 directory:\n%s", out)
	}
	for _, want := range []string{parent + " (mode 0700)", "chmod o+x " + parent} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "layers")); err == nil {
		t.Error("the refused server made its layer store")
	}
}
