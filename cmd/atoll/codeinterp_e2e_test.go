package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// codeInterpreter is a server with the code-interpreter template, made as
// an operator would: atoll template bootstrap code-interpreter, which
// bootstraps Debian from its mirror (through serveMirror's proxy) and
// builds templates/code-interpreter over it, whose RUN steps install
// Jupyter, matplotlib and pandas from the same mirror and deno from the
// npm registry behind the same proxy (--build-arg NPM_REGISTRY).
type codeInterpreter struct {
	d       *daemon
	w       *netWorld
	dir     string // testdata/e2b, with the SDKs installed
	nodeBin string
}

func startCodeInterpreter(t *testing.T) *codeInterpreter {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "debootstrap")
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	dir, node := e2bProgram(t)
	w := newNetWorld(t)
	mirror := serveMirror(t, w)
	d := startDaemonIn(t, filepath.Join(testenv.Dir(t), "data"), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--network-pool", "1", "--proxy-listen", "127.0.0.1:0")
	t0 := time.Now()
	out, code := d.cli("template", "bootstrap", "code-interpreter", "--mirror", mirror, "--build-arg", "NPM_REGISTRY="+npmMirrorURL)
	if code != 0 {
		t.Fatalf("template bootstrap code-interpreter: %s\nserver log:\n%s", out, d.out.String())
	}
	for _, want := range []string{"Setting up python3-ipykernel", "Setting up python3-pandas", "deno 2.9.6 from " + npmMirrorURL} {
		if !strings.Contains(out, want) {
			t.Errorf("the build's output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("bootstrap code-interpreter (debootstrap, then the build) %v", time.Since(t0).Round(time.Second))
	// What deno costs the build: install_deno.py says its sizes and time.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "deno ") {
			t.Log(line)
		}
	}
	return &codeInterpreter{d: d, w: w, dir: dir, nodeBin: node}
}

// node runs a program of testdata/e2b against the server.
func (ci *codeInterpreter) node(t *testing.T, program string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ci.nodeBin, "--test-reporter=spec", program)
	cmd.Dir = ci.dir
	cmd.Env = e2bEnv(ci.d)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := nettest.In(ci.w.host, cmd.Start); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	return out.String(), err
}

// TestCodeInterpreter builds the code-interpreter template and runs E2B's
// code-interpreter SDK, unchanged, against it (testdata/e2b/codeinterp.mjs):
// state across calls, contexts, streaming order, errors, matplotlib and
// pandas results, timeouts, restarts, bash; then atoll's own clients: the
// Go SDK (codeAPI), the MCP run_code tool (codeMCP) and the Python SDK
// (sdk/python/tests/test_code.py).
func TestCodeInterpreter(t *testing.T) {
	ci := startCodeInterpreter(t)
	out, err := ci.node(t, "codeinterp.mjs")
	t.Logf("node codeinterp.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the code-interpreter SDK program failed: %v\nserver log:\n%s", err, ci.d.out.String())
	}
	t.Run("api", func(t *testing.T) { codeAPI(t, ci) })
	t.Run("mcp", func(t *testing.T) { codeMCP(t, ci) })
	t.Run("python", func(t *testing.T) {
		if n := runPythonTests(t, ci.d, "test_code.py", "ATOLL_TEST_CODE_TEMPLATE=code-interpreter"); n < 4 {
			t.Errorf("only %d Python tests ran, want 4", n)
		}
	})
}

// codeAPI checks atoll's own code API on a code-interpreter sandbox: the
// Go SDK's RunCode and contexts, hostile requests, and atoll run-code.
func codeAPI(t *testing.T, ci *codeInterpreter) {
	ctx := context.Background()
	c := ci.d.client()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "code-interpreter"})
	defer c.DeleteSandbox(ctx, sb.ID)

	// State across calls, streamed output in order, the main result.
	if _, err := c.RunCode(ctx, sb.ID, "a = 6", atoll.RunCodeOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	ex, err := c.RunCode(ctx, sb.ID, "import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\nprint('three')\na * 7", atoll.RunCodeOptions{
		OnStdout: func(s string) { seen = append(seen, "out "+s) },
		OnStderr: func(s string) { seen = append(seen, "err "+s) },
	})
	if err != nil || ex.Text() != "42" || ex.Error != nil || ex.ExecutionCount < 2 {
		t.Errorf("RunCode: %+v, %v", ex, err)
	}
	if want := []string{"out one\n", "err two\n", "out three\n"}; !slices.Equal(seen, want) {
		t.Errorf("streamed %q, want %q", seen, want)
	}
	// An exception is the execution's error, not the call's.
	ex, err = c.RunCode(ctx, sb.ID, "raise KeyError('k')", atoll.RunCodeOptions{})
	if err != nil || ex.Error == nil || ex.Error.Name != "KeyError" || !strings.Contains(ex.Error.Traceback, "KeyError") {
		t.Errorf("exception: %+v, %v", ex.Error, err)
	}
	// A plot, as PNG.
	ex, err = c.RunCode(ctx, sb.ID, "import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])\nplt.show()", atoll.RunCodeOptions{})
	if err != nil || len(ex.Results) != 1 || !strings.HasPrefix(ex.Results[0].PNG, "iVBORw0KGgo") {
		t.Errorf("plot: %+v, %v", ex.Results, err)
	}
	// Contexts: apart, listed, restarted, removed.
	cc, err := c.CreateCodeContext(ctx, sb.ID, api.CreateCodeContextRequest{Cwd: "/tmp"})
	if err != nil || cc.Language != "python" || cc.Cwd != "/tmp" {
		t.Fatalf("CreateCodeContext: %+v, %v", cc, err)
	}
	ex, _ = c.RunCode(ctx, sb.ID, "a", atoll.RunCodeOptions{Context: cc.ID})
	if ex.Error == nil || ex.Error.Name != "NameError" {
		t.Errorf("a new context sees the default one's a: %+v", ex)
	}
	cs, err := c.ListCodeContexts(ctx, sb.ID)
	if err != nil || !slices.ContainsFunc(cs, func(x api.CodeContext) bool { return x.ID == cc.ID }) {
		t.Errorf("ListCodeContexts: %+v, %v", cs, err)
	}
	c.RunCode(ctx, sb.ID, "b = 1", atoll.RunCodeOptions{Context: cc.ID})
	if err := c.RestartCodeContext(ctx, sb.ID, cc.ID); err != nil {
		t.Fatal(err)
	}
	if ex, _ := c.RunCode(ctx, sb.ID, "b", atoll.RunCodeOptions{Context: cc.ID}); ex.Error == nil || ex.Error.Name != "NameError" {
		t.Errorf("after a restart b is still there: %+v", ex)
	}
	if err := c.RemoveCodeContext(ctx, sb.ID, cc.ID); err != nil {
		t.Fatal(err)
	}
	// A deadline interrupts; the context goes on.
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = c.RunCode(tctx, sb.ID, "import time\nwhile True: time.sleep(0.01)", atoll.RunCodeOptions{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a looping execution past its deadline: %v", err)
	}
	if ex, err := c.RunCode(ctx, sb.ID, "a + 1", atoll.RunCodeOptions{}); err != nil || ex.Text() != "7" {
		t.Errorf("after the interrupt: %+v, %v", ex, err)
	}
	// bash.
	ex, err = c.RunCode(ctx, sb.ID, "V=hi; echo $V", atoll.RunCodeOptions{Language: "bash"})
	if err != nil || !slices.Equal(ex.Stdout, []string{"hi\n"}) {
		t.Errorf("bash: %+v, %v", ex, err)
	}

	// Hostile and wrong requests: clear 4xx, never a 500.
	for _, tc := range []struct {
		name string
		call func() error
		kind error
	}{
		{"unknown language", func() error {
			_, err := c.RunCode(ctx, sb.ID, "1", atoll.RunCodeOptions{Language: "cobol"})
			return err
		}, atoll.ErrInvalid},
		{"context and language", func() error {
			_, err := c.RunCode(ctx, sb.ID, "1", atoll.RunCodeOptions{Language: "python", Context: "x"})
			return err
		}, atoll.ErrInvalid},
		{"unknown context", func() error {
			_, err := c.RunCode(ctx, sb.ID, "1", atoll.RunCodeOptions{Context: "no-such-context"})
			return err
		}, atoll.ErrNotFound},
		{"remove unknown context", func() error { return c.RemoveCodeContext(ctx, sb.ID, "no-such-context") }, atoll.ErrNotFound},
		{"cwd not a directory", func() error {
			_, err := c.CreateCodeContext(ctx, sb.ID, api.CreateCodeContextRequest{Cwd: "/no/such/dir"})
			return err
		}, atoll.ErrInvalid},
		{"unknown sandbox", func() error {
			_, err := c.RunCode(ctx, "aaaaaaaaaaaaaaaaaaaa", "1", atoll.RunCodeOptions{})
			return err
		}, atoll.ErrNotFound},
	} {
		if err := tc.call(); !errors.Is(err, tc.kind) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.kind)
		}
	}
	// A sandbox without the service: 503, saying what to do.
	host := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	defer c.DeleteSandbox(ctx, host.ID)
	if _, err := c.RunCode(ctx, host.ID, "1", atoll.RunCodeOptions{}); !errors.Is(err, atoll.ErrUnavailable) || !strings.Contains(err.Error(), "code-interpreter template") {
		t.Errorf("RunCode on a host sandbox: %v", err)
	}

	// The CLI.
	dir := t.TempDir()
	write := func(name, code string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if out, code := ci.d.cli("run-code", sb.ID, write("ok.py", "print('printed')\na * 100")); code != 0 || out != "printed\n600\n" {
		t.Errorf("run-code: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("run-code", sb.ID, write("bad.py", "1/0")); code != 1 || !strings.Contains(out, "ZeroDivisionError") {
		t.Errorf("run-code of an exception: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("run-code", sb.ID, "--language", "bash", write("x.sh", "echo $((6 * 7))")); code != 0 || out != "42\n" {
		t.Errorf("run-code --language bash: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("run-code", sb.ID, "--language", "ts", write("x.ts", "const s: string = 'six'\nconsole.log(s)\n6 * 7")); code != 0 || out != "six\n42\n" {
		t.Errorf("run-code --language ts: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("run-code", sb.ID, "--timeout", "1s", write("loop.py", "while True: pass")); code != 124 || !strings.Contains(out, "interrupted") {
		t.Errorf("run-code --timeout: exit %d, %q", code, out)
	}
	out, code := ci.d.cli("run-code", sb.ID, "--json", write("df.py", "import pandas as pd\npd.DataFrame({'x': [1]})"))
	var last api.CodeEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if err := json.Unmarshal([]byte(line), &last); err != nil {
			t.Errorf("run-code --json printed %q: %v", line, err)
		}
	}
	if code != 0 || last.Type != api.CodeResult || !strings.Contains(last.HTML, "<table") {
		t.Errorf("run-code --json: exit %d, %q", code, out)
	}

	// Code contexts through the CLI: made, shared by two runs whose code
	// comes from stdin, apart from the default context, listed, restarted,
	// removed.
	out, code = ci.d.cli("code-context", "create", sb.ID, "--cwd", "/tmp")
	cid := strings.TrimSpace(out)
	if code != 0 || cid == "" || strings.ContainsAny(cid, " \n") {
		t.Fatalf("code-context create: exit %d, %q", code, out)
	}
	if out, code := ci.d.cliIn("shared = 20\n", "run-code", sb.ID, "--context", cid, "-"); code != 0 || out != "" {
		t.Errorf("run-code --context - (set): exit %d, %q", code, out)
	}
	if out, code := ci.d.cliIn("import os\nprint(os.getcwd())\nshared + 22", "run-code", sb.ID, "--context", cid, "-"); code != 0 || out != "/tmp\n42\n" {
		t.Errorf("run-code --context - (use): exit %d, %q", code, out)
	}
	if out, code := ci.d.cliIn("shared", "run-code", sb.ID, "-"); code != 1 || !strings.Contains(out, "NameError") {
		t.Errorf("the default context sees the CLI context's variable: exit %d, %q", code, out)
	}
	out, code = ci.d.cli("code-context", "ls", sb.ID)
	if code != 0 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(cid)+` +python +/tmp$`).MatchString(out) || !strings.HasPrefix(out, "ID ") {
		t.Errorf("code-context ls: exit %d, %q", code, out)
	}
	var listed []api.CodeContext
	if out, code := ci.d.cli("code-context", "ls", sb.ID, "--json"); code != 0 || json.Unmarshal([]byte(out), &listed) != nil ||
		!slices.Contains(listed, api.CodeContext{ID: cid, Language: "python", Cwd: "/tmp"}) {
		t.Errorf("code-context ls --json: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("code-context", "restart", sb.ID, cid); code != 0 || out != "" {
		t.Errorf("code-context restart: exit %d, %q", code, out)
	}
	if out, code := ci.d.cliIn("shared", "run-code", sb.ID, "--context", cid, "-"); code != 1 || !strings.Contains(out, "NameError") {
		t.Errorf("after code-context restart: exit %d, %q", code, out)
	}
	if out, code := ci.d.cli("code-context", "rm", sb.ID, cid); code != 0 || out != "" {
		t.Errorf("code-context rm: exit %d, %q", code, out)
	}
	for _, args := range [][]string{
		{"run-code", sb.ID, "--context", cid, "-"},
		{"code-context", "restart", sb.ID, cid},
		{"code-context", "rm", sb.ID, cid},
	} {
		if out, code := ci.d.cliIn("1", args...); code != 1 || out != "atoll: code interpreter: context "+cid+" not found\n" {
			t.Errorf("%s after rm: exit %d, %q", strings.Join(args[:2], " "), code, out)
		}
	}
	if out, code := ci.d.cli("code-context", "create", sb.ID, "--language", "cobol"); code != 1 || !strings.Contains(out, "not supported") {
		t.Errorf("code-context create --language cobol: exit %d, %q", code, out)
	}
	bash, code := ci.d.cli("code-context", "create", sb.ID, "--language", "bash", "--json")
	var bc api.CodeContext
	if code != 0 || json.Unmarshal([]byte(bash), &bc) != nil || bc.Language != "bash" || bc.Cwd != "/home/user" {
		t.Errorf("code-context create --language bash --json: exit %d, %q", code, bash)
	}
	if out, code := ci.d.cliIn("cd /tmp\n", "run-code", sb.ID, "--context", bc.ID, "-"); code != 0 || out != "" {
		t.Errorf("run-code in a bash context: exit %d, %q", code, out)
	}
	if out, code := ci.d.cliIn("pwd", "run-code", sb.ID, "--context", bc.ID, "-"); code != 0 || out != "/tmp\n" {
		t.Errorf("a bash context's cwd: exit %d, %q", code, out)
	}
}
