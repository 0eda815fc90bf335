package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// debianMirror is where the base template's packages come from, through
// the proxy serveMirror puts in a netWorld.
const debianMirror = "http://deb.debian.org"

// npmRegistry is where the code-interpreter template's deno comes from,
// through the same proxy at http://wInet4:8080/npm.
const npmRegistry = "https://registry.npmjs.org"

// serveMirror serves Debian's mirror inside w's "internet", at
// http://wInet4:8080/debian: the server, its sandboxes and their apt reach
// the real packages without networking in the host's namespace. The npm
// registry is at /npm (npmMirrorURL).
func serveMirror(t *testing.T, w *netWorld) string {
	t.Helper()
	ln := nettest.Listen(t, w.inet, "tcp", wInet4+":8080")
	proxyTo := func(upstream string) http.Handler {
		up, err := url.Parse(upstream)
		if err != nil {
			t.Fatal(err)
		}
		return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(up)
			r.Out.Host = up.Host
		}}
	}
	mux := http.NewServeMux()
	mux.Handle("/", proxyTo(debianMirror))
	mux.Handle("/npm/", http.StripPrefix("/npm", proxyTo(npmRegistry)))
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + wInet4 + ":8080/debian"
}

// npmMirrorURL is the npm registry as serveMirror serves it.
const npmMirrorURL = "http://" + wInet4 + ":8080/npm"

// TestBaseTemplate makes the base template as an operator would (atoll
// template bootstrap base: debootstrap from Debian's mirror, then
// templates/base/Dockerfile, whose RUN steps apt-get from the same mirror
// in networked build sandboxes), then runs the e2b SDK's program
// testdata/e2b/base.mjs against it: E2B's "base" now means it, with python,
// sudo for user, node, npm, curl and git. Before it exists "base" is the
// host template. It also times creates of it against the host template's.
func TestBaseTemplate(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "debootstrap")
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	dir, node := e2bProgram(t)
	w := newNetWorld(t)
	mirror := serveMirror(t, w)
	// No warm pool, so that the host template's creates are timed cold
	// like the base template's.
	d := startDaemonIn(t, filepath.Join(testenv.Dir(t), "data"), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--network-pool", "1", "--warm-pool", "0")
	c := d.client()
	ctx := context.Background()

	runBase := func(template string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "base.mjs")
		cmd.Dir = dir
		cmd.Env = append(e2bEnv(d), "E2B_TEST_TEMPLATE="+template)
		cmd.WaitDelay = 5 * time.Second
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := nettest.In(w.host, cmd.Start); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		return out.String(), err
	}
	// Before: "base" is the host template, which lacks python and sudo.
	out, err := runBase("host")
	if err == nil || !strings.Contains(out, "✔ the default template is atoll's base template") ||
		!strings.Contains(out, "✖ commands.run: python --version") {
		t.Errorf("before the bootstrap, base.mjs should pass its first test (base is host) and fail on python:\n%s", out)
	}

	t0 := time.Now()
	out, code := d.cli("template", "bootstrap", "base", "--mirror", mirror)
	took := time.Since(t0)
	if code != 0 {
		t.Fatalf("template bootstrap base: %s\nserver log:\n%s", out, d.out.String())
	}
	t.Logf("atoll template bootstrap base took %v", took.Round(time.Second))
	if !strings.HasPrefix(out, "base\n") {
		t.Errorf("bootstrap printed no template name first:\n%s", out)
	}
	for _, want := range []string{"Base system installed successfully", "Step 3/", "Setting up python3"} {
		if !strings.Contains(out, want) {
			t.Errorf("bootstrap output lacks %q:\n%s", want, out)
		}
	}
	tm, err := c.GetTemplate(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	if !tm.Setuid || tm.Workdir != "/home/user" || !strings.HasPrefix(tm.Source, "debootstrap bookworm "+mirror+" + templates/base") {
		t.Errorf("base template: setuid %v, workdir %q, source %q", tm.Setuid, tm.Workdir, tm.Source)
	}
	t.Logf("base template: %d layers", len(tm.Layers))

	out, err = runBase("base")
	t.Logf("node base.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the e2b SDK program failed on the base template: %v\nserver log:\n%s", err, d.out.String())
	}

	// Through atoll's API, on each runtime that runs here: other
	// templates keep no_new_privs; base sandboxes do not have it, and
	// user's sudo is the sandbox's root.
	for _, rt := range []string{"ns", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireCommand(t, "runsc")
			}
			for _, tc := range []struct{ template, want string }{
				{"host", "no_new_privs 1\nsudo no\n"}, {"base", "no_new_privs 0\nsudo 0\n"},
			} {
				sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: tc.template, Runtime: rt})
				var out bytes.Buffer
				code, err := c.Exec(ctx, sb.ID, api.ExecRequest{User: "user",
					Shell: "grep NoNewPrivs /proc/self/status | awk '{print \"no_new_privs\", $2}'; echo sudo $(sudo -n id -u 2>/dev/null || echo no)"}, &out, &out)
				if err != nil || code != 0 || out.String() != tc.want {
					t.Errorf("%s as user: %q (exit %d, %v), want %q", tc.template, out.String(), code, err, tc.want)
				}
				c.DeleteSandbox(ctx, sb.ID)
			}
		})
	}

	// Creates of base against host, alternating, cold (no pool).
	times := map[string][]time.Duration{}
	for i := 0; i < 10; i++ {
		for _, tmpl := range []string{"host", "base"} {
			t0 := time.Now()
			sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: tmpl})
			times[tmpl] = append(times[tmpl], time.Since(t0))
			c.DeleteSandbox(ctx, sb.ID)
		}
	}
	median := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	host, base := median(times["host"]), median(times["base"])
	t.Logf("create, median of 10: host %v, base %v", host.Round(time.Millisecond), base.Round(time.Millisecond))
	// Its layers are layers like any template's: a create is not a copy.
	if base > 2*host+200*time.Millisecond {
		t.Errorf("creating a base sandbox took %v, host %v: %s", base, host, fmt.Sprint(times))
	}
}
