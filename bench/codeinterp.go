package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/netns"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// codeInterp measures the code interpreter (docs/code-interpreter.md): the
// first runCode after a create, the template's service having started
// with the sandbox, and a warm runCode('1+1'), through E2B's
// @e2b/code-interpreter (the port proxy) and atoll's Go SDK (the agent).
//
// The template is made first as an operator makes it, and as the test
// does: atoll template bootstrap code-interpreter, which bootstraps Debian
// from its mirror and builds templates/code-interpreter over it. The server runs in a
// network namespace of its own with networking on; its one route leads to
// a second namespace where the benchmark serves a proxy to Debian's mirror
// and the npm registry, so that the machine's own network is left alone and
// builds reach only those.
func codeInterp(r *report, work string, n int) {
	dir, err := filepath.Abs("cmd/atoll/testdata/e2b")
	check(err)
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		r.missing("node and npm (@e2b/code-interpreter)")
		return
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		r.missing("debootstrap (the code-interpreter template)")
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		ci := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		ci.Dir = dir
		if out, err := ci.CombinedOutput(); err != nil {
			r.failed("codeinterp", fmt.Sprintf("npm ci: %v: %s", err, out))
			return
		}
	}

	host, inet := "atoll-bench-ci", "atoll-bench-ci-inet"
	for _, ns := range []string{host, inet} {
		exec.Command("ip", "netns", "del", ns).Run()
		must("ip", "netns", "add", ns)
		defer exec.Command("ip", "netns", "del", ns).Run()
		must("ip", "-n", ns, "link", "set", "lo", "up")
	}
	must("ip", "-n", host, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", inet)
	must("ip", "-n", host, "addr", "add", "198.51.100.2/24", "dev", "up0")
	must("ip", "-n", inet, "addr", "add", "198.51.100.1/24", "dev", "eth0")
	must("ip", "-n", host, "link", "set", "up0", "up")
	must("ip", "-n", inet, "link", "set", "eth0", "up")
	must("ip", "-n", host, "route", "add", "default", "via", "198.51.100.1")
	var ln net.Listener
	check(netns.Run(filepath.Join("/run/netns", inet), func() (err error) {
		ln, err = net.Listen("tcp", "198.51.100.1:8080")
		return err
	}))
	// Debian's mirror, and at /npm the npm registry, whence the template's
	// build takes deno (templates/code-interpreter/install_deno.py).
	proxyTo := func(upstream string) http.Handler {
		up, _ := url.Parse(upstream)
		return &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.Out.Host = up.Host
		}}
	}
	mux := http.NewServeMux()
	mux.Handle("/", proxyTo("http://deb.debian.org"))
	mux.Handle("/npm/", http.StripPrefix("/npm", proxyTo("https://registry.npmjs.org")))
	mirror := &http.Server{Handler: mux}
	go mirror.Serve(ln)
	defer mirror.Close()

	srv := startServerIn(work, "codeinterp", filepath.Join("/run/netns", host), "--network", "on", "--network-bridge", "atollci",
		"--dns-upstream", "198.51.100.1", "--warm-pool", "0", "--prestart", "0", "--network-pool", "1", "--proxy-listen", "127.0.0.1:0")
	defer srv.stop()
	cli := func(args ...string) {
		cmd := exec.Command(srv.bin, args...)
		cmd.Env = append(os.Environ(), "ATOLL_URL="+srv.url, "ATOLL_API_KEY="+srv.key)
		out, err := outputIn(srv.netns, cmd)
		if err != nil {
			fatal("atoll %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t0 := time.Now()
	cli("template", "bootstrap", "code-interpreter", "--mirror", "http://198.51.100.1:8080/debian", "--build-arg", "NPM_REGISTRY=http://198.51.100.1:8080/npm")
	r.note(fmt.Sprintf("codeinterp: `atoll template bootstrap code-interpreter` (Debian bootstrapped, then the template's Dockerfile) took %v", time.Since(t0).Round(time.Second)))

	// atoll's Go SDK.
	c := srv.client()
	ctx := context.Background()
	var create, first, warm, jsFirst, jsWarm []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "code-interpreter"})
		check(err)
		t1 := time.Now()
		ex, err := c.RunCode(ctx, sb.ID, "1+1", atoll.RunCodeOptions{})
		check(err)
		if ex.Text() != "2" {
			fatal("RunCode('1+1') gave %+v", ex)
		}
		create, first = append(create, t1.Sub(t0)), append(first, time.Since(t1))
		if i == n-1 {
			for j := 0; j < n*10+5; j++ {
				t := time.Now()
				_, err := c.RunCode(ctx, sb.ID, "1+1", atoll.RunCodeOptions{})
				check(err)
				if j >= 5 {
					warm = append(warm, time.Since(t))
				}
			}
			// JavaScript: the first run starts deno's kernel; a warm one
			// waits the service's settle time after deno's idle
			// (templates/code-interpreter/server.py, SETTLE).
			js := atoll.RunCodeOptions{Language: "javascript"}
			for j := 0; j < n*10+5; j++ {
				t := time.Now()
				ex, err := c.RunCode(ctx, sb.ID, "1+1", js)
				check(err)
				if ex.Text() != "2" {
					fatal("RunCode('1+1', javascript) gave %+v", ex)
				}
				if j == 0 {
					jsFirst = append(jsFirst, time.Since(t))
				} else if j >= 5 {
					jsWarm = append(jsWarm, time.Since(t))
				}
			}
		}
		check(c.DeleteSandbox(ctx, sb.ID))
	}

	// E2B's SDK, from the server's namespace.
	cmd := exec.Command(node, "codeinterp-bench.mjs", fmt.Sprint(n))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+srv.url, "E2B_SANDBOX_URL="+srv.url, "E2B_API_KEY="+srv.key)
	out, err := outputIn(srv.netns, cmd)
	if err != nil {
		r.failed("codeinterp", fmt.Sprintf("node codeinterp-bench.mjs: %v: %s", err, out))
		return
	}
	var js struct{ Create, First, Warm []float64 }
	if err := json.Unmarshal([]byte(lastLine(out)), &js); err != nil {
		r.failed("codeinterp", fmt.Sprintf("codeinterp-bench.mjs printed %q", out))
		return
	}
	r.add("E2B code-interpreter SDK `Sandbox.create()` (code-interpreter-v1)", "sequential", millis(js.Create))
	r.add("E2B code-interpreter SDK first `runCode('1+1')` after create", "sequential", millis(js.First))
	r.add("E2B code-interpreter SDK warm `runCode('1+1')`", "sequential", millis(js.Warm))
	r.add("atoll Go SDK `CreateSandbox` of code-interpreter", "sequential", create)
	r.add("atoll Go SDK first `RunCode('1+1')` after create", "sequential", first)
	r.add("atoll Go SDK warm `RunCode('1+1')`", "sequential", warm)
	r.add("atoll Go SDK first `RunCode('1+1')` in JavaScript (starts deno's kernel)", "sequential", jsFirst)
	r.add("atoll Go SDK warm `RunCode('1+1')` in JavaScript", "sequential", jsWarm)
}

// outputIn runs cmd in the network namespace at ns and returns its
// output, stdout and stderr together.
func outputIn(ns string, cmd *exec.Cmd) (string, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := netns.Run(ns, cmd.Start); err != nil {
		return "", err
	}
	err := cmd.Wait()
	return out.String(), err
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
