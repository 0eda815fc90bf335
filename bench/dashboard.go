package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// dashboard times the web dashboard's loads in Debian's chromium through
// playwright-core (cmd/atoll/testdata/dashboard/bench.mjs) on a quiet
// server with ten running sandboxes: the sign-in page from nothing cached,
// the sandbox list signed in from nothing cached and reloaded, and a
// sandbox's terminal to its prompt.
func dashboard(r *report, srv *server, n int) {
	dir, err := filepath.Abs("cmd/atoll/testdata/dashboard")
	check(err)
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	chromium, err3 := exec.LookPath("chromium")
	if err1 != nil || err2 != nil || err3 != nil {
		r.missing("node, npm and chromium (the dashboard)")
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		ci := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		ci.Dir = dir
		if out, err := ci.CombinedOutput(); err != nil {
			r.failed("dashboard", fmt.Sprintf("npm ci: %v: %s", err, out))
			return
		}
	}
	c := srv.client()
	ctx := context.Background()
	var ids []string
	for i := 0; i < 10; i++ {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"bench": "dashboard"}})
		check(err)
		ids = append(ids, sb.ID)
	}
	defer func() {
		for _, id := range ids {
			c.DeleteSandbox(ctx, id)
		}
	}()
	// Let the sandboxes settle (their first metrics samples) so that the
	// server is quiet while the pages load.
	time.Sleep(6 * time.Second)
	cmd := exec.Command(node, "bench.mjs", fmt.Sprint(n))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ATOLL_URL="+srv.url, "ATOLL_API_KEY="+srv.key, "CHROMIUM="+chromium, "ATOLL_SANDBOX="+ids[0])
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		r.failed("dashboard", fmt.Sprintf("node bench.mjs: %v", err))
		return
	}
	var js struct {
		Signin, List, Reload, Terminal   []float64
		SigninPage, ListPage, ReloadPage []float64
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &js); err != nil {
		r.failed("dashboard", fmt.Sprintf("bench.mjs printed %q", out))
		return
	}
	// "page": timed by the page from its navigation start; "chromium":
	// from the driving program, round trips to the browser included.
	r.add("dashboard first load → sign-in form (nothing cached)", "page", millis(js.SigninPage))
	r.add("dashboard first load → sign-in form (nothing cached)", "chromium", millis(js.Signin))
	r.add("dashboard first load → list of 10 sandboxes, signed in (nothing cached)", "page", millis(js.ListPage))
	r.add("dashboard first load → list of 10 sandboxes, signed in (nothing cached)", "chromium", millis(js.List))
	r.add("dashboard reload → list of 10 sandboxes (revalidated)", "page", millis(js.ReloadPage))
	r.add("dashboard reload → list of 10 sandboxes (revalidated)", "chromium", millis(js.Reload))
	r.add("dashboard terminal page → shell prompt", "chromium", millis(js.Terminal))
}
