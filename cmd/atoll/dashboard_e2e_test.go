package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
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
// goes up and comes back down, the list's columns, stop and start, the
// network policy shown and changed, a template's two versions and the
// sandbox that holds the old one, usage shows a CPU burn by sandbox,
// label and template, a revoked key goes back to the sign-in page, the
// pages fit a narrow window, and the sandbox is deleted. With
// ATOLL_UI_SCREENSHOTS=DIR it saves screenshots of the main pages there
// (docs/img for docs/dashboard.md).
//
// The server runs with networking on in a network of its own (netWorld),
// and the browser in its namespace, so that the network page's policy is
// real: the program checks what names resolve and which hosts answer from
// inside the sandbox (allowed.example, other.example) before and after it
// changes the policy on the page.
func TestDashboardBrowser(t *testing.T) {
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	dir, node, chromium := dashboardProgram(t)
	w := newNetWorld(t)
	d := startDaemonIn(t, filepath.Join(testenv.Dir(t), "data"), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--network-pool", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key, "CHROMIUM="+chromium)
	// Strict, a part of the server the browser finds missing (logs,
	// events, usage, audit, networking) fails the test rather than being
	// checked to say "not available".
	if testenv.Strict() {
		cmd.Env = append(cmd.Env, "ATOLL_TEST_STRICT=1")
	}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := nettest.In(w.host, cmd.Start); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	t.Logf("node test.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the dashboard's browser test failed: %v\nserver log:\n%s", err, d.out.String())
	}
}
