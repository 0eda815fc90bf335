package confine_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/runtime/confine"
)

// TestDropCapabilities checks that a root process keeps exactly Docker's
// set, bounding set included, and nothing ambient or inheritable.
func TestDropCapabilities(t *testing.T) {
	for _, mode := range []string{"drop", "starter"} {
		t.Run(mode, func(t *testing.T) { testDropCapabilities(t, mode) })
	}
}

// testDropCapabilities checks the capabilities of a helper process that
// dropped them on every thread (drop), or of a process started by a
// Starter after its DropCapabilities (starter).
func testDropCapabilities(t *testing.T, mode string) {
	if os.Geteuid() != 0 {
		if os.Getenv("ATOLL_TEST_STRICT") == "1" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperVar+"="+mode)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var want uint64
	for _, c := range confine.Capabilities {
		want |= 1 << c.Number
	}
	got := map[string]uint64{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.HasPrefix(k, "Cap") {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			got[k] = n
		}
	}
	for k, w := range map[string]uint64{"CapBnd": want, "CapEff": want, "CapPrm": want, "CapInh": 0, "CapAmb": 0} {
		if got[k] != w {
			t.Errorf("%s = %016x, want %016x", k, got[k], w)
		}
	}
}

// TestCapabilityNames checks the names against the numbers' own: a name
// that does not match its number would give gvisor another set than ns.
func TestCapabilityNames(t *testing.T) {
	// From linux/capability.h.
	numbers := map[string]int{
		"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4,
		"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8,
		"CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13, "CAP_SYS_CHROOT": 18,
		"CAP_MKNOD": 27, "CAP_AUDIT_WRITE": 29, "CAP_SETFCAP": 31,
	}
	names := confine.CapabilityNames()
	if len(names) != len(numbers) {
		t.Errorf("%d capabilities, want Docker's %d", len(names), len(numbers))
	}
	for i, c := range confine.Capabilities {
		if n, ok := numbers[c.Name]; !ok || n != c.Number || names[i] != c.Name {
			t.Errorf("capability %s is %d, want %d", c.Name, c.Number, n)
		}
	}
}

func TestMountpoint(t *testing.T) {
	root := t.TempDir()
	if p, err := confine.Mountpoint(root, "/a/b", true); err != nil || p != filepath.Join(root, "a/b") {
		t.Fatalf("dir: %q, %v", p, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "a/b")); err != nil || !fi.IsDir() {
		t.Fatalf("dir not made: %v", err)
	}
	if _, err := confine.Mountpoint(root, "/etc/hosts", false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/hosts")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("file not made: %v", err)
	}
	// A mount point of the wrong type, or a symlink a layer left there,
	// is refused rather than followed.
	if err := os.Symlink("/", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		target string
		dir    bool
	}{{"/etc/hosts", true}, {"/a/b", false}, {"/link", true}} {
		if _, err := confine.Mountpoint(root, c.target, c.dir); err == nil {
			t.Errorf("Mountpoint(%s, dir=%v) took a path of the wrong type", c.target, c.dir)
		}
	}
}

const helperVar = "ATOLL_CONFINE_HELPER"

// TestMain runs the test binary as a helper when helperVar is set: dropping
// capabilities is for good, so it happens in a process of its own.
func TestMain(m *testing.M) {
	if os.Getenv(helperVar) == "drop" {
		if err := confine.DropCapabilities(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	}
	if os.Getenv(helperVar) == "starter" {
		s := confine.NewStarter()
		go s.Serve()
		if err := s.DropCapabilities(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		var (
			out []byte
			err error
		)
		s.Do(func() { out, err = exec.Command("cat", "/proc/self/status").Output() })
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Stdout.Write(out)
		os.Exit(0)
	}
	os.Exit(m.Run())
}
