package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	_ "modernc.org/sqlite" // reads the store's transitions, see recordedIDs

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// These tests run the real `atoll serve` binary as root on a fresh data
// directory and drive it through the SDK and the CLI.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func atollBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "atoll-bin-")
		if err != nil {
			binErr = err
			return
		}
		os.Chmod(dir, 0o711)
		binPath = filepath.Join(dir, "atoll")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

type daemon struct {
	t    *testing.T
	args []string // extra serve flags
	bin  string
	data string
	// netns, if set, is the network namespace the daemon runs in (and its
	// clients connect from); without it the daemon runs with --network off
	// unless args say otherwise, so that tests never touch the real host's
	// network.
	netns string
	env   []string // the daemon's environment beyond the test's own
	cmd   *exec.Cmd
	url   string
	key   string
	out   syncBuffer // the daemon's log, over all its starts
}

// syncBuffer is a bytes.Buffer that a daemon's log can be read from while
// the daemon writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startDaemon starts `atoll serve` on data with the extra flags args.
func startDaemon(t *testing.T, data string, args ...string) *daemon {
	t.Helper()
	return startDaemonIn(t, data, "", args...)
}

// startDaemonIn starts `atoll serve` inside the network namespace at netns.
func startDaemonIn(t *testing.T, data, netns string, args ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: data, args: args, netns: netns})
}

// startDaemonWith starts d, and when t ends removes its sandboxes and
// unmounts what it mounted.
func startDaemonWith(t *testing.T, d *daemon) *daemon {
	t.Helper()
	data, netns, args := d.data, d.netns, d.args
	d.start()
	t.Cleanup(func() {
		d.kill()
		// Sandboxes outlive the daemon by design; the test removes them.
		// Without a pool: its start discards pooled ones and makes none.
		d2 := &daemon{t: t, bin: d.bin, data: data, netns: netns,
			args: slices.Concat(args, []string{"--warm-pool", "0", "--prestart", "0", "--network-pool", "0"})}
		d2.start()
		c := d2.client()
		sbs, _ := c.ListSandboxes(context.Background(), atoll.ListOptions{})
		for _, sb := range sbs {
			c.DeleteSandbox(context.Background(), sb.ID)
		}
		// Other tenants' sandboxes, through a key the admin key issues for
		// each tenant.
		keys, _ := c.ListKeys(context.Background())
		seen := map[string]bool{"default": true}
		for _, k := range keys {
			if seen[k.Tenant] {
				continue
			}
			seen[k.Tenant] = true
			tk, err := c.CreateKey(context.Background(), api.CreateKeyRequest{Name: "cleanup", Tenant: k.Tenant})
			if err != nil {
				continue
			}
			tc := d2.clientWith(tk.Key)
			sbs, _ := tc.ListSandboxes(context.Background(), atoll.ListOptions{})
			for _, sb := range sbs {
				tc.DeleteSandbox(context.Background(), sb.ID)
			}
		}
		d2.kill()
		exec.Command("umount", "-l", filepath.Join(data, "layers")).Run()
		exec.Command("umount", "-l", filepath.Join(data, "run")).Run()
		exec.Command("umount", "-l", filepath.Join(data, "run-gvisor")).Run()
		exec.Command("umount", "-l", filepath.Join(data, "lowers")).Run()
	})
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data", d.data, "--layer-image-size", fmt.Sprint(int64(8 << 30))}, d.args...)
	if !slices.Contains(d.args, "--network") {
		args = append(args, "--network", "off")
	}
	d.cmd = exec.Command(d.bin, args...)
	if d.env != nil {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	// Wait must not hang on output pipes that a killed daemon's children hold.
	d.cmd.WaitDelay = 2 * time.Second
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	d.cmd.Stderr = &d.out
	if err := d.startCmd(d.cmd); err != nil {
		d.t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var banner []string
	for sc.Scan() {
		banner = append(banner, sc.Text())
		if strings.HasPrefix(sc.Text(), "Try:") {
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if len(banner) == 0 {
		d.cmd.Wait()
		d.t.Fatalf("atoll serve did not start: %s", d.out.String())
	}
	url, err := os.ReadFile(filepath.Join(d.data, "url"))
	if err != nil {
		d.t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(d.data, "api-key"))
	if err != nil {
		d.t.Fatal(err)
	}
	d.url, d.key = strings.TrimSpace(string(url)), strings.TrimSpace(string(key))
}

// stop ends the daemon with SIGTERM, as an operator would.
func (d *daemon) stop() {
	if d.cmd != nil && d.cmd.Process != nil {
		d.cmd.Process.Signal(syscall.SIGTERM)
		d.cmd.Wait()
	}
}

// kill ends the daemon with SIGKILL, as a crash would.
func (d *daemon) kill() {
	if d.cmd != nil && d.cmd.Process != nil {
		d.cmd.Process.Kill()
		d.cmd.Wait()
	}
}

// startCmd starts cmd in the daemon's network namespace.
func (d *daemon) startCmd(cmd *exec.Cmd) error {
	if d.netns == "" {
		return cmd.Start()
	}
	return nettest.In(d.netns, cmd.Start)
}

func (d *daemon) client() *atoll.Client { return d.clientWith(d.key) }

// clientWith is a client of the daemon that uses key.
func (d *daemon) clientWith(key string) *atoll.Client {
	if d.netns == "" {
		return atoll.New(d.url, key)
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = nettest.In(d.netns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	return atoll.New(d.url, key, atoll.WithHTTPClient(hc))
}

// cli runs the atoll CLI against the daemon and returns stdout and exit code.
func (d *daemon) cli(args ...string) (string, int) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := d.startCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	out := stdout.Bytes()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return string(out) + stderr.String(), code
}

func sh(t *testing.T, c *atoll.Client, id, script string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code, err := c.Exec(context.Background(), id, api.ExecRequest{Shell: script}, &out, &out)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return out.String(), code
}

// layerImages names the layers that have an image mounted under data/lowers
// (package lowers).
func layerImages(data string) map[string]bool {
	out := map[string]bool{}
	srcs, _ := filepath.Glob(filepath.Join(data, "lowers", "*.src"))
	for _, src := range srcs {
		b, err := os.ReadFile(src)
		if err != nil {
			continue
		}
		var st, parent syscall.Stat_t
		mnt := strings.TrimSuffix(src, ".src")
		if syscall.Stat(mnt, &st) == nil && syscall.Stat(filepath.Dir(mnt), &parent) == nil && st.Dev != parent.Dev {
			out[filepath.Base(strings.TrimSpace(string(b)))] = true
		}
	}
	return out
}

// leftovers lists host resources that carry a sandbox ID: mounts, cgroups,
// run and layer directories, and processes in a sandbox's cgroup.
func leftovers(data string, ids ...string) []string {
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, id := range ids {
		if bytes.Contains(mi, []byte(id)) {
			out = append(out, "mount of "+id)
		}
		for _, p := range append(cgroupDirs(id), filepath.Join(data, "run", id), filepath.Join(data, "run-gvisor", id), filepath.Join(data, "layers", "sandboxes", id)) {
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
			}
		}
		for _, pid := range inCgroup(id) {
			out = append(out, fmt.Sprintf("process %d in the cgroup of %s", pid, id))
		}
	}
	return out
}

// cgroupDirs are where the ns runtime (and runsc, for gvisor) make sandbox
// id's cgroups: one per v1 controller used, or one on a unified (v2) host.
func cgroupDirs(id string) []string {
	var out []string
	for _, h := range []string{"memory", "pids", "cpu", "cpuacct", "freezer", ""} {
		out = append(out, filepath.Join("/sys/fs/cgroup", h, "atoll", id), filepath.Join("/sys/fs/cgroup", h, "atoll-gvisor", id), filepath.Join("/sys/fs/cgroup", h, "atoll-vm", id))
	}
	return out
}

// inCgroup lists the processes in a cgroup of sandbox id, on any hierarchy.
func inCgroup(id string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if bytes.Contains(b, []byte("/atoll/"+id+"\n")) || bytes.Contains(b, []byte("/atoll/"+id+"/")) || bytes.Contains(b, []byte("/atoll-gvisor/"+id+"\n")) || bytes.Contains(b, []byte("/atoll-vm/"+id+"\n")) {
			out = append(out, pid)
		}
	}
	return out
}

// hostState lists, one line each, what the server on data holds on the
// host: mounts under data or naming one of its sandboxes, loop devices backed
// by files in data, the cgroups of its sandboxes and the processes in them,
// processes running from or in data (agents, tar), writable layers,
// snapshots, btrfs subvolumes, run directories, archive objects and the
// archive's temporary files. Its sandboxes are all those its store ever
// recorded. A difference between two calls is a leak (or a sandbox made in
// between).
func hostState(t *testing.T, data string) []string {
	t.Helper()
	ids, prestarted := recordedIDs(t, data)
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if f[4] == data || strings.HasPrefix(f[4], data+"/") {
			out = append(out, "mount "+f[4])
			continue
		}
		for _, id := range ids {
			if strings.Contains(line, id) {
				out = append(out, "mount "+f[4]+" of "+id)
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range loops {
		b, _ := os.ReadFile(p)
		if f := strings.TrimSpace(string(b)); strings.HasPrefix(f, data+"/") || strings.HasPrefix(f, data+".") {
			out = append(out, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(p)))+" on "+f)
		}
	}
	known := map[string]bool{}
	for _, id := range ids {
		known[id] = true
		for _, p := range cgroupDirs(id) {
			if _, err := os.Stat(p); err == nil {
				out = append(out, "cgroup "+p)
			}
		}
	}
	// Where a file bucket used to keep its temporary files.
	tmps, _ := filepath.Glob(filepath.Join(os.TempDir(), "*.tar.*.tmp"))
	for _, p := range tmps {
		if id, _, _ := strings.Cut(filepath.Base(p), "."); known[id] {
			out = append(out, "archive temp file "+p)
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if prestarted[processSandbox(e.Name())] {
			continue
		}
		for _, link := range []string{"exe", "cwd"} {
			p, _ := os.Readlink(filepath.Join("/proc", e.Name(), link))
			if strings.HasPrefix(p, data+"/") {
				out = append(out, "process "+e.Name()+" "+link+" "+p)
			}
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		for _, line := range strings.Split(string(cg), "\n") {
			_, rest, ok := strings.Cut(line, "/atoll/")
			if id, _, _ := strings.Cut(rest, "/"); ok && known[id] {
				out = append(out, "process "+e.Name()+" in the cgroup of "+id)
				break
			}
		}
	}
	for _, dir := range []string{"layers/sandboxes", "layers/snapshots", "run"} {
		ents, _ := os.ReadDir(filepath.Join(data, dir))
		for _, e := range ents {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	if b, err := exec.Command("btrfs", "subvolume", "list", filepath.Join(data, "layers")).Output(); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if _, path, ok := strings.Cut(line, " path "); ok {
				out = append(out, "subvolume "+path)
			}
		}
	}
	filepath.WalkDir(filepath.Join(data, "archive"), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			out = append(out, "archive file "+strings.TrimPrefix(p, data+"/"))
		}
		return nil
	})
	// What belongs to the running server's prestarted sandboxes is there by
	// design, including those prestarted while this looked.
	_, later := recordedIDs(t, data)
	maps.Copy(prestarted, later)
	out = slices.DeleteFunc(out, func(s string) bool {
		for id := range prestarted {
			if strings.Contains(s, id) {
				return true
			}
		}
		return false
	})
	sort.Strings(out)
	return out
}

// processSandbox is the sandbox whose cgroup holds process pid, or "".
func processSandbox(pid string) string {
	cg, _ := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	for _, line := range strings.Split(string(cg), "\n") {
		if _, rest, ok := strings.Cut(line, "/atoll/"); ok {
			id, _, _ := strings.Cut(rest, "/")
			return id
		}
	}
	return ""
}

// recordedIDs lists every sandbox the store in data ever recorded (every one
// has a first transition, and transitions outlive deletes) apart from those
// now prestarted, which it returns as a set: they belong to a running server
// by design; a stop removes them and their records, and a crash leaves them
// to the next start.
func recordedIDs(t *testing.T, data string) (ids []string, prestarted map[string]bool) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(data, "atoll.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT DISTINCT t.sandbox_id, COALESCE(s.state, '') FROM transitions t LEFT JOIN sandboxes s ON s.id = t.sandbox_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	prestarted = map[string]bool{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		if state == "prestarted" {
			prestarted[id] = true
		} else {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids, prestarted
}

// leaks is what after holds that before did not.
// leftSince is what the server on data holds now and did not at before,
// looked at again for up to two seconds while it is not nothing: a
// process the server is starting (a prestarted one) is briefly in no
// sandbox's cgroup, and a leak is what stays.
func leftSince(t *testing.T, before []string, data string) []string {
	t.Helper()
	l := leaks(before, hostState(t, data))
	for i := 0; i < 4 && len(l) > 0; i++ {
		time.Sleep(500 * time.Millisecond)
		l = leaks(before, hostState(t, data))
	}
	return l
}

func leaks(before, after []string) []string {
	had := map[string]bool{}
	for _, s := range before {
		had[s] = true
	}
	var out []string
	for _, s := range after {
		if !had[s] {
			out = append(out, s)
		}
	}
	return out
}

func TestServeEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	if fi, err := os.Stat(filepath.Join(data, "api-key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("api-key file: %v %v", fi.Mode(), err)
	}

	// The CLI on the server's host finds URL and key in the data directory.
	local := exec.Command(d.bin, "--data", data, "ls", "--json")
	local.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := local.CombinedOutput(); err != nil || !strings.Contains(string(out), `"sandboxes"`) {
		t.Errorf("atoll --data %s ls without ATOLL_URL/ATOLL_API_KEY: %v: %s", data, err, out)
	}

	out, code := d.cli("create", "--label", "suite=e2e", "--env", "GREETING=hello")
	if code != 0 {
		t.Fatalf("atoll create: %s", out)
	}
	id := strings.TrimSpace(out)
	if out, code := d.cli("exec", id, "--", "python3", "-c", "print(1)"); code != 0 || out != "1\n" {
		t.Fatalf("python3: %q %d", out, code)
	}
	if out, code := d.cli("exec", id, "--", "sh", "-c", "echo $GREETING; exit 7"); code != 7 || out != "hello\n" {
		t.Errorf("exit code passthrough: %q %d", out, code)
	}
	if out, code := d.cli("exec", id, "--", "sh", "-c", "echo kept > /root/state && mkdir -p /home/user/proj && echo x > /home/user/proj/f"); code != 0 {
		t.Fatal(out)
	}
	c := d.client()
	ctx := context.Background()

	// Stop and start: files exactly as left.
	if out, code := d.cli("stop", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec on stopped sandbox: %v, want conflict", err)
	}
	if _, err := c.StopSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("double stop: %v", err)
	}
	if out, code := d.cli("start", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.StartSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("double start: %v", err)
	}
	if out, _ := sh(t, c, id, "cat /root/state /home/user/proj/f"); out != "kept\nx\n" {
		t.Errorf("after stop/start: %q", out)
	}

	// A background process survives a daemon crash; the sandbox is re-adopted.
	p, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: "while true; do date +%s%N >> /root/ticks; sleep 0.05; done", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	d.kill()
	time.Sleep(300 * time.Millisecond)
	d.start()
	c = d.client()
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.State != api.StateRunning {
		t.Fatalf("after daemon restart: %+v %v", sb, err)
	}
	count := func() int {
		out, _ := sh(t, c, id, "wc -l < /root/ticks")
		var n int
		fmt.Sscan(out, &n)
		return n
	}
	before := count()
	time.Sleep(500 * time.Millisecond)
	if after := count(); after <= before {
		t.Errorf("background process stopped across the daemon restart: %d -> %d ticks", before, after)
	}
	if err := c.Signal(ctx, id, p.PID, "KILL"); err != nil {
		t.Errorf("kill background process: %v", err)
	}

	// cp both ways, files and directories.
	src := filepath.Join(testenv.Dir(t), "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("A"), 0o644)
	if out, code := d.cli("cp", src, id+":/root/up"); code != 0 {
		t.Fatal(out)
	}
	if out, _ := sh(t, c, id, "cat /root/up/sub/a.txt"); out != "A" {
		t.Errorf("uploaded dir: %q", out)
	}
	dst := filepath.Join(testenv.Dir(t), "down")
	if out, code := d.cli("cp", id+":/root/up", dst); code != 0 {
		t.Fatal(out)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "a.txt")); string(b) != "A" {
		t.Errorf("downloaded dir: %q", b)
	}

	// rm: everything released.
	if out, code := d.cli("rm", id); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.GetSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("get after rm: %v", err)
	}
	if err := c.DeleteSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("double rm: %v", err)
	}
	if left := leftovers(data, id); len(left) > 0 {
		t.Errorf("left after rm: %v", left)
	}
}

// TestGvisorEndToEnd runs a sandbox under runsc through the API: python3,
// a file kept across stop and start, a daemon restart that re-adopts it, and
// nothing left after delete.
func TestGvisorEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "runsc")
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	out, code := d.cli("create", "--runtime", "gvisor", "--memory", "512")
	if code != 0 {
		t.Fatalf("atoll create --runtime gvisor: %s\n%s", out, d.out.String())
	}
	id := strings.TrimSpace(out)
	c := d.client()
	ctx := context.Background()
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.Runtime != "gvisor" {
		t.Fatalf("sandbox: %+v, %v", sb, err)
	}
	if out, code := sh(t, c, id, "python3 -c 'print(6*7)'"); code != 0 || out != "42\n" {
		t.Fatalf("python3: %q %d", out, code)
	}
	// The kernel answering is gVisor's, not the host's.
	if out, _ := sh(t, c, id, "dmesg | head -1"); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg is not gVisor's: %q", out)
	}
	if out, code := sh(t, c, id, "echo kept > /root/state && mkdir -p /home/user/p && echo x > /home/user/p/f"); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.StopSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, id, "cat /root/state /home/user/p/f"); out != "kept\nx\n" {
		t.Errorf("after stop/start: %q", out)
	}

	// A crash of the daemon leaves the sandbox running; the next one
	// re-adopts it.
	d.kill()
	d.start()
	c = d.client()
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
		t.Fatalf("after daemon restart: %+v, %v", sb, err)
	}
	if out, _ := sh(t, c, id, "cat /root/state"); out != "kept\n" {
		t.Errorf("after daemon restart: %q", out)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(data, id); len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
}

// TestSuspendEndToEnd pauses a gvisor sandbox to disk through the API and
// CLI: its memory image is written and nothing of it runs; it stays
// suspended across a kill -9 of the daemon; resume restores it with a
// process that counts on from where it was; and the ns runtime, which
// cannot save memory, refuses clearly.
func TestSuspendEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "runsc")
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data, "--warm-pool", "0")
	c := d.client()
	ctx := context.Background()
	// The API reports who can pause to disk.
	rts, err := c.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]api.RuntimeCapabilities{}
	for _, rt := range rts {
		if rt.Available {
			caps[rt.Name] = rt.Capabilities
		}
	}
	if !caps["gvisor"].MemorySnapshot || caps["ns"].MemorySnapshot || !caps["ns"].SharedKernel || caps["gvisor"].SharedKernel {
		t.Errorf("runtimes: %+v", rts)
	}
	if out, code := d.cli("runtimes"); code != 0 || !strings.Contains(out, "ns (default)") || !strings.Contains(out, "memory_snapshot") {
		t.Errorf("atoll runtimes: %s", out)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor", MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if _, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: counterShell}); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		out, code := sh(t, c, id, "cat /root/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if code != 0 || err != nil {
			t.Fatalf("count: %q %d", out, code)
		}
		return n
	}
	time.Sleep(time.Second)
	if n := count(); n < 2 {
		t.Fatalf("positive control: the counter counts: %d", n)
	}

	t0 := time.Now()
	if out, code := d.cli("pause", "--to-disk", id); code != 0 {
		t.Fatalf("atoll pause --to-disk: %s", out)
	}
	suspendTook := time.Since(t0)
	sb, err = c.GetSandbox(ctx, id)
	if err != nil || sb.State != api.StateSuspended {
		t.Fatalf("after suspend: %+v, %v", sb, err)
	}
	image := filepath.Join(data, "checkpoints", id)
	if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); err != nil {
		t.Errorf("memory image: %v", err)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/atoll-gvisor/" + id); len(m) > 0 {
		t.Errorf("a suspended sandbox still has cgroups: %v", m)
	}
	if _, err := c.Exec(ctx, id, api.ExecRequest{Shell: "true"}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec in a suspended sandbox: %v, want conflict", err)
	}
	if _, err := c.SuspendSandbox(ctx, id); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("suspending a suspended sandbox: %v, want conflict", err)
	}
	// The counter's file holds its last value; a sandbox that ran on would
	// add about ten a second.
	at := 0
	if b, err := os.ReadFile(filepath.Join(data, "layers", "sandboxes", id, "upper", "root", "count")); err == nil {
		at, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}

	d.kill()
	time.Sleep(2 * time.Second)
	d.start()
	c = d.client()
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateSuspended {
		t.Fatalf("after a daemon restart: %+v, %v", sb, err)
	}
	t0 = time.Now()
	if out, code := d.cli("resume", id); code != 0 {
		t.Fatalf("atoll resume: %s\n%s", out, d.out.String())
	}
	resumeTook := time.Since(t0)
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
		t.Fatalf("after resume: %+v, %v", sb, err)
	}
	first := count()
	time.Sleep(time.Second)
	then := count()
	t.Logf("count at suspend %d, after resume %d, a second later %d; atoll pause --to-disk took %v, atoll resume %v",
		at, first, then, suspendTook.Round(time.Millisecond), resumeTook.Round(time.Millisecond))
	if then <= first {
		t.Errorf("the counter does not count on after resume: %d then %d", first, then)
	}
	if at > 0 && (first < at || first > at+20) {
		t.Errorf("the counter after resume is %d; at suspend it was %d (it went on while suspended, or started over)", first, at)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("memory image kept after resume: %v", err)
	}

	// A fork with memory: the children's counters run on from the parent's.
	before := count()
	out, code := d.cli("fork", id, "-n", "2", "--memory")
	if code != 0 {
		t.Fatalf("atoll fork --memory: %s\n%s", out, d.out.String())
	}
	kids := strings.Fields(out)
	if len(kids) != 2 {
		t.Fatalf("fork --memory printed %q", out)
	}
	time.Sleep(time.Second)
	for _, k := range append(kids, id) {
		a, _ := sh(t, c, k, "cat /root/count")
		time.Sleep(500 * time.Millisecond)
		b, _ := sh(t, c, k, "cat /root/count")
		n1, _ := strconv.Atoi(strings.TrimSpace(a))
		n2, _ := strconv.Atoi(strings.TrimSpace(b))
		if n1 < before || n2 <= n1 {
			t.Errorf("sandbox %s after a fork with memory: count %q then %q (the parent had %d)", k, a, b, before)
		}
	}
	if out, _ := sh(t, c, kids[0], "echo mine > /root/own; cat /root/own"); out != "mine\n" {
		t.Errorf("a child's own file: %q", out)
	}
	if _, code := sh(t, c, kids[1], "test -e /root/own"); code == 0 {
		t.Error("a child sees its sibling's file")
	}
	for _, k := range kids {
		if err := c.DeleteSandbox(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(data, "checkpoints", "*")); len(m) > 0 {
		t.Errorf("memory images left after a fork: %v", m)
	}

	// A kill -9 in the middle of a suspend loses nothing: the sandbox is
	// running or suspended afterwards, and its counter goes on. Early, the
	// agent may have let go of its socket; later, the checkpoint may finish
	// without the server.
	for _, after := range []time.Duration{30 * time.Millisecond, 400 * time.Millisecond} {
		suspended := make(chan error, 1)
		go func() { _, err := c.SuspendSandbox(ctx, id); suspended <- err }()
		time.Sleep(after)
		logFrom := len(d.out.String())
		d.kill()
		<-suspended
		d.start()
		c = d.client()
		sb, err = c.GetSandbox(ctx, id)
		if err != nil || sb.State != api.StateRunning && sb.State != api.StateSuspended {
			t.Fatalf("after a kill %v into a suspend: %+v, %v\n%s", after, sb, err, d.out.String()[logFrom:])
		}
		var how []string
		for _, l := range strings.Split(d.out.String()[logFrom:], "\n") {
			if strings.Contains(l, "cut short") {
				how = append(how, l)
			}
		}
		t.Logf("killed %v into a suspend: %s after the restart; %q", after, sb.State, how)
		if sb.State == api.StateSuspended {
			if _, err := c.ResumeSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		a := count()
		time.Sleep(500 * time.Millisecond)
		if b := count(); b <= a {
			t.Errorf("after a kill %v into a suspend the counter stands: %d then %d", after, a, b)
		}
	}

	// Suspend again, then stop and delete: nothing is left.
	if _, err := c.SuspendSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if sb, err := c.StopSandbox(ctx, id); err != nil || sb.State != api.StateStopped {
		t.Fatalf("stop of a suspended sandbox: %+v, %v", sb, err)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("memory image kept after stop: %v", err)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(data, id); len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}

	// What cannot be suspended.
	ns, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SuspendSandbox(ctx, ns.ID); !errors.Is(err, atoll.ErrInvalid) || !strings.Contains(err.Error(), "memory_snapshot") {
		t.Errorf("suspending an ns sandbox: %v, want invalid naming memory_snapshot", err)
	}
	if _, err := c.ForkSandbox(ctx, ns.ID, api.ForkRequest{Count: 1, Memory: true}); !errors.Is(err, atoll.ErrInvalid) || !strings.Contains(err.Error(), "memory_fork") {
		t.Errorf("a fork with memory of an ns sandbox: %v, want invalid naming memory_fork", err)
	}
	if _, err := c.StopSandbox(ctx, ns.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SuspendSandbox(ctx, ns.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("suspending a stopped sandbox: %v, want conflict", err)
	}
	for _, body := range []string{`{"to_disk":"yes"}`, `{"to_disk":true,"x":1}`, `[]`} {
		req, _ := http.NewRequest("POST", d.url+"/v1/sandboxes/"+ns.ID+"/pause", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("pause with %s: %d, want 400", body, resp.StatusCode)
		}
	}
}

// requireVM skips (in strict mode fails) t unless the vm runtime can run.
func requireVM(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "qemu-system-x86_64")
	testenv.RequireCommand(t, "mkfs.erofs")
	if m, _ := filepath.Glob("/boot/vmlinuz-*"); len(m) == 0 {
		testenv.Skip(t, "no guest kernel in /boot (install linux-image-amd64)")
	}
}

// linkVMCache shares the images every run builds the same (the host's /usr
// as erofs takes a minute) with the vm package's tests.
func linkVMCache(t *testing.T, data string) {
	t.Helper()
	cache := os.Getenv("ATOLL_TEST_VM_CACHE")
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(d, "atoll-test", "vm")
	}
	if err := os.MkdirAll(cache, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(data, "run-vm"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cache, filepath.Join(data, "run-vm", "cache")); err != nil {
		t.Fatal(err)
	}
}

// TestVMEndToEnd runs a sandbox in a QEMU microVM through the API and the
// CLI: its own kernel, a file kept across stop and start, a daemon restart
// that re-adopts it, and nothing left after delete.
func TestVMEndToEnd(t *testing.T) {
	requireVM(t)
	data := filepath.Join(testenv.Dir(t), "data")
	linkVMCache(t, data)
	d := startDaemon(t, data)
	out, code := d.cli("create", "--runtime", "vm", "--memory", "512")
	if code != 0 {
		t.Fatalf("atoll create --runtime vm: %s\n%s", out, d.out.String())
	}
	id := strings.TrimSpace(out)
	c := d.client()
	ctx := context.Background()
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.Runtime != "vm" {
		t.Fatalf("sandbox: %+v, %v", sb, err)
	}
	if out, code := sh(t, c, id, "python3 -c 'print(6*7)'"); code != 0 || out != "42\n" {
		t.Fatalf("python3: %q %d", out, code)
	}
	// The kernel answering is the guest's, not the host's.
	var uts unix.Utsname
	unix.Uname(&uts)
	hostRelease := unix.ByteSliceToString(uts.Release[:])
	if out, _ := sh(t, c, id, "uname -r"); strings.TrimSpace(out) == hostRelease || out == "" {
		t.Errorf("uname -r in the vm: %q, the host's is %q", out, hostRelease)
	}
	if out, code := sh(t, c, id, "echo kept > /root/state && mkdir -p /home/user/p && echo x > /home/user/p/f"); code != 0 {
		t.Fatal(out)
	}
	if _, err := c.StopSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, id, "cat /root/state /home/user/p/f"); out != "kept\nx\n" {
		t.Errorf("after stop/start: %q", out)
	}
	d.kill()
	d.start()
	c = d.client()
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
		t.Fatalf("after daemon restart: %+v, %v", sb, err)
	}
	if out, _ := sh(t, c, id, "cat /root/state"); out != "kept\n" {
		t.Errorf("after daemon restart: %q", out)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	left := leftovers(data, id)
	if _, err := os.Stat(filepath.Join(data, "run-vm", "sandboxes", id)); err == nil {
		left = append(left, "run-vm/sandboxes/"+id)
	}
	if b, err := exec.Command("pgrep", "-f", "sandboxes/"+id+"/").Output(); err == nil && len(b) > 0 {
		left = append(left, "processes: "+strings.TrimSpace(string(b)))
	}
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
}

// TestVMSuspendEndToEnd pauses a vm sandbox to disk through the API, with
// networking on (its namespace is released and made again), restarts the
// daemon, and resumes it: a counting process counts on from where it was.
func TestVMSuspendEndToEnd(t *testing.T) {
	_, d := startNetworkedVMDaemon(t)
	data := d.data
	c := d.client()
	ctx := context.Background()
	rts, err := c.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range rts {
		if rt.Name == "vm" && (!rt.Available || !rt.Capabilities.MemorySnapshot || rt.Capabilities.SharedKernel || !rt.Capabilities.MemoryFork) {
			t.Errorf("vm's capabilities: %+v", rt)
		}
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "vm", MemoryMiB: 512})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, d.out.String())
	}
	id := sb.ID
	if _, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: counterShell}); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		out, code := sh(t, c, id, "cat /root/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if code != 0 || err != nil {
			t.Fatalf("count: %q %d", out, code)
		}
		return n
	}
	time.Sleep(2 * time.Second)
	if n := count(); n < 2 {
		t.Fatalf("positive control: the counter counts: %d", n)
	}
	if out, code := d.cli("pause", "--to-disk", id); code != 0 {
		t.Fatalf("atoll pause --to-disk: %s\n%s", out, d.out.String())
	}
	at := 0
	if b, err := os.ReadFile(filepath.Join(data, "layers", "sandboxes", id, "upper", "root", "count")); err == nil {
		at, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	d.kill()
	d.start()
	c = d.client()
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateSuspended {
		t.Fatalf("after a daemon restart: %+v, %v", sb, err)
	}
	if out, code := d.cli("resume", id); code != 0 {
		t.Fatalf("atoll resume: %s\n%s", out, d.out.String())
	}
	first := count()
	time.Sleep(2 * time.Second)
	then := count()
	t.Logf("count at suspend %d, after resume %d, later %d", at, first, then)
	if then <= first || at == 0 || first < at || first > at+30 {
		t.Errorf("the counter: %d at suspend, %d after resume, %d later", at, first, then)
	}
	if out, ok := curlIn(t, c, id, "http://allowed.example/"); !ok {
		t.Errorf("the network after resume: %q", out)
	}
	checkNetworkedMemoryFork(t, c, id)
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// counterShell counts about ten a second into /root/count, which it
// replaces whole each time: a reader (or a snapshot) never sees it empty.
const counterShell = "i=0; while true; do i=$((i+1)); echo $i > /root/count.tmp; mv /root/count.tmp /root/count; sleep 0.1; done"

// checkNetworkedMemoryFork forks sandbox id, whose /root/count a process
// keeps counting, into one child with its memory: the child counts on from
// the parent's count, under its own address and hostname, and reaches the
// network (allowed.example of a netWorld); the parent goes on too.
func checkNetworkedMemoryFork(t *testing.T, c *atoll.Client, id string) {
	t.Helper()
	ctx := context.Background()
	parent, err := c.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	count := func(id string) int {
		t.Helper()
		out, _ := sh(t, c, id, "cat /root/count")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	before := count(id)
	kids, err := c.ForkSandbox(ctx, id, api.ForkRequest{Count: 1, Memory: true})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork with memory: %v, %v", kids, err)
	}
	k := kids[0]
	if k.Network == nil || k.Network.IPv4 == "" || k.Network.IPv4 == parent.Network.IPv4 {
		t.Errorf("the child's network: %+v (the parent's: %+v)", k.Network, parent.Network)
	}
	for _, sb := range []string{k.ID, id} {
		a := count(sb)
		time.Sleep(time.Second)
		if b := count(sb); a < before || b <= a {
			t.Errorf("sandbox %s after a fork with memory: count %d then %d (the parent had %d)", sb, a, b, before)
		}
		if out, ok := curlIn(t, c, sb, "http://allowed.example/"); !ok {
			t.Errorf("the network of %s after a fork with memory: %q", sb, out)
		}
	}
	if k.Network != nil {
		if out, _ := sh(t, c, k.ID, "grep -c '^"+k.Network.IPv4+"\\s"+k.ID+"$' /etc/hosts"); out != "1\n" {
			t.Errorf("the child's hosts: %q", out)
		}
	}
	if out, _ := sh(t, c, k.ID, "hostname"); out != k.ID+"\n" {
		t.Errorf("the child's hostname: %q", out)
	}
	if err := c.DeleteSandbox(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
}

// curlIn runs curl in sandbox id.
func curlIn(t *testing.T, c *atoll.Client, id, url string) (string, bool) {
	t.Helper()
	out, code := sh(t, c, id, "curl -fsS --max-time 10 "+url+" 2>&1")
	return out, code == 0
}

func TestServeNeedsRoot(t *testing.T) {
	testenv.RequireRoot(t)
	cmd := exec.Command(atollBinary(t), "serve", "--data", testenv.Dir(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs root") {
		t.Errorf("atoll serve as nobody: %v: %s", err, out)
	}
}

// TestKillDuringCreate kills the daemon while creates are in flight: after a
// restart every listed sandbox works, and nothing is left of the others.
func TestKillDuringCreate(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data, "--warm-pool", "0")
	c := d.client()
	ctx := context.Background()
	// Warm the template so creates are in their interesting part; what is
	// on the host then is the baseline.
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c.DeleteSandbox(ctx, sb.ID)
	before := hostState(t, data)
	d.kill()
	d.args = nil
	d.start()
	c = d.client()

	for round, delay := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 45 * time.Millisecond} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var acked []string
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
				if err == nil {
					mu.Lock()
					acked = append(acked, sb.ID)
					mu.Unlock()
				}
			}()
		}
		time.Sleep(delay)
		d.kill()
		wg.Wait()
		// Restart without a warm pool, so that everything on the host must
		// belong to a listed sandbox (pooled ones are discarded at start).
		d.args = []string{"--warm-pool", "0"}
		d.start()
		c = d.client()
		sbs, err := c.ListSandboxes(ctx, atoll.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, sb := range sbs {
			listed[sb.ID] = true
			if sb.State != api.StateRunning {
				t.Errorf("round %d: sandbox %s is %s after restart", round, sb.ID, sb.State)
				continue
			}
			if out, code := sh(t, c, sb.ID, "echo ok"); out != "ok\n" || code != 0 {
				t.Errorf("round %d: sandbox %s does not work: %q", round, sb.ID, out)
			}
		}
		for _, id := range acked {
			if !listed[id] {
				t.Errorf("round %d: acknowledged sandbox %s is gone", round, id)
			}
		}
		// Nothing on the host that no listed sandbox owns.
		ents, _ := os.ReadDir(filepath.Join(data, "layers", "sandboxes"))
		for _, e := range ents {
			if !listed[e.Name()] {
				t.Errorf("round %d: writable layer %s has no sandbox", round, e.Name())
			}
		}
		for _, sb := range sbs {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("delete %s: %v", sb.ID, err)
			}
			if left := leftovers(data, sb.ID); len(left) > 0 {
				t.Errorf("left after delete: %v", left)
			}
		}
		// Nothing of the creates the kill cut short either.
		if l := leftSince(t, before, data); len(l) > 0 {
			t.Errorf("round %d: left on the host after deleting everything: %v", round, l)
		}
		d.kill()
		d.args = nil
		d.start()
		c = d.client()
	}
}

// TestKillDuringStateOps kills the daemon while snapshots, forks, archives
// or deletes of three sandboxes are in flight, at a few delays, and restarts
// it on the same data directory: every acknowledged operation is there and
// whole, every other one is whole or absent, no sandbox is left in a
// transient state, an acknowledged delete never comes back, and once
// everything is deleted the host holds what it held before.
func TestKillDuringStateOps(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	// No warm pool: everything on the host belongs to the test's sandboxes.
	d := startDaemon(t, data, "--warm-pool", "0")
	ctx := context.Background()
	// The first sandbox prepares the template; what it leaves is the baseline.
	c := d.client()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	before := hostState(t, data)

	// run is sh with a deadline and no Fatal: a sandbox left frozen fails
	// the test instead of hanging it.
	run := func(c *atoll.Client, id, script string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var out bytes.Buffer
		code, err := c.Exec(ctx, id, api.ExecRequest{Shell: script}, &out, &out)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit code %d", code)
		}
		return out.String(), err
	}
	// hasMarker checks that running sandbox id holds what sandbox src wrote.
	hasMarker := func(c *atoll.Client, round, id, src string) {
		t.Helper()
		want := "m-" + src + "\n4194304\n"
		if out, err := run(c, id, "cat /root/marker; wc -c < /root/bulk"); err != nil || out != want {
			t.Errorf("%s: sandbox %s has %q (%v), want %q", round, id, out, err, want)
		}
	}

	const n = 3 // operations at once
	count := func(sbs []api.Sandbox, err error) int { return len(sbs) }
	var deleted []string // acknowledged deletes of every round
	for _, op := range []struct {
		name string
		// A round kills the daemon after each of delays, which land in
		// the middle of the operations (the log says where), and a last
		// one as soon as done sees one operation reach the step named by
		// when, while the others may not have.
		delays []time.Duration
		when   string
		done   func(c *atoll.Client, srcs []string) bool
	}{
		{"snapshot", []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}, "one is listed", func(c *atoll.Client, _ []string) bool {
			sns, _ := c.ListSnapshots(ctx, "")
			return len(sns) > 0
		}},
		{"fork", []time.Duration{30 * time.Millisecond, 300 * time.Millisecond}, "one's children run", func(c *atoll.Client, _ []string) bool {
			return count(c.ListSandboxes(ctx, atoll.ListOptions{State: api.StateRunning, Labels: map[string]string{"forked": "yes"}})) > 0
		}},
		{"archive", []time.Duration{15 * time.Millisecond, 50 * time.Millisecond}, "one's local files are gone", func(_ *atoll.Client, srcs []string) bool {
			for _, id := range srcs {
				if _, err := os.Stat(filepath.Join(data, "layers", "sandboxes", id)); errors.Is(err, os.ErrNotExist) {
					return true
				}
			}
			return false
		}},
		{"delete", []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}, "one is gone", func(c *atoll.Client, _ []string) bool {
			return count(c.ListSandboxes(ctx, atoll.ListOptions{})) < n
		}},
	} {
		for r := 0; r <= len(op.delays); r++ {
			round := op.name + ", killed once " + op.when
			if r < len(op.delays) {
				round = fmt.Sprintf("%s, killed after %v", op.name, op.delays[r])
			}
			c := d.client()
			srcs := make([]string, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range srcs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
					if err == nil {
						srcs[i] = sb.ID
						_, err = run(c, sb.ID, "echo m-"+sb.ID+" > /root/marker && head -c 4194304 /dev/urandom > /root/bulk")
					}
					if err == nil && op.name == "archive" {
						_, err = c.StopSandbox(ctx, sb.ID)
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}

			// One operation on each at once, then kill -9.
			snaps := make([]api.Snapshot, n)
			kids := make([][]api.Sandbox, n)
			took := make([]time.Duration, n) // till the answer, if any
			t0 := time.Now()
			for i, id := range srcs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { took[i] = time.Since(t0) }()
					switch op.name {
					case "snapshot":
						snaps[i], errs[i] = c.CreateSnapshot(ctx, id, api.CreateSnapshotRequest{})
					case "fork":
						kids[i], errs[i] = c.ForkSandbox(ctx, id, api.ForkRequest{Count: 3, Labels: map[string]string{"forked": "yes"}})
					case "archive":
						_, errs[i] = c.ArchiveSandbox(ctx, id)
					case "delete":
						errs[i] = c.DeleteSandbox(ctx, id)
					}
				}()
			}
			if r < len(op.delays) {
				time.Sleep(op.delays[r])
			} else {
				for deadline := time.Now().Add(10 * time.Second); !op.done(c, srcs) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			d.kill()
			wg.Wait()
			logFrom := len(d.out.String())
			d.start()
			c = d.client()
			for i, err := range errs {
				var ae *atoll.Error
				if errors.As(err, &ae) {
					t.Errorf("%s: %s of %s refused: %v", round, op.name, srcs[i], err)
				}
			}

			// Nothing in a transient state; acknowledged deletes stay deleted.
			sbs, err := c.ListSandboxes(ctx, atoll.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			state := map[string]string{}
			for _, sb := range sbs {
				state[sb.ID] = sb.State
				if sb.State != api.StateRunning && sb.State != api.StateStopped && sb.State != api.StateArchived {
					t.Errorf("%s: sandbox %s is %s after the restart", round, sb.ID, sb.State)
				}
			}
			for _, id := range deleted {
				if _, err := c.GetSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
					t.Errorf("%s: sandbox %s, deleted in an earlier round, is back: %v", round, id, err)
				}
			}
			sns, err := c.ListSnapshots(ctx, "")
			if err != nil {
				t.Fatal(err)
			}

			// Each operation: acknowledged and whole, or not acknowledged
			// and whole or absent.
			var nAcked, nWhole, nAbsent int
			tally := func(i int, whole bool) {
				switch {
				case errs[i] == nil:
					nAcked++
				case whole:
					nWhole++
				default:
					nAbsent++
				}
			}
			switch op.name {
			case "snapshot":
				listed := map[string]bool{}
				for _, sn := range sns {
					listed[sn.ID] = true
					from, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: sn.ID})
					if err != nil {
						t.Errorf("%s: create from snapshot %s: %v", round, sn.ID, err)
						continue
					}
					hasMarker(c, round, from.ID, sn.SandboxID)
				}
				for i, src := range srcs {
					if errs[i] == nil && !listed[snaps[i].ID] {
						t.Errorf("%s: acknowledged snapshot %s is gone", round, snaps[i].ID)
					}
					taken := false
					for _, sn := range sns {
						taken = taken || sn.SandboxID == src
					}
					tally(i, taken)
					// The source was frozen for the snapshot: it runs again.
					if state[src] != api.StateRunning {
						t.Errorf("%s: source %s is %q", round, src, state[src])
					} else {
						hasMarker(c, round, src, src)
					}
				}
			case "fork":
				children := map[string][]string{} // by parent, from their markers
				for _, sb := range sbs {
					if sb.Labels["forked"] != "yes" {
						continue
					}
					if sb.State != api.StateRunning {
						t.Errorf("%s: child %s is %s", round, sb.ID, sb.State)
						continue
					}
					out, err := run(c, sb.ID, "cat /root/marker")
					parent := strings.TrimPrefix(strings.TrimSpace(out), "m-")
					if err != nil || len(parent) != 20 {
						t.Errorf("%s: child %s has no marker: %q %v", round, sb.ID, out, err)
						continue
					}
					children[parent] = append(children[parent], sb.ID)
					hasMarker(c, round, sb.ID, parent)
				}
				for i, src := range srcs {
					for _, k := range kids[i] {
						if state[k.ID] != api.StateRunning {
							t.Errorf("%s: acknowledged child %s is %q", round, k.ID, state[k.ID])
						}
					}
					// A fork is whole with all its children, absent with none.
					if got := len(children[src]); got != 0 && got != 3 || errs[i] == nil && got != 3 {
						t.Errorf("%s: fork of %s (acknowledged: %v) left %d of 3 children", round, src, errs[i] == nil, got)
					}
					tally(i, len(children[src]) == 3)
					if state[src] != api.StateRunning {
						t.Errorf("%s: parent %s is %q", round, src, state[src])
					} else {
						hasMarker(c, round, src, src)
					}
				}
			case "archive":
				archived := 0
				for _, sb := range sbs {
					if sb.State == api.StateArchived {
						archived++
					}
				}
				if got, err := c.ListSandboxes(ctx, atoll.ListOptions{State: api.StateArchived}); err != nil || len(got) != archived {
					t.Errorf("%s: list of archived sandboxes: %d %v, want %d", round, len(got), err, archived)
				}
				for i, src := range srcs {
					switch st := state[src]; {
					case st == api.StateArchived:
					case st == api.StateStopped && errs[i] != nil:
					default:
						t.Errorf("%s: sandbox %s (archive acknowledged: %v) is %q", round, src, errs[i] == nil, st)
					}
					tally(i, state[src] == api.StateArchived)
					if _, err := c.StartSandbox(ctx, src); err != nil {
						t.Errorf("%s: start %s (%s): %v", round, src, state[src], err)
						continue
					}
					hasMarker(c, round, src, src)
				}
			case "delete":
				for i, src := range srcs {
					_, err := c.GetSandbox(ctx, src)
					gone := errors.Is(err, atoll.ErrNotFound)
					if errs[i] == nil {
						deleted = append(deleted, src)
						if !gone {
							t.Errorf("%s: acknowledged delete of %s: sandbox is %q (%v)", round, src, state[src], err)
						}
					} else if !gone {
						if state[src] != api.StateRunning {
							t.Errorf("%s: sandbox %s, not deleted, is %q", round, src, state[src])
						} else {
							hasMarker(c, round, src, src)
						}
					}
					tally(i, gone)
					if gone {
						if left := leftovers(data, src); len(left) > 0 {
							t.Errorf("%s: left of deleted %s: %v", round, src, left)
						}
					}
				}
			}

			// Delete everything: the host holds what it did before.
			sns, _ = c.ListSnapshots(ctx, "")
			for _, sn := range sns {
				if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
					t.Errorf("%s: delete snapshot %s: %v", round, sn.ID, err)
				}
			}
			sbs, _ = c.ListSandboxes(ctx, atoll.ListOptions{})
			derrs := make([]error, len(sbs))
			for i, sb := range sbs {
				wg.Add(1)
				go func() { defer wg.Done(); derrs[i] = c.DeleteSandbox(ctx, sb.ID) }()
			}
			wg.Wait()
			if err := errors.Join(derrs...); err != nil {
				t.Errorf("%s: deleting everything: %v", round, err)
			}
			if l := leftSince(t, before, data); len(l) > 0 {
				t.Errorf("%s: left on the host after deleting everything: %v", round, l)
			}
			var answered []time.Duration
			for i, err := range errs {
				if err == nil {
					answered = append(answered, took[i].Round(time.Millisecond))
				}
			}
			t.Logf("%s: %d acknowledged (after %v), %d whole but not acknowledged, %d absent; recovery: %v",
				round, nAcked, answered, nWhole, nAbsent, logMessages(d.out.String()[logFrom:]))
		}
	}
	// And with the server stopped.
	d.stop()
	if l := leftSince(t, before, data); len(l) > 0 {
		t.Errorf("left on the host with the server stopped: %v", l)
	}
	d.start()
	for _, id := range deleted {
		if _, err := d.client().GetSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("deleted sandbox %s is back: %v", id, err)
		}
	}
}

// logMessages counts the messages of a daemon's log, for the record of what
// a start-up did.
func logMessages(log string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		_, msg, ok := strings.Cut(line, " msg=")
		if !ok {
			continue
		}
		if strings.HasPrefix(msg, `"`) {
			msg, _, _ = strings.Cut(msg[1:], `"`)
		} else {
			msg, _, _ = strings.Cut(msg, " ")
		}
		if _, state, ok := strings.Cut(line, " state="); ok {
			state, _, _ = strings.Cut(state, " ")
			msg += " (" + state + ")"
		}
		out[msg]++
	}
	return out
}

// TestHostileInput sends bad input through the real server: every answer is
// a 4xx JSON error and the host is untouched.
func TestHostileInput(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	hostShadow, _ := os.ReadFile("/etc/shadow")
	marker := filepath.Join(testenv.Dir(t), "marker")
	os.WriteFile(marker, []byte("host"), 0o644)

	raw := func(method, path string, body io.Reader) (int, string) {
		req, _ := http.NewRequest(method, d.url+path, body)
		req.Header.Set("Authorization", "Bearer "+d.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"templat":"host"}`, 400},
		{"malformed json", "POST", "/v1/sandboxes", `{"cpu":`, 400},
		{"negative cpu", "POST", "/v1/sandboxes", `{"cpu":-1}`, 400},
		{"huge memory", "POST", "/v1/sandboxes", `{"memory_mib":99999999999}`, 400},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 404},
		{"bad label", "POST", "/v1/sandboxes", `{"labels":{"a b":"c"}}`, 400},
		{"env with NUL", "POST", "/v1/sandboxes", `{"env":{"A\u0000":"b"}}`, 400},
		{"malformed id", "GET", "/v1/sandboxes/..%2f..%2fetc", "", 400},
		{"unknown id", "GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", "", 404},
		{"exec unknown id", "POST", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/exec", `{"cmd":["true"]}`, 404},
		{"relative path", "GET", "/v1/sandboxes/" + id + "/files?path=etc/passwd", "", 400},
		{"NUL path", "GET", "/v1/sandboxes/" + id + "/files?path=/etc%00", "", 400},
		{"exec unknown field", "POST", "/v1/sandboxes/" + id + "/exec", `{"command":"x"}`, 400},
		{"unknown pid", "GET", "/v1/sandboxes/" + id + "/processes/999999", "", 404},
		{"bad egress CIDR", "POST", "/v1/sandboxes", `{"network":{"allow":["10.0.0.0/33"]}}`, 400},
		{"bad wildcard", "PUT", "/v1/sandboxes/" + id + "/network", `{"allow":["a.*.example"]}`, 400},
		// This daemon runs with --network off: a policy fails closed.
		// Loopback only cannot let a sandbox reach some places, or deny
		// some (deny-all with nothing allowed it enforces, and is a 201).
		{"policy without networking", "POST", "/v1/sandboxes", `{"network":{"egress":"deny-all","allow":["203.0.113.1"]}}`, 503},
		{"deny list without networking", "POST", "/v1/sandboxes", `{"network":{"deny":["203.0.113.1"]}}`, 503},
		{"network without networking", "GET", "/v1/sandboxes/" + id + "/network", "", 503},
		{"set policy without networking", "PUT", "/v1/sandboxes/" + id + "/network", `{"egress":"deny-all"}`, 503},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := raw(tc.method, tc.path, strings.NewReader(tc.body))
			if code != tc.want || !strings.Contains(body, `"code"`) {
				t.Errorf("%s %s: %d %s, want %d with a JSON error", tc.method, tc.path, code, body, tc.want)
			}
		})
	}
	t.Run("huge body", func(t *testing.T) {
		code, _ := raw("POST", "/v1/sandboxes", strings.NewReader(`{"labels":{"a":"`+strings.Repeat("x", 4<<20)+`"}}`))
		if code != 413 && code != 400 {
			t.Errorf("4 MiB create body: %d", code)
		}
	})

	// Traversal and symlinks resolve inside the sandbox: reading "../../etc/shadow"
	// or through a symlink to /etc/shadow yields the sandbox's file, never the host's.
	sh(t, c, id, "ln -s /etc/shadow /root/link; ln -s ../../../../../../etc/shadow /root/rel")
	for _, p := range []string{"/root/../../../etc/shadow", "/root/link", "/root/rel"} {
		rc, err := c.ReadFile(ctx, id, p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if len(hostShadow) > 0 && bytes.Equal(b, hostShadow) || !bytes.HasPrefix(b, []byte("root:*:")) {
			t.Errorf("read %s gave %q, want the sandbox's shadow", p, b)
		}
	}
	// Writing through a symlink that points at a host path writes inside the sandbox.
	sh(t, c, id, "ln -s "+marker+" /root/tohost; mkdir -p "+filepath.Dir(marker))
	if _, err := c.WriteFile(ctx, id, "/root/tohost", strings.NewReader("sandbox"), 0o644); err != nil {
		t.Errorf("write through symlink: %v", err)
	}
	if b, _ := os.ReadFile(marker); string(b) != "host" {
		t.Errorf("host file changed to %q", b)
	}

	// Tar slip: refused with a 4xx, nothing written outside the target.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../../../../../../" + strings.TrimPrefix(marker, "/"), Mode: 0o644, Size: 4, Typeflag: tar.TypeReg})
	tw.Write([]byte("slip"))
	tw.Close()
	err = c.UploadTar(ctx, id, "/root/dst", &buf)
	var ae *atoll.Error
	if !errors.As(err, &ae) || ae.StatusCode < 400 || ae.StatusCode >= 500 {
		t.Errorf("tar slip upload: %v, want a 4xx", err)
	}
	if b, _ := os.ReadFile(marker); string(b) != "host" {
		t.Errorf("host file changed to %q", b)
	}

	// Wrong or missing key.
	bad := atoll.New(d.url, "atoll_wrong")
	if _, err := bad.ListSandboxes(ctx, atoll.ListOptions{}); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("wrong key: %v", err)
	}
}

// TestTerminalAndWatch drives a PTY shell over the websocket and a directory
// watch through the real server and agent.
func TestTerminalAndWatch(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/bin/bash", "--norc", "-i"}, Background: true, PTY: &api.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	term, err := c.Terminal(ctx, sb.ID, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if err := term.Resize(33, 111); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := term.Write([]byte("stty size; tty; exit 3\n")); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(term)
	if !strings.Contains(string(out), "33 111") || !strings.Contains(string(out), "/dev/pts/") {
		t.Errorf("terminal output %q lacks the resized size or a pty", out)
	}
	if code, err := term.Wait(); err != nil || code != 3 {
		t.Errorf("terminal exit: %d %v", code, err)
	}

	w, err := c.Watch(ctx, sb.ID, "/root", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	time.Sleep(100 * time.Millisecond)
	sh(t, c, sb.ID, "mkdir /root/d && echo x > /root/d/f")
	seen := map[string]bool{}
	for w.Next() {
		ev := w.Event()
		seen[ev.Type+" "+ev.Path] = true
		if seen["create /root/d/f"] {
			break
		}
	}
	if !seen["create /root/d"] || !seen["create /root/d/f"] {
		t.Errorf("watch events %v lack the new directory and file", seen)
	}
}

// TestCreateSettingsApply checks that what a create asks for (limits, disk,
// env, labels) holds whether the sandbox came from the warm pool or was
// started cold: the first creates after the pool fills are pool hits.
func TestCreateSettingsApply(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	time.Sleep(3 * time.Second) // let the pool of 2 fill
	for i := 0; i < 4; i++ {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{
			MemoryMiB: 200 + int64(i), PIDs: 77, DiskGiB: 1, CPU: 0.5,
			Env: map[string]string{"WHO": fmt.Sprint("n", i)}, Labels: map[string]string{"i": fmt.Sprint(i)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if sb.MemoryMiB != 200+int64(i) || sb.PIDs != 77 || sb.DiskGiB != 1 || sb.Labels["i"] != fmt.Sprint(i) {
			t.Errorf("create %d answered %+v", i, sb)
		}
		mem, _ := os.ReadFile("/sys/fs/cgroup/memory/atoll/" + sb.ID + "/memory.limit_in_bytes")
		if strings.TrimSpace(string(mem)) != fmt.Sprint((200+i)<<20) {
			t.Errorf("create %d: memory limit %q", i, mem)
		}
		if shares, _ := os.ReadFile("/sys/fs/cgroup/cpu/atoll/" + sb.ID + "/cpu.shares"); strings.TrimSpace(string(shares)) != "1024" {
			t.Errorf("create %d: cpu.shares %q, want the default 1024 (pooled sandboxes run at a low weight)", i, shares)
		}
		quota, _ := os.ReadFile("/sys/fs/cgroup/cpu/atoll/" + sb.ID + "/cpu.cfs_quota_us")
		period, _ := os.ReadFile("/sys/fs/cgroup/cpu/atoll/" + sb.ID + "/cpu.cfs_period_us")
		if strings.TrimSpace(string(quota)) != "5000" || strings.TrimSpace(string(period)) != "10000" {
			t.Errorf("create %d: cpu quota %q of %q, want 5000 of 10000 (0.5 cores)", i, quota, period)
		}
		pids, _ := os.ReadFile("/sys/fs/cgroup/pids/atoll/" + sb.ID + "/pids.max")
		if strings.TrimSpace(string(pids)) != "77" {
			t.Errorf("create %d: pids limit %q", i, pids)
		}
		if out, _ := sh(t, c, sb.ID, "echo $WHO; hostname"); out != fmt.Sprint("n", i)+"\n"+sb.ID+"\n" {
			t.Errorf("create %d: env and hostname %q", i, out)
		}
		if _, code := sh(t, c, sb.ID, "fallocate -l 1100M /root/big"); code == 0 {
			t.Errorf("create %d: allocated 1100 MiB under a 1 GiB disk limit", i)
		}
		list, err := c.ListSandboxes(ctx, atoll.ListOptions{Labels: map[string]string{"i": fmt.Sprint(i)}})
		if err != nil || len(list) != 1 || list[0].ID != sb.ID {
			t.Errorf("create %d: list by label: %v %v", i, list, err)
		}
	}
}

// TestShellCommand runs `atoll shell` on a real terminal (a pty) against the
// server, types into it and reads what the sandbox's shell printed.
func TestShellCommand(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	sb, err := d.client().CreateSandbox(context.Background(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(d.bin, "shell", sb.ID)
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key, "TERM=xterm")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, tty); close(done) }()
	time.Sleep(500 * time.Millisecond)
	tty.Write([]byte("echo $((6*7)); stty size; exit 5\n"))
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err = <-errc:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("atoll shell did not exit; output %q", out.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Errorf("atoll shell exit: %v", err)
	}
	tty.Close()
	<-done
	if !strings.Contains(out.String(), "42") || !strings.Contains(out.String(), "30 100") {
		t.Errorf("shell output %q lacks 42 and the terminal size 30 100", out.String())
	}
}

// helloSource is a static program for test images: it prints what the image
// config set up (env, working directory, uid) and whether paths exist.
const helloSource = `package main

import (
	"fmt"
	"os"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Println(os.Getenv("GREETING"), wd, os.Getuid())
	for _, p := range os.Args[1:] {
		_, err := os.Stat(p)
		fmt.Println(p, err == nil)
	}
}
`

// testImage builds a two-layer image: a static binary, passwd with an "app"
// user, a file and a directory that the second layer deletes and empties.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	dir := testenv.Dir(t)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(helloSource), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644)
	build := exec.Command("go", "build", "-o", "hello", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hello: %v: %s", err, out)
	}
	bin, _ := os.ReadFile(filepath.Join(dir, "hello"))
	layer := func(entries ...tarEntry) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
			if e.dir {
				h.Typeflag, h.Size = tar.TypeDir, 0
			}
			tw.WriteHeader(h)
			tw.Write([]byte(e.body))
		}
		tw.Close()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	base := layer(
		tarEntry{name: "bin/", dir: true, mode: 0o755},
		tarEntry{name: "bin/hello", mode: 0o755, body: string(bin)},
		tarEntry{name: "etc/", dir: true, mode: 0o755},
		tarEntry{name: "etc/passwd", mode: 0o644, body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/app:/bin/sh\n"},
		tarEntry{name: "etc/group", mode: 0o644, body: "root:x:0:\napp:x:1234:\n"},
		tarEntry{name: "etc/gone.txt", mode: 0o644, body: "deleted above"},
		tarEntry{name: "data/", dir: true, mode: 0o755},
		tarEntry{name: "data/old.txt", mode: 0o644, body: "hidden by an opaque dir"},
		tarEntry{name: "app/", dir: true, mode: 0o755, uid: 1234},
	)
	top := layer(
		tarEntry{name: "etc/.wh.gone.txt", mode: 0o644},
		tarEntry{name: "data/", dir: true, mode: 0o755},
		tarEntry{name: "data/.wh..wh..opq", mode: 0o644},
		tarEntry{name: "data/new.txt", mode: 0o644, body: "new"},
	)
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.Config.Env = []string{"PATH=/bin", "GREETING=from-image"}
	cfg.Config.WorkingDir = "/app"
	cfg.Config.User = "app"
	cfg.Config.Cmd = []string{"hello"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

type tarEntry struct {
	name, body string
	mode       int64
	uid        int
	dir        bool
}

// TestTemplateImport imports an image from a registry (served in-process over
// the registry protocol) and from a docker archive, runs the image's own
// binary in sandboxes made from it, and deletes the template and its layers.
// TestTemplateManyLayers imports an image of 120 layers, more than one page
// of overlay mount options names, and starts a sandbox that sees every
// layer; an image of more layers than an overlay stacks is refused with a
// 400 and leaves no template.
func TestTemplateManyLayers(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	push := func(tag string, n int) string {
		t.Helper()
		var ls []v1.Layer
		for i := range n {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			body := fmt.Sprint(i)
			tw.WriteHeader(&tar.Header{Name: "many/", Mode: 0o755, Typeflag: tar.TypeDir})
			tw.WriteHeader(&tar.Header{Name: "many/f" + body, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(body))
			tw.Close()
			l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		}
		img, err := mutate.AppendLayers(empty.Image, ls...)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://")+"/test/many:"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		return ref.String()
	}
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "many", Ref: push("120", 120), Insecure: true}, nil); err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "many"})
	if err != nil {
		t.Fatal(err)
	}
	// The image has no shell: the agent's file API looks.
	if files, err := c.ListDir(ctx, sb.ID, "/many"); err != nil || len(files) != 120 {
		t.Errorf("a sandbox over 120 layers: %d files in /many, %v", len(files), err)
	}
	if r, err := c.ReadFile(ctx, sb.ID, "/many/f119"); err != nil {
		t.Error(err)
	} else if b, _ := io.ReadAll(r); string(b) != "119" {
		t.Errorf("the top layer's file: %q", b)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "toomany", Ref: push("501", 501), Insecure: true}, nil)
	if !errors.Is(err, atoll.ErrInvalid) || !strings.Contains(err.Error(), "at most 500") {
		t.Errorf("import of 501 layers: %v, want invalid naming the count", err)
	}
	if _, err := c.GetTemplate(ctx, "toomany"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("the refused template: %v", err)
	}
}

func TestTemplateImport(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	img := testImage(t)

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://")+"/test/hello:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if out, code := d.cli("template", "import", ref.String(), "--name", "hello", "--insecure"); code != 0 {
		t.Fatalf("template import: %s", out)
	}
	// The import made its layers' images: the first sandbox starts as
	// quickly as the rest.
	if tmpl, err := c.GetTemplate(ctx, "hello"); err != nil {
		t.Fatal(err)
	} else {
		images := layerImages(data)
		for _, l := range tmpl.Layers {
			if !images[l] {
				t.Errorf("after the import, layer %s has no mounted image (images: %v)", l, images)
			}
		}
	}

	// A private registry: basic auth in front of the same registry.
	private := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "agent" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Scheme, r2.URL.Host = "http", strings.TrimPrefix(reg.URL, "http://")
		resp, err := http.DefaultTransport.RoundTrip(r2)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer private.Close()
	privRef := strings.TrimPrefix(private.URL, "http://") + "/test/hello:v1"
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "priv", Ref: privRef, Insecure: true}, nil); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("import from a private registry without credentials: %v, want unauthorized", err)
	}
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "priv", Ref: privRef, Insecure: true, Username: "agent", Password: "s3cret"}, nil); err != nil {
		t.Errorf("import from a private registry with credentials: %v", err)
	} else if _, err := c.DeleteTemplate(ctx, "priv"); err != nil {
		t.Error(err)
	}
	archive := filepath.Join(testenv.Dir(t), "hello.tar")
	if err := tarball.WriteToFile(archive, ref, img); err != nil {
		t.Fatal(err)
	}
	if out, code := d.cli("template", "import", archive, "--name", "hello2"); code != 0 {
		t.Fatalf("template import of an archive: %s", out)
	}
	if out, _ := d.cli("template", "ls"); !strings.Contains(out, "hello2") || !strings.Contains(out, "host") {
		t.Errorf("template ls: %s", out)
	}

	for _, tmpl := range []string{"hello", "hello2"} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: tmpl})
		if err != nil {
			t.Fatalf("create from %s: %v", tmpl, err)
		}
		var out bytes.Buffer
		code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"hello", "/etc/gone.txt", "/data/old.txt", "/data/new.txt", "/home/user"}}, &out, &out)
		if err != nil || code != 0 {
			t.Fatalf("%s: exec hello: %v %d %s", tmpl, err, code, out.String())
		}
		want := "from-image /app 1234\n/etc/gone.txt false\n/data/old.txt false\n/data/new.txt true\n/home/user true\n"
		if out.String() != want {
			t.Errorf("%s: hello printed %q, want %q", tmpl, out.String(), want)
		}
		out.Reset()
		if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"hello"}, User: "user", Cwd: "/"}, &out, &out); err != nil || code != 0 || out.String() != "from-image / 1000\n" {
			t.Errorf("%s: hello as user: %v %d %q", tmpl, err, code, out.String())
		}
		if _, err := c.WriteFile(ctx, sb.ID, "/app/state.txt", strings.NewReader("kept"), 0o644); err != nil {
			t.Errorf("%s: write: %v", tmpl, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	t1, err := c.GetTemplate(ctx, "hello")
	if err != nil {
		t.Fatal(err)
	}
	// A tag is a second name over the same layers; deleting one keeps the other.
	if out, code := d.cli("template", "tag", "hello", "hello-v1"); code != 0 || out != "hello-v1\n" {
		t.Fatalf("template tag: %q %d", out, code)
	}
	if tagged, err := c.GetTemplate(ctx, "hello-v1"); err != nil || strings.Join(tagged.Layers, ",") != strings.Join(t1.Layers, ",") {
		t.Errorf("tagged template: %+v %v", tagged, err)
	}
	if out, code := d.cli("template", "rm", "hello-v1"); code != 0 {
		t.Errorf("template rm of the tag: %s", out)
	}
	if _, err := c.GetTemplate(ctx, "hello"); err != nil {
		t.Errorf("template after deleting its tag: %v", err)
	}
	if len(t1.Layers) != 2 || t1.SharedLayers != 2 || t1.Workdir != "/app" || t1.User != "app" {
		t.Errorf("template: %+v", t1)
	}
	for _, tmpl := range []string{"hello", "hello2"} {
		if out, code := d.cli("template", "rm", tmpl); code != 0 {
			t.Errorf("template rm %s: %s", tmpl, out)
		}
	}
	// Both templates shared the same two layers; with both gone, so are they.
	for _, l := range t1.Layers {
		if _, err := os.Stat(filepath.Join(data, "layers", "layers", l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s still on disk: %v", l, err)
		}
	}
	if _, err := c.GetTemplate(ctx, "hello"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("get deleted template: %v", err)
	}
}

// TestTemplateBuild builds a template from a Dockerfile FROM the host
// template, runs a sandbox from it, rebuilds it from the cache, and refuses a
// COPY from outside the build context.
func TestTemplateBuild(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	dir := testenv.Dir(t)
	os.MkdirAll(filepath.Join(dir, "src", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "sub", "data.txt"), []byte("from the context\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(`FROM host
ARG GREETING=hello
ENV GREETING=${GREETING} APP=/opt/app
RUN mkdir -p /opt/app && echo "built by $GREETING" > /opt/app/built.txt && echo step-output
COPY src/ /opt/app/
ADD bundle.tar.gz /opt/unpacked/
WORKDIR $APP
RUN ["sh", "-c", "cat built.txt sub/data.txt > both.txt"]
CMD ["cat", "both.txt"]
LABEL atoll.start="sleep 0.3 && echo up > /tmp/ready-flag" atoll.ready="test -f /tmp/ready-flag" atoll.pool=1
`), 0o644)

	{
		f, _ := os.Create(filepath.Join(dir, "bundle.tar.gz"))
		zw := gzip.NewWriter(f)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "inner/readme", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
		tw.Write([]byte("tar"))
		tw.Close()
		zw.Close()
		f.Close()
	}
	t0 := time.Now()
	out, code := d.cli("template", "build", "--name", "app", "--build-arg", "GREETING=hi", dir)
	if code != 0 {
		t.Fatalf("template build: %s\ndaemon: %s", out, d.out.String())
	}
	first := time.Since(t0)
	if !strings.Contains(out, "\nstep-output\n") {
		t.Errorf("build output lacks the RUN step's output: %s", out)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, c, sb.ID, "pwd; echo $GREETING; cat both.txt /opt/unpacked/inner/readme"); code != 0 || out != "/opt/app\nhi\nbuilt by hi\nfrom the context\ntar" {
		t.Errorf("sandbox from the built template: %q (exit %d)", out, code)
	}
	// Create waited for the ready command, which waited for the start command.
	if out, code := sh(t, c, sb.ID, "cat /tmp/ready-flag"); code != 0 || out != "up\n" {
		t.Errorf("start/ready commands: %q (exit %d)", out, code)
	}
	if out, _ := sh(t, c, sb.ID, "python3 -c 'print(2)'"); out != "2\n" {
		t.Errorf("host tools in a template built FROM host: %q", out)
	}
	// Files of different layers, and one the sandbox writes, never share
	// an inode number (package lowers).
	if out, _ := sh(t, c, sb.ID, `echo mine > /opt/app/mine.txt && python3 -c '
import os
seen, n = set(), 0
for d, dirs, files in os.walk("/opt"):
    for f in dirs + files:
        st = os.lstat(os.path.join(d, f))
        seen.add((st.st_dev, st.st_ino))
        n += 1
print(n, len(seen))'`); out != "9 9\n" {
		t.Errorf("files and directories of four layers and the sandbox under /opt, and distinct inodes among them: %q, want 9 9", out)
	}

	// An unchanged rebuild takes every layer from the cache.
	t0 = time.Now()
	out, code = d.cli("template", "build", "--name", "app2", "--build-arg", "GREETING=hi", dir)
	if code != 0 {
		t.Fatalf("rebuild: %s", out)
	}
	again := time.Since(t0)
	if strings.Contains(out, "\nstep-output\n") || strings.Count(out, "(cached)") != 4 {
		t.Errorf("rebuild ran steps again: %s", out)
	}
	t.Logf("build %v, unchanged rebuild %v", first, again)
	a1, _ := c.GetTemplate(ctx, "app")
	a2, _ := c.GetTemplate(ctx, "app2")
	if a1.StartCmd == "" || a1.ReadyCmd != "test -f /tmp/ready-flag" {
		t.Errorf("template start/ready: %q / %q", a1.StartCmd, a1.ReadyCmd)
	}
	if strings.Join(a1.Layers, ",") != strings.Join(a2.Layers, ",") || len(a1.Layers) != 4 {
		t.Errorf("layers of the build and the rebuild: %v / %v", a1.Layers, a2.Layers)
	}

	// A changed file in the context rebuilds from that step on.
	os.WriteFile(filepath.Join(dir, "src", "sub", "data.txt"), []byte("changed\n"), 0o644)
	if out, code := d.cli("template", "build", "--name", "app3", "--build-arg", "GREETING=hi", dir); code != 0 {
		t.Fatalf("build after a change: %s", out)
	}
	a3, _ := c.GetTemplate(ctx, "app3")
	if len(a3.Layers) != 4 || a3.Layers[0] != a1.Layers[0] || a3.Layers[1] == a1.Layers[1] {
		t.Errorf("layers after changing a copied file: %v, before %v", a3.Layers, a1.Layers)
	}

	// COPY from outside the context is refused; a failing RUN fails the build.
	for name, df := range map[string]string{
		"escape": "FROM host\nCOPY ../../etc/passwd /x\n",
		"fails":  "FROM host\nRUN exit 3\n",
	} {
		bad := testenv.Dir(t)
		os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte(df), 0o644)
		if out, code := d.cli("template", "build", "--name", "bad-"+name, bad); code == 0 {
			t.Errorf("%s: build succeeded: %s", name, out)
		}
		if _, err := c.GetTemplate(ctx, "bad-"+name); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("%s: failed build left a template: %v", name, err)
		}
	}
	c.DeleteSandbox(ctx, sb.ID)

	// atoll.pool=1 keeps one sandbox of it started, past its ready command:
	// a create is then handed that one, and does not wait the 0.3 s that
	// the start command takes.
	var warm time.Duration
	for i := 0; i < 50; i++ {
		time.Sleep(200 * time.Millisecond)
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app", Labels: map[string]string{"warm": "yes"}})
		if err != nil {
			t.Fatal(err)
		}
		warm = time.Since(t0)
		if out, code := sh(t, c, sb.ID, "cat /tmp/ready-flag"); code != 0 || out != "up\n" {
			t.Errorf("warm sandbox: %q", out)
		}
		c.DeleteSandbox(ctx, sb.ID)
		if warm < 300*time.Millisecond {
			break
		}
	}
	if warm >= 300*time.Millisecond {
		t.Errorf("create from a pooled template took %v, as long as a cold start with its start command", warm)
	}
	// Deleting the template discards its pooled sandboxes first.
	for _, name := range []string{"app", "app2", "app3"} {
		if _, err := c.DeleteTemplate(ctx, name); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	}
}

// TestTemplateBootstrap makes a Debian template with debootstrap from Debian's
// mirror and runs Debian's own tools in a sandbox made from it.
func TestTemplateBootstrap(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "debootstrap")
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	out, code := d.cli("template", "bootstrap", "debian", "--name", "debian")
	if code != 0 {
		t.Fatalf("template bootstrap: %s", out)
	}
	if !strings.Contains(out, "Base system installed successfully") {
		t.Errorf("bootstrap log not streamed: %s", out)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	got, code := sh(t, c, sb.ID, "cut -d. -f1 /etc/debian_version; apt-get --version | head -1 | cut -d' ' -f1; test -e /var/lib/dpkg/status && echo dpkg")
	if code != 0 || got != "12\napt\ndpkg\n" {
		t.Errorf("debian sandbox: %q (exit %d)", got, code)
	}
	var uid bytes.Buffer
	if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"id", "-u"}, User: "user"}, &uid, &uid); err != nil || code != 0 || uid.String() != "1000\n" {
		t.Errorf("user in the debian sandbox: %q %v", uid.String(), err)
	}
	c.DeleteSandbox(ctx, sb.ID)
}

// TestSnapshotsAndForks takes snapshots, forks, restores, pauses and resumes
// real sandboxes through the SDK.
func TestSnapshotsAndForks(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"role": "parent"}})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, c, sb.ID, "echo 1 > /root/a; dd if=/dev/urandom of=/root/big bs=1M count=20 2>/dev/null")
	s1, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, c, sb.ID, "echo 2 > /root/a")

	kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 3, Labels: map[string]string{"role": "child"}})
	if err != nil || len(kids) != 3 {
		t.Fatalf("fork: %v %v", kids, err)
	}
	for i, k := range kids {
		if out, _ := sh(t, c, k.ID, "cat /root/a; cmp -s /root/big /root/big && echo big"); out != "2\nbig\n" {
			t.Errorf("child %d sees %q", i, out)
		}
		sh(t, c, k.ID, fmt.Sprintf("echo child%d > /root/a", i))
		if k.Labels["role"] != "child" {
			t.Errorf("child labels %v", k.Labels)
		}
	}
	if out, _ := sh(t, c, sb.ID, "cat /root/a"); out != "2\n" {
		t.Errorf("parent after children wrote: %q", out)
	}
	if out, _ := sh(t, c, kids[1].ID, "cat /root/a"); out != "child1\n" {
		t.Errorf("child diverged: %q", out)
	}

	from, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: s1.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, from.ID, "cat /root/a"); out != "1\n" {
		t.Errorf("sandbox from snapshot sees %q", out)
	}
	if got, err := c.GetSnapshot(ctx, s1.ID); err != nil || got.Sandboxes != 1 {
		t.Errorf("snapshot users: %+v %v, want 1 sandbox", got, err)
	}
	if _, err := c.RestoreSandbox(ctx, sb.ID, api.RestoreRequest{Snapshot: s1.ID}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, sb.ID, "cat /root/a"); out != "1\n" {
		t.Errorf("parent after restore sees %q", out)
	}

	// Pause: processes hold still and exec is refused; resume: they go on.
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "while true; do date +%s%N >> /root/ticks; sleep 0.02; done", Background: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec on a paused sandbox: %v, want conflict", err)
	}
	if _, err := c.PauseSandbox(ctx, sb.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("double pause: %v", err)
	}
	paused, _ := os.ReadFile(filepath.Join(data, "layers", "sandboxes", sb.ID, "upper", "root", "ticks"))
	time.Sleep(300 * time.Millisecond)
	still, _ := os.ReadFile(filepath.Join(data, "layers", "sandboxes", sb.ID, "upper", "root", "ticks"))
	if len(paused) == 0 || len(still) != len(paused) {
		t.Errorf("ticks while paused: %d -> %d bytes", len(paused), len(still))
	}
	// A snapshot of a paused sandbox works too.
	if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{}); err != nil {
		t.Errorf("snapshot of a paused sandbox: %v", err)
	}
	if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if after, _ := os.ReadFile(filepath.Join(data, "layers", "sandboxes", sb.ID, "upper", "root", "ticks")); len(after) <= len(still) {
		t.Errorf("ticks after resume did not advance")
	}

	// ?resume=true on an agent route wakes a paused sandbox first.
	if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", d.url+"/v1/sandboxes/"+sb.ID+"/exec?resume=true", strings.NewReader(`{"cmd":["echo","awake"]}`))
	req.Header.Set("Authorization", "Bearer "+d.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"exit_code":0`) {
		t.Errorf("exec with ?resume=true on a paused sandbox: %d %s", resp.StatusCode, body)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); got.State != api.StateRunning {
		t.Errorf("state after ?resume=true: %s", got.State)
	}

	// Bad input.
	for _, n := range []int{-1, 101, 10000} {
		if _, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: n}); !errors.Is(err, atoll.ErrInvalid) {
			t.Errorf("fork count %d: %v", n, err)
		}
	}
	if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "a/b"}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("snapshot name with /: %v", err)
	}
	if _, err := c.CreateSnapshot(ctx, "aaaaaaaaaaaaaaaaaaaa", api.CreateSnapshotRequest{}); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("snapshot of an unknown sandbox: %v", err)
	}
	if _, err := c.RestoreSandbox(ctx, sb.ID, api.RestoreRequest{Snapshot: "bbbbbbbbbbbbbbbbbbbb"}); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("restore to an unknown snapshot: %v", err)
	}

	snaps, err := c.ListSnapshots(ctx, sb.ID)
	if err != nil || len(snaps) != 2 {
		t.Errorf("snapshots of the parent: %v %v", snaps, err)
	}
	for _, sn := range snaps {
		if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
			t.Errorf("delete snapshot: %v", err)
		}
	}
	ids := []string{sb.ID, from.ID}
	for _, k := range kids {
		ids = append(ids, k.ID)
	}
	for _, id := range ids {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if left := leftovers(data, ids...); len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "layers", "snapshots")); len(ents) != 0 {
		t.Errorf("snapshot subvolumes left: %d", len(ents))
	}
}

// TestLifecyclePolicies: a timeout stops a sandbox and can be extended; an
// ephemeral sandbox is deleted when it stops; auto-delete removes a stopped one.
func TestLifecyclePolicies(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	waitState := func(id, want string, within time.Duration) string {
		deadline := time.Now().Add(within)
		for {
			sb, err := c.GetSandbox(ctx, id)
			state := sb.State
			if errors.Is(err, atoll.ErrNotFound) {
				state = "gone"
			}
			if state == want || time.Now().After(deadline) {
				return state
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	timed, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if timed.ExpiresAt == nil {
		t.Errorf("no expires_at: %+v", timed)
	}
	extended, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetTimeout(ctx, extended.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := waitState(timed.ID, api.StateStopped, 10*time.Second); got != api.StateStopped {
		t.Errorf("timed sandbox is %s, want stopped", got)
	}
	if got, _ := c.GetSandbox(ctx, extended.ID); got.State != api.StateRunning {
		t.Errorf("extended sandbox is %s", got.State)
	}

	eph, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if sb, err := c.StopSandbox(ctx, eph.ID); err != nil || sb.State != api.StateDeleted {
		t.Errorf("stop of an ephemeral sandbox: %+v %v", sb, err)
	}
	if _, err := c.GetSandbox(ctx, eph.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("ephemeral sandbox after stop: %v", err)
	}
	auto, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{AutoDeleteSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StopSandbox(ctx, auto.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitState(auto.ID, "gone", 10*time.Second); got != "gone" {
		t.Errorf("auto-delete sandbox is %s, want gone", got)
	}
	// Auto-archive: a stopped sandbox goes to the archive store, and a start
	// brings its files back.
	arch, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{AutoArchiveSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if arch.AutoArchiveSec != 1 {
		t.Errorf("auto_archive_sec not kept: %+v", arch)
	}
	if _, err := c.Exec(ctx, arch.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f"}}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StopSandbox(ctx, arch.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitState(arch.ID, api.StateArchived, 10*time.Second); got != api.StateArchived {
		t.Errorf("auto-archive sandbox is %s, want archived", got)
	}
	if _, err := c.StartSandbox(ctx, arch.ID); err != nil {
		t.Fatal(err)
	}
	var kept strings.Builder
	if _, err := c.Exec(ctx, arch.ID, api.ExecRequest{Cmd: []string{"cat", "/root/f"}}, &kept, &kept); err != nil || kept.String() != "kept\n" {
		t.Errorf("after auto-archive and start: %q %v", kept.String(), err)
	}
	c.DeleteSandbox(ctx, arch.ID)
	if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{AutoArchiveSec: -1}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("negative auto_archive_sec: %v", err)
	}
	// Auto-stop: an idle sandbox stops; one running a process of its own does not.
	idle, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{AutoStopSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{AutoStopSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, busy.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		sb, _ := c.ListSandboxes(ctx, atoll.ListOptions{State: api.StateStopped})
		stopped := map[string]bool{}
		for _, x := range sb {
			stopped[x.ID] = true
		}
		if stopped[idle.ID] || time.Now().After(deadline) {
			if !stopped[idle.ID] {
				t.Errorf("idle sandbox with auto_stop_sec=1 did not stop")
			}
			if stopped[busy.ID] {
				t.Errorf("sandbox running its own process was auto-stopped")
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.DeleteSandbox(ctx, idle.ID)
	c.DeleteSandbox(ctx, busy.ID)

	if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutSec: -1}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("negative timeout: %v", err)
	}
	if left := leftovers(data, eph.ID, auto.ID); len(left) > 0 {
		t.Errorf("left after policy deletes: %v", left)
	}
	c.DeleteSandbox(ctx, timed.ID)
	c.DeleteSandbox(ctx, extended.ID)
}

// TestStateRaces runs snapshots, forks, pauses and deletes of one sandbox at
// once, and kills the daemon in the middle of a fork: every snapshot is whole,
// a deleted sandbox never runs again, and nothing is left behind.
func TestStateRaces(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, c, sb.ID, "seq 1 100000 > /root/n")

	// Two snapshots at once: both whole, or one whole and the other
	// cleanly refused.
	var wg sync.WaitGroup
	snaps := make([]api.Snapshot, 2)
	errs := make([]error, 2)
	for i := range snaps {
		wg.Add(1)
		go func() { defer wg.Done(); snaps[i], errs[i] = c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{}) }()
	}
	wg.Wait()
	if errors.Is(errs[0], atoll.ErrConflict) && errors.Is(errs[1], atoll.ErrConflict) {
		t.Fatalf("both concurrent snapshots refused: %v", errs)
	}
	for i, sn := range snaps {
		if errors.Is(errs[i], atoll.ErrConflict) {
			continue
		}
		if errs[i] != nil {
			t.Fatalf("concurrent snapshot %d: %v", i, errs[i])
		}
		from, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: sn.ID})
		if err != nil {
			t.Fatal(err)
		}
		if out, _ := sh(t, c, from.ID, "wc -l < /root/n"); out != "100000\n" {
			t.Errorf("snapshot %d is not whole: %q", i, out)
		}
		c.DeleteSandbox(ctx, from.ID)
	}

	// Restore across templates is refused.
	dir := testenv.Dir(t)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM host\nRUN touch /root/other\n"), 0o644)
	if out, code := d.cli("template", "build", "--name", "other", dir); code != 0 {
		t.Fatal(out)
	}
	other, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "other"})
	if err != nil {
		t.Fatal(err)
	}
	otherSnap, err := c.CreateSnapshot(ctx, other.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RestoreSandbox(ctx, sb.ID, api.RestoreRequest{Snapshot: otherSnap.ID}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("restore across templates: %v, want invalid", err)
	}

	// Delete racing a fork, a snapshot, a pause and a resume, of a running
	// and of a paused sandbox, the others started a little before and a
	// little after it: once delete returns, the sandbox is gone for good.
	// Its ID gives 404 to all of them, and nothing runs in its cgroup, then
	// or a moment later.
	c.DeleteSandbox(ctx, sb.ID)
	for _, paused := range []bool{false, true} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if paused {
			if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		ops := []func() error{
			func() error { _, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 2}); return err },
			func() error { _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{}); return err },
			func() error { _, err := c.PauseSandbox(ctx, sb.ID); return err },
			func() error { _, err := c.ResumeSandbox(ctx, sb.ID); return err },
		}
		for i, op := range ops {
			wg.Add(1)
			go func() { defer wg.Done(); time.Sleep(time.Duration(i) * 5 * time.Millisecond); op() }()
		}
		time.Sleep(7 * time.Millisecond)
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for i, op := range ops {
			if err := op(); !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("operation %d after delete (paused: %v): %v, want not found", i, paused, err)
			}
		}
		for range 2 {
			if _, err := c.GetSandbox(ctx, sb.ID); !errors.Is(err, atoll.ErrNotFound) {
				t.Errorf("deleted sandbox (paused: %v): %v", paused, err)
			}
			if left := leftovers(data, sb.ID); len(left) > 0 {
				t.Errorf("left after delete (paused: %v): %v", paused, left)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}

	// kill -9 in the middle of a fork: after a restart every listed sandbox
	// works and every writable layer and snapshot on disk has a record.
	parent, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	go c.ForkSandbox(ctx, parent.ID, api.ForkRequest{Count: 5})
	time.Sleep(40 * time.Millisecond)
	d.kill()
	d.args = []string{"--warm-pool", "0"}
	d.start()
	c = d.client()
	list, err := c.ListSandboxes(ctx, atoll.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range list {
		listed[s.ID] = true
		if s.State != api.StateRunning {
			t.Errorf("sandbox %s is %s after the restart", s.ID, s.State)
		} else if out, _ := sh(t, c, s.ID, "echo ok"); out != "ok\n" {
			t.Errorf("sandbox %s does not work: %q", s.ID, out)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(data, "layers", "sandboxes"))
	for _, e := range ents {
		if !listed[e.Name()] {
			t.Errorf("writable layer %s has no sandbox", e.Name())
		}
	}
	recorded := map[string]bool{}
	sns, _ := c.ListSnapshots(ctx, "")
	for _, sn := range sns {
		recorded[sn.ID] = true
	}
	ents, _ = os.ReadDir(filepath.Join(data, "layers", "snapshots"))
	for _, e := range ents {
		if !recorded[e.Name()] {
			t.Errorf("snapshot %s on disk has no record", e.Name())
		}
	}
}

// TestArchive moves a stopped sandbox's files to the archive store, frees the
// local disk, and brings them back on start, whiteouts and all: with the
// default file:// store and with an S3 server.
func TestArchive(t *testing.T) {
	t.Run("file", func(t *testing.T) { testArchive(t, "") })
	t.Run("s3", func(t *testing.T) { testArchive(t, testenv.S3URL(t)) })
}

// testArchive runs TestArchive with the store at url, "" for the default.
func testArchive(t *testing.T, url string) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	var args []string
	if url != "" {
		args = []string{"--archive", url}
	} else {
		url = "file://" + filepath.Join(data, "archive")
	}
	d := startDaemon(t, data, args...)
	c := d.client()
	ctx := context.Background()
	bucket, err := blob.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	object := "sandboxes/" + sb.ID + ".tar"
	gone := func(when string) {
		t.Helper()
		if r, err := bucket.Get(ctx, object); !errors.Is(err, errdefs.ErrNotFound) {
			if err == nil {
				r.Close()
			}
			t.Errorf("archive object %s: %v, want NotFound", when, err)
		}
	}
	sum, _ := sh(t, c, sb.ID, "dd if=/dev/urandom of=/root/data bs=1M count=64 2>/dev/null; rm /etc/hostname; rm -rf /var/log && mkdir /var/log && touch /var/log/new; md5sum /root/data")
	if _, err := c.ArchiveSandbox(ctx, sb.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("archive of a running sandbox: %v, want conflict", err)
	}
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.ArchiveSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateArchived {
		t.Fatalf("archive: %+v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(data, "layers", "sandboxes", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("local writable layer still there: %v", err)
	}
	if r, err := bucket.Get(ctx, object); err != nil || r.Size() < 64<<20 {
		t.Errorf("archive object: %v", err)
	} else {
		r.Close()
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec on an archived sandbox: %v", err)
	}
	// While the files come back, the sandbox shows how far they have got.
	started := make(chan error, 1)
	go func() { _, err := c.StartSandbox(ctx, sb.ID); started <- err }()
	var seen *api.Progress
poll:
	for {
		select {
		case err := <-started:
			if err != nil {
				t.Fatal(err)
			}
			break poll
		default:
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err == nil && got.Progress != nil && seen == nil {
			seen = got.Progress
		}
		time.Sleep(5 * time.Millisecond)
	}
	if seen == nil || seen.Op != "restoring" || seen.TotalBytes < 64<<20 || seen.DoneBytes > seen.TotalBytes {
		t.Errorf("progress during the restore: %+v", seen)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); got.Progress != nil {
		t.Errorf("progress after the restore: %+v", got.Progress)
	}
	out, _ := sh(t, c, sb.ID, "md5sum /root/data; test -e /etc/hostname && echo hostname-back; ls /var/log")
	if out != sum+"new\n" {
		t.Errorf("after restore from the archive: %q, want %q", out, sum+"new\n")
	}
	gone("after restore")
	// Archive again, then delete: the object goes too.
	c.StopSandbox(ctx, sb.ID)
	if _, err := c.ArchiveSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	gone("after delete")
	if left := leftovers(data, sb.ID); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}

// TestArchiveSnapshot archives a snapshot and brings it back by creating a
// sandbox from it and by restoring a sandbox to it.
func TestArchiveSnapshot(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := sh(t, c, sb.ID, "dd if=/dev/urandom of=/root/data bs=1M count=3 2>/dev/null; rm /etc/hostname; md5sum /root/data")
	sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
	if err != nil || sn.State != api.SnapshotReady {
		t.Fatalf("snapshot: %+v %v", sn, err)
	}
	local := filepath.Join(data, "layers", "snapshots", sn.ID)
	object := filepath.Join(data, "archive", "snapshots", sn.ID+".tar")
	archive := func() {
		t.Helper()
		got, err := c.ArchiveSnapshot(ctx, sn.ID)
		if err != nil || got.State != api.SnapshotArchived {
			t.Fatalf("archive snapshot: %+v %v", got, err)
		}
		if _, err := os.Stat(local); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("local snapshot still there: %v", err)
		}
		if fi, err := os.Stat(object); err != nil || fi.Size() < 3<<20 {
			t.Errorf("archive object: %v %v", fi, err)
		}
	}
	archive()
	if _, err := c.ArchiveSnapshot(ctx, sn.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("archive of an archived snapshot: %v, want conflict", err)
	}
	if _, err := c.ArchiveSnapshot(ctx, "aaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("archive of an unknown snapshot: %v, want not found", err)
	}

	// Creating from it brings it back.
	child, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := sum + "gone\n"
	if out, _ := sh(t, c, child.ID, "md5sum /root/data; test -e /etc/hostname || echo gone"); out != want {
		t.Errorf("sandbox from an archived snapshot: %q, want %q", out, want)
	}
	if got, _ := c.GetSnapshot(ctx, sn.ID); got.State != api.SnapshotReady {
		t.Errorf("snapshot after use: %+v", got)
	}
	if _, err := os.Stat(object); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("archive object after the snapshot came back: %v", err)
	}

	// Restoring to it brings it back too.
	archive()
	sh(t, c, sb.ID, "rm /root/data")
	if _, err := c.RestoreSandbox(ctx, sb.ID, api.RestoreRequest{Snapshot: sn.ID}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, sb.ID, "md5sum /root/data; test -e /etc/hostname || echo gone"); out != want {
		t.Errorf("sandbox restored to an archived snapshot: %q, want %q", out, want)
	}

	// Deleting an archived snapshot removes its object.
	archive()
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(object); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("archive object after delete: %v", err)
	}
	c.DeleteSandbox(ctx, sb.ID)
	c.DeleteSandbox(ctx, child.ID)
}

// TestServeBadArchive checks that an archive URL atoll cannot use stops
// `atoll serve` at startup, before it makes a layer image, saying why.
func TestServeBadArchive(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct{ url, want string }{
		{"gs://bucket", `unsupported scheme "gs"`},
		{"s3://bucket?endpoint=http://127.0.0.1:1&use_path_style=yes", `invalid value for "use_path_style"`},
	} {
		data := filepath.Join(testenv.Dir(t), "data")
		out, err := exec.Command(atollBinary(t), "serve", "--data", data, "--archive", tc.url).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--archive: ") || !strings.Contains(string(out), tc.want) {
			t.Errorf("atoll serve --archive %s: %v: %s, want it to say %s", tc.url, err, out, tc.want)
		}
		if _, err := os.Stat(filepath.Join(data, "layers")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("atoll serve --archive %s made a layer store: %v", tc.url, err)
		}
	}
}
