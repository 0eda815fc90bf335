package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestCreateSettingsApply checks that what a create asks for (limits, disk,
// env, labels) holds whether the sandbox came from the warm pool or was
// started cold: the first creates after the pool fills are pool hits.
func TestCreateSettingsApply(t *testing.T) {
	_, _, c := startRooted(t)
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

// TestLifecyclePolicies: a timeout stops a sandbox and can be extended; an
// ephemeral sandbox is deleted when it stops; auto-delete removes a stopped one.
func TestLifecyclePolicies(t *testing.T) {
	_, data, c := startRooted(t)
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

	timed := newSandbox(ctx, t, c, api.CreateSandboxRequest{TimeoutSec: 1})
	if timed.ExpiresAt == nil {
		t.Errorf("no expires_at: %+v", timed)
	}
	extended := newSandbox(ctx, t, c, api.CreateSandboxRequest{TimeoutSec: 1})
	if _, err := c.SetTimeout(ctx, extended.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := waitState(timed.ID, api.StateStopped, 10*time.Second); got != api.StateStopped {
		t.Errorf("timed sandbox is %s, want stopped", got)
	}
	if got, _ := c.GetSandbox(ctx, extended.ID); got.State != api.StateRunning {
		t.Errorf("extended sandbox is %s", got.State)
	}

	eph := newSandbox(ctx, t, c, api.CreateSandboxRequest{Ephemeral: true})
	if sb, err := c.StopSandbox(ctx, eph.ID); err != nil || sb.State != api.StateDeleted {
		t.Errorf("stop of an ephemeral sandbox: %+v %v", sb, err)
	}
	if _, err := c.GetSandbox(ctx, eph.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("ephemeral sandbox after stop: %v", err)
	}
	auto := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoDeleteSec: 1})
	if _, err := c.StopSandbox(ctx, auto.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitState(auto.ID, "gone", 10*time.Second); got != "gone" {
		t.Errorf("auto-delete sandbox is %s, want gone", got)
	}
	// Auto-archive: a stopped sandbox goes to the archive store, and a start
	// brings its files back.
	arch := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoArchiveSec: 1})
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
	idle := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoStopSec: 1})
	busy := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoStopSec: 1})
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
