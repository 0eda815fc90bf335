// Package testenv holds what atoll's tests share: the strict-mode rule for
// skipping, the S3 server's URL, and helpers that build the agent binary and a
// layer store on a loop-mounted btrfs image.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/internal/layers"
)

// Strict reports whether ATOLL_TEST_STRICT=1: CI sets it so that a test that
// cannot run fails instead of skipping.
func Strict() bool { return os.Getenv("ATOLL_TEST_STRICT") == "1" }

// Skip skips t, or fails it in strict mode.
func Skip(t testing.TB, why string) {
	t.Helper()
	if Strict() {
		t.Fatalf("cannot run (ATOLL_TEST_STRICT=1): %s", why)
	}
	t.Skip(why)
}

// RequireRoot skips (or in strict mode fails) t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root")
	}
}

// RequireCommand skips (or in strict mode fails) t unless name is on PATH.
func RequireCommand(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Skip(t, name+" is not installed")
	}
}

// S3URL returns ATOLL_TEST_S3_URL, the s3:// URL of a bucket on an
// S3-compatible server that scripts/test.sh starts, or skips (in strict mode
// fails) t when it is not set.
func S3URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("ATOLL_TEST_S3_URL")
	if u == "" {
		Skip(t, "ATOLL_TEST_S3_URL is not set (scripts/test.sh starts an S3 server and sets it)")
	}
	return u
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// AgentBinary builds cmd/atoll-agent once per test process and returns its path,
// in a directory sandboxes' unprivileged uids can traverse.
func AgentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		var root []byte
		root, agentErr = exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if agentErr != nil {
			return
		}
		dir, err := os.MkdirTemp("", "atoll-agent-")
		if err != nil {
			agentErr = err
			return
		}
		os.Chmod(dir, 0o711)
		agentPath = filepath.Join(dir, "atoll-agent")
		cmd := exec.Command("go", "build", "-o", agentPath, "./cmd/atoll-agent")
		cmd.Dir = strings.TrimSpace(string(root))
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = &buildError{err: err, out: string(out)}
		}
	})
	if agentErr != nil {
		t.Fatalf("building atoll-agent: %v", agentErr)
	}
	return agentPath
}

// RemoveAgentBinary removes what AgentBinary built, for a TestMain to
// call once its tests are done.
func RemoveAgentBinary() {
	if agentPath != "" {
		os.RemoveAll(filepath.Dir(agentPath))
	}
}

// Main runs a package's tests, then removes the agent binary they built
// (AgentBinary), and exits: a package's TestMain.
func Main(m *testing.M) {
	code := m.Run()
	RemoveAgentBinary()
	os.Exit(code)
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// Dir returns a temporary directory that sandboxes' unprivileged host uids can
// traverse (t.TempDir makes 0700 directories).
func Dir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	for p := d; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// Layers opens a layer store on a small loop-mounted btrfs image under dir and
// unmounts it when t ends.
func Layers(t testing.TB, dir string) *layers.Store {
	t.Helper()
	RequireRoot(t)
	RequireCommand(t, "mkfs.btrfs")
	ls, err := layers.Open(layers.Config{Dir: filepath.Join(dir, "layers"), ImageSize: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Unmount() })
	return ls
}

// MountedVolatile reports whether line, a line of /proc/*/mountinfo, is a
// mount whose super options hold "volatile" (an overlay's; newer kernels
// show "fsync=volatile"). Only whole options count: a path among them, a
// test's directory say, may hold the word.
func MountedVolatile(line string) bool {
	f := strings.Fields(line)
	if len(f) == 0 {
		return false
	}
	for _, o := range strings.Split(f[len(f)-1], ",") {
		if o == "volatile" || o == "fsync=volatile" {
			return true
		}
	}
	return false
}
