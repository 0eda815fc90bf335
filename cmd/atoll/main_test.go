package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// golden compares got with testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	file := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got); run go test -update if the change is right:\n%s", file, diff)
	}
}

// goldenTable checks a table render against testdata: of items under name,
// and of none under name-empty.
func goldenTable[T any](t *testing.T, name string, render func(io.Writer, []T, time.Time) error, items []T) {
	t.Helper()
	var b bytes.Buffer
	if err := render(&b, items, now); err != nil {
		t.Fatal(err)
	}
	golden(t, name, b.String())
	b.Reset()
	render(&b, nil, now)
	golden(t, name+"-empty", b.String())
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{}, {"create"}, {"ls"}, {"inspect"}, {"exec"}, {"shell"}, {"cp"}, {"run-code"}, {"stop"}, {"start"}, {"rm"},
		{"pause"}, {"resume"}, {"archive"}, {"timeout"}, {"placement"}, {"network"}, {"port"}, {"mcp"}, {"fork"}, {"restore"}, {"snapshot"}, {"snapshot", "create"}, {"snapshot", "ls"}, {"snapshot", "rm"}, {"snapshot", "archive"},
		{"template"}, {"template", "import"}, {"template", "build"}, {"template", "ls"}, {"template", "inspect"}, {"template", "rm"}, {"template", "bootstrap"},
		{"key"}, {"key", "create"}, {"key", "ls"}, {"key", "rm"},
		{"tenant"}, {"tenant", "set"}, {"tenant", "ls"}, {"tenant", "inspect"}, {"usage"},
		{"audit"}, {"events"}, {"webhook"}, {"webhook", "add"}, {"webhook", "ls"}, {"webhook", "rm"}, {"webhook", "deliveries"},
		{"vault"}, {"vault", "create"}, {"vault", "ls"}, {"vault", "inspect"}, {"vault", "rm"}, {"vault", "log"}, {"vault", "show"}, {"vault", "search"}, {"vault", "links"}, {"vault", "credentials"}, {"vault", "compact"}, {"vault", "set"},
	} {
		name := "help-" + strings.Join(append([]string{"atoll"}, args...), "-")
		t.Run(name, func(t *testing.T) {
			root := newRootCmd()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(append(args, "--help"))
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			golden(t, name, out.String())
		})
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	var check func(c *cobra.Command)
	check = func(c *cobra.Command) {
		for _, c := range c.Commands() {
			if c.Name() == "help" {
				continue
			}
			if c.Short == "" || c.Long == "" || c.Example == "" {
				t.Errorf("%s: want Short, Long and Example", c.CommandPath())
			}
			check(c)
		}
	}
	check(newRootCmd())
}

var (
	now     = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	started = now.Add(-90 * time.Minute)
	stopped = now.Add(-10 * time.Minute)
	expires = now.Add(25 * time.Minute)
	fixture = []api.Sandbox{
		{
			ID: "3k9x2m7q1w8e5r4t6y0u", State: api.StateRunning, Template: "host", Runtime: "ns",
			CPU: 2, MemoryMiB: 2048, DiskGiB: 10, PIDs: 1024,
			Labels:    map[string]string{"team": "infra", "project": "demo"},
			Env:       map[string]string{"TOKEN": "secret", "LANG": "C.UTF-8"},
			CreatedAt: now.Add(-2 * time.Hour), StartedAt: &started,
			ExpiresAt: &expires, Ephemeral: true,
			Network: &api.SandboxNetwork{IPv4: "10.213.0.3", IPv6: "fd4c:1d6e:95aa::3",
				Policy: api.NetworkPolicy{Egress: "deny-all", Allow: []string{"10.0.0.0/8", "*.pypi.org"}, Deny: []string{"10.1.0.0/16"}}},
		},
		{
			ID: "a0b1c2d3e4f5g6h7i8j9", State: api.StateStopped, Template: "python", TemplateVersion: "v3c1a9e8f0b5d2e7a6c3", Runtime: "gvisor",
			CPU: 0.5, MemoryMiB: 512, DiskGiB: 1, PIDs: 256,
			CreatedAt: now.Add(-72 * time.Hour), StoppedAt: &stopped,
			AutoDeleteSec: 86400,
		},
		{
			ID: "zzzzzzzzzzzzzzzzzzzz", State: api.StateError, Template: "broken", Runtime: "vm",
			Error: "template layer is corrupt", CreatedAt: now.Add(-30 * time.Second),
		},
	}
)

func TestRenderList(t *testing.T) {
	goldenTable(t, "ls", renderList, fixture)
}

func TestRenderInspect(t *testing.T) {
	for i, name := range []string{"inspect-running", "inspect-stopped", "inspect-error"} {
		var b bytes.Buffer
		if err := renderInspect(&b, fixture[i], now); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "secret") {
			t.Errorf("%s shows an environment value", name)
		}
		golden(t, name, b.String())
	}
}

func TestRenderSnapshots(t *testing.T) {
	snaps := []api.Snapshot{
		{ID: "7h2k9x0q1w8e5r4t6y0u", Name: "deps-installed", SandboxID: "3k9x2m7q1w8e5r4t6y0u", Template: "python:3.12", Sandboxes: 2, CreatedAt: now.Add(-26 * time.Hour)},
		{ID: "p0o9i8u7y6t5r4e3w2q1", SandboxID: "a0b1c2d3e4f5g6h7i8j9", Template: "host", CreatedAt: now.Add(-5 * time.Minute)},
	}
	goldenTable(t, "snapshot-ls", renderSnapshots, snaps)
}

func TestForkCount(t *testing.T) {
	for _, n := range []string{"0", "-1", "101", "10000"} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"fork", "3k9x2m7q1w8e5r4t6y0u", "-n", n, "--url", "http://127.0.0.1:1"})
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), "want 1 to 100") {
			t.Errorf("fork -n %s: %v, want a count error", n, err)
		}
	}
}

func TestParseLoc(t *testing.T) {
	for in, want := range map[string]loc{
		"3k9x2m7q1w8e5r4t6y0u:/work": {"3k9x2m7q1w8e5r4t6y0u", "/work"},
		"./a:b":                      {"", "./a:b"},
		"file.txt":                   {"", "file.txt"},
		"dir/x:y":                    {"", "dir/x:y"},
		"my.file:1":                  {"", "my.file:1"},
		":/x":                        {"", ":/x"},
	} {
		if got := parseLoc(in); got != want {
			t.Errorf("parseLoc(%q) = %+v, want %+v", in, got, want)
		}
	}
}

func TestKeyValues(t *testing.T) {
	m, err := keyValues("--env", []string{"A=1", "B=x=y", "C="})
	if err != nil || !cmp.Equal(m, map[string]string{"A": "1", "B": "x=y", "C": ""}) {
		t.Errorf("keyValues = %v, %v", m, err)
	}
	for _, bad := range []string{"A", "=1"} {
		if _, err := keyValues("--env", []string{bad}); err == nil {
			t.Errorf("keyValues(%q): no error", bad)
		}
	}
}

// TestTarRoundTrip copies a directory out and back in through tar streams.
func TestTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a/b"), 0o755)
	os.WriteFile(filepath.Join(src, "a/b/f.txt"), []byte("hello"), 0o640)
	os.Symlink("b/f.txt", filepath.Join(src, "a/link"))
	var buf bytes.Buffer
	if err := writeTar(&buf, src); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := extractTar(&buf, dst); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dst, "a/link"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("through the symlink: %q, %v", b, err)
	}
	if st, _ := os.Stat(filepath.Join(dst, "a/b/f.txt")); st == nil || st.Mode().Perm() != 0o640 {
		t.Errorf("mode of f.txt: %v", st)
	}
}

// TestExtractTarHostile feeds extractTar streams a hostile sandbox could send.
func TestExtractTarHostile(t *testing.T) {
	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"dot-dot":         {{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"deep dot-dot":    {{Name: "a/../../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlink escape":  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "l/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlink to file": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: filepath.Join(outside, "escape")}, {Name: "l", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute":        {{Name: filepath.Join(outside, "escape"), Typeflag: tar.TypeReg, Mode: 0o644}},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range entries {
				h.Size = 0
				tw.WriteHeader(&h)
			}
			tw.Close()
			dst := t.TempDir()
			extractTar(&buf, dst) // may fail; must not escape
			if _, err := os.Lstat(filepath.Join(outside, "escape")); err == nil {
				t.Fatalf("a file was written outside the destination")
			}
			if st, err := os.Lstat(filepath.Join(dst, "l")); err == nil && st.Mode().IsRegular() {
				// replacing the symlink by a regular file inside dst is fine
				return
			}
		})
	}
	setuid := func() *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "s", Typeflag: tar.TypeReg, Mode: 0o4755})
		tw.Close()
		return &buf
	}()
	dst := t.TempDir()
	if err := extractTar(setuid, dst); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dst, "s")); st == nil || st.Mode()&os.ModeSetuid != 0 {
		t.Errorf("setuid bit kept: %v", st)
	}
}

func TestParseOrAddr(t *testing.T) {
	prefix := func(s string) (netip.Prefix, error) {
		return parseOrAddr(s, netip.ParsePrefix, func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) })
	}
	port := func(s string) (netip.AddrPort, error) {
		return parseOrAddr(s, netip.ParseAddrPort, func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 53) })
	}
	for _, tc := range []struct {
		in, want string
		parse    func(string) (string, error)
	}{
		{"10.0.0.0/8", "10.0.0.0/8", stringer(prefix)},
		{"10.1.2.3", "10.1.2.3/32", stringer(prefix)},
		{"fd00::1", "fd00::1/128", stringer(prefix)},
		{"example.com", "", stringer(prefix)},
		{"1.1.1.1:5353", "1.1.1.1:5353", stringer(port)},
		{"1.1.1.1", "1.1.1.1:53", stringer(port)},
		{"::1", "[::1]:53", stringer(port)},
		{"1.1.1.1:x", "", stringer(port)},
	} {
		got, err := tc.parse(tc.in)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("parseOrAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// stringer is parse answering a string.
func stringer[T fmt.Stringer](parse func(string) (T, error)) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := parse(s)
		if err != nil {
			return "", err
		}
		return v.String(), nil
	}
}
