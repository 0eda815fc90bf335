package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestSnapshotsAndForks takes snapshots, forks, restores, pauses and resumes
// real sandboxes through the SDK.
func TestSnapshotsAndForks(t *testing.T) {
	d, data, c := startRooted(t)
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Labels: map[string]string{"role": "parent"}})
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

	from := newSandbox(ctx, t, c, api.CreateSandboxRequest{Snapshot: s1.ID})
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
