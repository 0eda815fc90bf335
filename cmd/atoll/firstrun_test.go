package main

// What a newcomer meets on a fresh machine, following README.md: each test
// here failed before its fix.

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime/vm"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// pathWithout returns a PATH directory holding every command on PATH but
// the ones named.
func pathWithout(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			skip := false
			for _, n := range names {
				skip = skip || e.Name() == n
			}
			if !skip {
				os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name())) // the first on PATH wins
			}
		}
	}
	return dir
}

// TestRuntimesReason: a runtime the host cannot offer says why, naming the
// missing package, in GET /v1/runtimes and in `atoll runtimes`.
func TestRuntimesReason(t *testing.T) {
	testenv.RequireRoot(t)
	for _, c := range []string{"qemu-system-x86_64", "mkfs.ext4", "rsync"} {
		testenv.RequireCommand(t, c)
	}
	d := startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: testenv.Dir(t),
		env:  []string{"PATH=" + pathWithout(t, "rsync", "runsc")},
		args: []string{"--warm-pool", "0", "--prestart", "0"}})
	rts, err := d.client().Runtimes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"vm":     "rsync is not installed (package rsync)",
		"gvisor": "runsc (gVisor) is not installed",
	}
	for _, rt := range rts {
		if w, ok := want[rt.Name]; ok {
			if rt.Available || rt.Reason != w {
				t.Errorf("%s: available %v, reason %q; want %q", rt.Name, rt.Available, rt.Reason, w)
			}
			delete(want, rt.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v", want)
	}
	out, _ := d.cli("runtimes")
	if !strings.Contains(out, "rsync is not installed (package rsync)") {
		t.Errorf("atoll runtimes:\n%s", out)
	}
}

// TestServeDataNotTraversable: a --data under a directory other users
// cannot pass through (mktemp -d makes them 0700) is refused at start, with
// the directory and the fix named; before, the server started and every
// create failed.
func TestServeDataNotTraversable(t *testing.T) {
	testenv.RequireRoot(t)
	parent := filepath.Join(testenv.Dir(t), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(parent, "data")
	out, err := exec.Command(atollBinary(t), "serve", "--listen", "127.0.0.1:0", "--data", data, "--network", "off").CombinedOutput()
	if err == nil {
		t.Fatalf("atoll serve started with --data under a 0700 directory:\n%s", out)
	}
	for _, want := range []string{parent + " (mode 0700)", "chmod o+x " + parent} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "layers")); err == nil {
		t.Error("the refused server made its layer store")
	}
}

// TestStopEndsReadySandboxes: after a graceful stop (SIGTERM) nothing the
// server kept ready for creates runs on: neither the warm pool's sandboxes
// nor the prestarted processes. Before, the pool's stayed until the next
// start.
func TestStopEndsReadySandboxes(t *testing.T) {
	testenv.RequireRoot(t)
	data := testenv.Dir(t)
	d := startDaemon(t, data, "--warm-pool", "2", "--prestart", "2")
	states := func() map[string]string {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(data, "atoll.db")+"?mode=ro&_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		rows, err := db.Query(`SELECT id, state FROM sandboxes`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var id, state string
			rows.Scan(&id, &state)
			out[id] = state
		}
		return out
	}
	var ready map[string]string
	for deadline := time.Now().Add(2 * time.Minute); ; {
		ready = states()
		n := map[string]int{}
		for _, st := range ready {
			n[st]++
		}
		// A prestarted record is written before its process starts (a
		// crash between the two leaves a record recovery removes): wait
		// for the processes too.
		running := 0
		for id := range ready {
			if len(inCgroup(id)) > 0 {
				running++
			}
		}
		if n["pooled"] == 2 && n["prestarted"] == 2 && running == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool and prestarted not filled, or without processes (%d running): %v", running, ready)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.stop()
	for id, st := range ready {
		if pids := inCgroup(id); len(pids) > 0 {
			t.Errorf("%s sandbox %s: processes %v run on after the server stopped", st, id, pids)
		}
	}
	if left := states(); len(left) > 0 {
		t.Errorf("records left: %v", left)
	}
}

// TestReadmeRunLine: README's run line works on a fresh Debian machine,
// whose package lists are empty until apt-get update, and README names
// every package the runtimes look for.
func TestReadmeRunLine(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	_, run, _ := strings.Cut(readme, "## Run it")
	run, _, _ = strings.Cut(run, "\n## ")
	var line string
	for _, l := range strings.Split(run, "\n") {
		if strings.HasSuffix(l, "atoll serve") {
			line = l
		}
	}
	if !strings.HasPrefix(line, "apt-get update && apt-get install -y ") {
		t.Errorf("the run line does not update the package lists before installing: %q", line)
	}
	// Both binaries, so that sandboxes run the small agent, not all of
	// atoll (agentSource).
	if !strings.Contains(line, "go build -o /usr/local/bin/ ./cmd/atoll ./cmd/atoll-agent && atoll serve") {
		t.Errorf("the run line does not build atoll-agent beside atoll: %q", line)
	}
	for _, pkg := range []string{"btrfs-progs", "erofs-utils"} {
		if !strings.Contains(line, pkg) {
			t.Errorf("the run line does not install %s: %q", pkg, line)
		}
	}
	for _, pkg := range append(vm.Packages(), "qemu-system-x86", "linux-image-amd64") {
		if !strings.Contains(run, pkg) {
			t.Errorf("README's Run it does not name %s, which the vm runtime needs", pkg)
		}
	}
}

// TestAgentSource: without atoll-agent beside it the server runs itself as
// the agent and says so (it warns at start: all of atoll starts in every
// sandbox); --agent names one.
func TestAgentSource(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, wantSelf := exe, true
	if beside := filepath.Join(filepath.Dir(exe), "atoll-agent"); fileExists(beside) {
		want, wantSelf = beside, false
	}
	if path, self, err := agentSource(""); err != nil || self != wantSelf || path != want {
		t.Errorf("agentSource: %q, self %v, %v; want %q, self %v", path, self, err, want, wantSelf)
	}
	if path, self, err := agentSource("/opt/atoll-agent"); err != nil || self || path != "/opt/atoll-agent" {
		t.Errorf("--agent: %q, self %v, %v", path, self, err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestLongDataPath: a --data whose path leaves no room for a runtime's agent
// sockets (a unix socket's path holds at most 107 bytes) is refused with the
// fix named: for gvisor, whose socket paths are the longest, in GET
// /v1/runtimes; for ns, which every server needs, at start. Before, every
// start failed at the agent's dial with "invalid argument".
func TestLongDataPath(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "runsc")
	// padded is a directory under the test's whose path is n bytes long.
	padded := func(n int) string {
		base := testenv.Dir(t)
		if n-len(base)-1 < 1 {
			t.Fatalf("the test directory %s is too long", base)
		}
		return filepath.Join(base, strings.Repeat("d", n-len(base)-1))
	}
	// gvisor's socket is <data>/run-gvisor/<id>/sock/agent.sock, ns's
	// <data>/run/<id>/agent.sock: 48 and 36 bytes beyond --data.
	d := startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: padded(107 - 48 + 1),
		args: []string{"--warm-pool", "0", "--prestart", "0"}})
	ctx := context.Background()
	rts, err := d.client().Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, rt := range rts {
		if rt.Name == "gvisor" {
			listed = true
			if rt.Available || !strings.Contains(rt.Reason, "shorter --data") {
				t.Errorf("gvisor: available %v, reason %q; want it refused for the long --data", rt.Available, rt.Reason)
			}
			t.Logf("gvisor: %s", rt.Reason)
		}
	}
	if !listed {
		t.Error("gvisor is not listed")
	}
	sb, err := d.client().CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatalf("an ns sandbox, whose sockets fit: %v", err)
	}
	if err := d.client().DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	data := padded(107 - 36 + 1)
	out, err := exec.Command(atollBinary(t), "serve", "--listen", "127.0.0.1:0", "--data", data, "--network", "off").CombinedOutput()
	if err == nil {
		t.Fatalf("atoll serve started with a --data of %d bytes:\n%s", len(data), out)
	}
	if !strings.Contains(string(out), "shorter --data") {
		t.Errorf("output does not name the fix:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(data, "layers")); err == nil {
		t.Error("the refused server made its layer store")
	}
}
