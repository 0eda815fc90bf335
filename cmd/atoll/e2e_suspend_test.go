package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

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
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: "gvisor", MemoryMiB: 512})
	id := sb.ID
	if _, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: counterShell}); err != nil {
		t.Fatal(err)
	}
	count := func() int { t.Helper(); return readCounter(t, c, id) }
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
	ns := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
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
	count := func() int { t.Helper(); return readCounter(t, c, id) }
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

// readCounter reads the count counterShell keeps in sandbox id.
func readCounter(t *testing.T, c *atoll.Client, id string) int {
	t.Helper()
	out, code := sh(t, c, id, "cat /root/count")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("count: %q %d", out, code)
	}
	return n
}
