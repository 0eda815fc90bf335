package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// dashboardProgram installs playwright-core (npm ci, pinned by its lock) if
// it is not there yet, finds Debian's chromium, and returns the directory
// of the browser programs, node and chromium.
func dashboardProgram(t *testing.T) (dir, node, chromium string) {
	t.Helper()
	node, npm := requireNode(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Skip(t, "chromium is not installed (scripts/test.sh installs Debian's chromium)")
	}
	if dir, err = filepath.Abs("testdata/dashboard"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core", "package.json")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	return dir, node, chromium
}

// TestDashboardBrowser drives the web dashboard that the real `atoll
// serve` serves at /ui in a real browser (Debian's chromium through
// playwright-core, testdata/dashboard/test.mjs): a wrong key is refused,
// sign in, create a sandbox, `echo hi` in its terminal shows hi, a file
// goes up and comes back down, usage shows a CPU burn (where the server
// meters usage), a revoked key goes back to the sign-in page, the pages
// fit a narrow window, and the sandbox is deleted. With
// ATOLL_UI_SCREENSHOTS=DIR it saves screenshots of the main pages there
// (docs/img for docs/dashboard.md).
func TestDashboardBrowser(t *testing.T) {
	dir, node, chromium := dashboardProgram(t)
	d, _, _ := startRooted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key, "CHROMIUM="+chromium)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node test.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the dashboard's browser test failed: %v\nserver log:\n%s", err, d.out.String())
	}
}
