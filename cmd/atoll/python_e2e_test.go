package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// The Python SDK (sdk/python) is tested the way a user meets it: installed
// with pip into a venv, with no package index, then its unittest suites
// (sdk/python/tests) run against a real server.

var (
	venvOnce sync.Once
	venvPy   string
	venvErr  error
)

// systemPython is Debian's python3, which the SDK promises to work with
// (a pyenv shim on PATH may be another).
func systemPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testenv.RequireCommand(t, "python3")
	return mustLookPath(t, "python3")
}

// pythonSDK installs sdk/python with pip into a venv, once per test
// binary, and returns the venv's python.
func pythonSDK(t *testing.T) string {
	t.Helper()
	py := systemPython(t)
	if err := exec.Command(py, "-c", "import venv, ensurepip").Run(); err != nil {
		testenv.Skip(t, "python3-venv is not installed")
	}
	venvOnce.Do(func() {
		dir, err := os.MkdirTemp("", "atoll-pyvenv-")
		if err != nil {
			venvErr = err
			return
		}
		os.Chmod(dir, 0o755)
		if out, err := exec.Command(py, "-m", "venv", dir).CombinedOutput(); err != nil {
			venvErr = &pyError{"python3 -m venv", err, out}
			return
		}
		src, _ := filepath.Abs("../../sdk/python")
		pip := exec.Command(filepath.Join(dir, "bin", "pip"), "install", "--no-index", src)
		pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1")
		if out, err := pip.CombinedOutput(); err != nil {
			venvErr = &pyError{"pip install ./sdk/python", err, out}
			return
		}
		venvPy = filepath.Join(dir, "bin", "python")
	})
	if venvErr != nil {
		t.Fatal(venvErr)
	}
	return venvPy
}

type pyError struct {
	what string
	err  error
	out  []byte
}

func (e *pyError) Error() string { return e.what + ": " + e.err.Error() + "\n" + string(e.out) }

// runPythonTests runs the unittest modules of sdk/python/tests matching
// pattern with the installed SDK (from a copy of the tests, so that the
// source tree's package is not the one imported), in the daemon's network
// namespace, against d. It fails t on a failed or skipped Python test and
// returns how many ran.
func runPythonTests(t *testing.T, d *daemon, pattern string, env ...string) int {
	t.Helper()
	py := pythonSDK(t)
	dir := testenv.Dir(t)
	if out, err := exec.Command("cp", "-r", "../../sdk/python/tests", dir).CombinedOutput(); err != nil {
		t.Fatalf("copying the tests: %v %s", err, out)
	}
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".", "-p", pattern)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"ATOLL_URL=" + d.url, "ATOLL_API_KEY=" + d.key,
		"PYTHONDONTWRITEBYTECODE=1"}, env...)...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := d.startCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	text := out.String()
	t.Logf("python3 -m unittest %s:\n%s", pattern, text)
	if err != nil {
		t.Fatalf("the Python tests failed: %v", err)
	}
	if m := regexp.MustCompile(`skipped=(\d+)`).FindStringSubmatch(text); m != nil {
		testenv.Skip(t, m[1]+" Python tests were skipped")
	}
	m := regexp.MustCompile(`Ran (\d+) tests?`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("the Python tests did not report how many ran")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// pythonDaemon starts a server with networking in a namespace of its own
// (its internet host at wInet4) for the Python suites.
func pythonDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	return startDaemonIn(t, testenv.Dir(t), w.host, append([]string{"--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4}, args...)...)
}

// TestPythonSDK runs the Python SDK's suites against a real server:
// test_sdk.py, every call of the client and the errors each raises, and
// test_harbor.py, atoll.harbor's environment through trials of the task
// in sdk/python/tests/tasks/hello.
func TestPythonSDK(t *testing.T) {
	d := pythonDaemon(t, "--warm-pool", "0", "--prestart", "0", "--network-pool", "0")
	for _, s := range []struct {
		pattern string
		min     int
	}{{"test_sdk.py", 30}, {"test_harbor.py", 7}} {
		t.Run(strings.TrimSuffix(s.pattern, ".py"), func(t *testing.T) {
			if n := runPythonTests(t, d, s.pattern, "ATOLL_TEST_INET="+wInet4); n < s.min {
				t.Errorf("only %d Python tests ran, want %d", n, s.min)
			}
		})
	}
}

// TestHarborBench measures how many trials of the hello task one node
// runs at once, all holding a sandbox together (sdk/python/tests/
// bench_harbor.py; figures in docs/evals.md). It runs only with
// ATOLL_HARBOR_BENCH set, to the levels of parallelism to measure
// ("1 8 16 32 64" when it is "1").
func TestHarborBench(t *testing.T) {
	levels := os.Getenv("ATOLL_HARBOR_BENCH")
	if levels == "" {
		t.Skip("a benchmark: set ATOLL_HARBOR_BENCH=1 (or to levels, e.g. \"8 64\") to run it")
	}
	if levels == "1" {
		levels = "1 8 16 32 64"
	}
	d := pythonDaemon(t)
	py := pythonSDK(t)
	dir := testenv.Dir(t)
	if out, err := exec.Command("cp", "-r", "../../sdk/python/tests", dir).CombinedOutput(); err != nil {
		t.Fatalf("copying the tests: %v %s", err, out)
	}
	cmd := exec.Command(py, append([]string{"-m", "tests.bench_harbor"}, strings.Fields(levels)...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := d.startCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	t.Logf("bench_harbor %s:\n%s", levels, out.String())
	if err != nil {
		t.Fatal(err)
	}
}

// TestPythonErrorCodes checks the Python SDK's table of error codes
// (atoll.errors.KINDS) against api.ErrorCodes, the one the server answers
// by.
func TestPythonErrorCodes(t *testing.T) {
	py := systemPython(t)
	cmd := exec.Command(py, "-c", `import json, atoll
print(json.dumps([{"Code": c, "Status": s, "Also": list(a) or None, "Class": k.__name__}
                  for c, k, s, a in atoll.KINDS]))`)
	cmd.Dir = "../../sdk/python"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var got []struct {
		api.ErrorCode
		Class string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	var codes []api.ErrorCode
	for _, g := range got {
		codes = append(codes, g.ErrorCode)
		if !strings.EqualFold(strings.ReplaceAll(g.Code, "_", ""), g.Class) {
			t.Errorf("code %s has class %s", g.Code, g.Class)
		}
	}
	if diff := cmp.Diff(api.ErrorCodes, codes); diff != "" {
		t.Errorf("atoll.errors.KINDS differs from api.ErrorCodes (-go +python):\n%s", diff)
	}
}
