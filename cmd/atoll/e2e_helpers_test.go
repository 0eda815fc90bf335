package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
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

	_ "modernc.org/sqlite" // reads the store's transitions, see recordedIDs

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// These tests run the real `atoll serve` binary as root on a fresh data
// directory and drive it through the SDK and the CLI.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes what the package's tests built once, when they are
// done: the atoll binary (atollBinary), the agent (testenv.AgentBinary)
// and the Python SDK's venv (pythonSDK). Each run left its tens of MB in
// the temporary directory.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	if venvPy != "" {
		os.RemoveAll(filepath.Dir(filepath.Dir(venvPy))) // DIR/bin/python
	}
	testenv.RemoveAgentBinary()
	os.Exit(code)
}

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

// startRooted needs root (see testenv.RequireRoot), then starts `atoll
// serve` on a fresh data directory with the extra flags args, and returns
// it with that directory and a client.
func startRooted(t *testing.T, args ...string) (d *daemon, data string, c *atoll.Client) {
	t.Helper()
	testenv.RequireRoot(t)
	data = filepath.Join(testenv.Dir(t), "data")
	d = startDaemon(t, data, args...)
	return d, data, d.client()
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
	return atoll.New(d.url, key, atoll.WithHTTPClient(d.httpClient()))
}

// httpClient is an HTTP client that reaches the daemon: nil (the default
// one) unless the daemon runs in a network namespace of its own.
func (d *daemon) httpClient() *http.Client {
	if d.netns == "" {
		return nil
	}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = nettest.In(d.netns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// cli runs the atoll CLI against the daemon and returns stdout and exit code.
func (d *daemon) cli(args ...string) (string, int) {
	return d.cliIn("", args...)
}

// cliIn is cli with stdin as the command's standard input.
func (d *daemon) cliIn(stdin string, args ...string) (string, int) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key)
	cmd.Stdin = strings.NewReader(stdin)
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

// newSandbox creates a sandbox through c, or fails t.
func newSandbox(ctx context.Context, t *testing.T, c *atoll.Client, req api.CreateSandboxRequest) api.Sandbox {
	t.Helper()
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// fetch sends req with client and returns the answer's status and body,
// or fails t if there is none.
func fetch(t *testing.T, client *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// startCluster starts the nodes cfg asks for (netcluster.New), of the atoll
// binary these tests build, and logs how long they took to come up.
func startCluster(t *testing.T, cfg netcluster.Config) *netcluster.Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	start := time.Now()
	cfg.Bin = atollBinary(t)
	cl := netcluster.New(t, cfg)
	t.Logf("%d nodes up in %s", len(cl.Nodes), time.Since(start).Round(time.Millisecond))
	return cl
}

// atOnce calls f(i) for each i below n at once, and returns what the calls
// answer, once all are done, with their errors joined.
func atOnce[T any](n int, f func(i int) (T, error)) ([]T, error) {
	vs := make([]T, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vs[i], errs[i] = f(i)
		}()
	}
	wg.Wait()
	return vs, errors.Join(errs...)
}

// listSandboxes returns every sandbox c lists, or fails t.
func listSandboxes(ctx context.Context, t *testing.T, c *atoll.Client) []api.Sandbox {
	t.Helper()
	sbs, err := c.ListSandboxes(ctx, atoll.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

// warmBaseline creates and deletes a sandbox, so that the template's layer
// images are made (they stay), and returns what is then on the host: the
// baseline against which a test looks for leftovers.
func warmBaseline(ctx context.Context, t *testing.T, c *atoll.Client, data string) []string {
	t.Helper()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	return hostState(t, data)
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
		if prestarted[processSandbox(e.Name())] || spawnHelperOfServer(e.Name()) {
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
			// Emptied writable layers kept for the next creates are the
			// layer store's (layers/spares.go): at most 64, and gone when
			// it is next opened.
			if _, path, ok := strings.Cut(line, " path "); ok && !strings.HasPrefix(path, "spares/") {
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

// spawnHelperOfServer is whether process pid is a running server's spawn
// helper (atoll-agent spawn, package spawn): a part of the server, started
// with its first sandbox and ended with it. One whose server is gone (its
// parent now init) is a leak like any other process.
func spawnHelperOfServer(pid string) bool {
	cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) != 2 || args[1] != "spawn" {
		return false
	}
	stat, _ := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	_, rest, _ := strings.Cut(string(stat), ") ")
	f := strings.Fields(rest)
	return len(f) > 1 && f[1] != "1" && f[1] != "0"
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
