package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestShelveEndToEnd pauses an ns sandbox without its memory (state
// shelved): its processes and cgroups go, its files stay, it stays shelved
// through a kill -9 of the server, and resume boots it again (a new PID 1)
// over the same files. Wrong states and another tenant's key are refused.
func TestShelveEndToEnd(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0")
	ctx := context.Background()
	// The template's layers stay mounted once a sandbox used them.
	var sb api.Sandbox
	before := warmBaseline(ctx, t, c, data)

	// Ephemeral, with a timeout: a shelved sandbox is paused, not stopped,
	// so neither its timeout nor the ephemeral policy may take it.
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Ephemeral: true, TimeoutSec: 600})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if out, code := sh(t, c, id, "echo kept > /root/state.txt"); code != 0 {
		t.Fatalf("write: %s", out)
	}
	// PID 1's start time (field 22 of its stat) tells one boot from the next.
	bootOf := func() string {
		t.Helper()
		out, code := sh(t, c, id, "cut -d' ' -f22 /proc/1/stat")
		if code != 0 {
			t.Fatalf("boot: %s", out)
		}
		return strings.TrimSpace(out)
	}
	boot := bootOf()
	if _, err := c.StartProcess(ctx, id, api.ExecRequest{Shell: "sleep 600"}); err != nil {
		t.Fatal(err)
	}
	if got := inCgroup(id); len(got) < 2 {
		t.Fatalf("positive control: the sandbox runs processes: %v", got)
	}

	// Another tenant's key cannot shelve or resume it.
	status, body := d.v1(t, "POST", "/v1/keys", d.key, `{"name":"other-team"}`)
	wantV1(t, "create key", status, body, 201, "")
	var other api.APIKey
	json.Unmarshal(body, &other)
	status, body = d.v1(t, "POST", "/v1/sandboxes/"+id+"/pause", other.Key, `{"memory":false}`)
	wantV1(t, "another tenant's shelve", status, body, 404, "not_found")
	status, body = d.v1(t, "POST", "/v1/sandboxes/"+id+"/pause", d.key, `{"memory":false,"to_disk":true}`)
	wantV1(t, "shelve to disk", status, body, 400, "invalid")

	if out, code := d.cli("pause", "--no-memory", id); code != 0 {
		t.Fatalf("atoll pause --no-memory: %s", out)
	}
	sb, err = c.GetSandbox(ctx, id)
	if err != nil || sb.State != api.StateShelved || sb.ExpiresAt != nil {
		t.Fatalf("after shelve: %+v, %v", sb, err)
	}
	for _, dir := range cgroupDirs(id) {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("a shelved sandbox still has its cgroup %s", dir)
		}
	}
	if got := inCgroup(id); len(got) > 0 {
		t.Errorf("a shelved sandbox still runs processes: %v", got)
	}
	if _, err := c.Exec(ctx, id, api.ExecRequest{Shell: "true"}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec in a shelved sandbox: %v, want conflict", err)
	}
	for what, op := range map[string]func(context.Context, string) (api.Sandbox, error){
		"shelve": c.ShelveSandbox, "pause": c.PauseSandbox, "start": c.StartSandbox,
	} {
		if _, err := op(ctx, id); !errors.Is(err, atoll.ErrConflict) {
			t.Errorf("%s of a shelved sandbox: %v, want conflict", what, err)
		}
	}
	status, body = d.v1(t, "POST", "/v1/sandboxes/"+id+"/resume", other.Key, "")
	wantV1(t, "another tenant's resume", status, body, 404, "not_found")

	// kill -9 of the server: it comes back shelved, nothing of it running.
	d.kill()
	time.Sleep(time.Second)
	d.start()
	c = d.client()
	sb, err = c.GetSandbox(ctx, id)
	if err != nil || sb.State != api.StateShelved {
		t.Fatalf("after a kill -9 of the server: %+v, %v", sb, err)
	}
	if _, err := c.ResumeSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, id, "cat /root/state.txt"); strings.TrimSpace(out) != "kept" {
		t.Errorf("files after resume: %q", out)
	}
	if b := bootOf(); b == boot {
		t.Errorf("resume did not boot the sandbox again: PID 1 started at %s before and after", b)
	}
	if out, _ := sh(t, c, id, "pgrep -x sleep || echo none"); strings.TrimSpace(out) != "none" {
		t.Errorf("a process outlived the shelve: %q", out)
	}
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning || sb.ExpiresAt == nil {
		t.Errorf("after resume: %+v, %v (want running with its timeout again)", sb, err)
	}

	// A shelved sandbox stops as one with nothing running (ephemeral: deleted).
	if _, err := c.ShelveSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if sb, err := c.StopSandbox(ctx, id); err != nil || sb.State != api.StateDeleted {
		t.Errorf("stop of a shelved ephemeral sandbox: %+v, %v", sb, err)
	}
	// Wrong states: stopped, and deleted.
	st := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	if _, err := c.StopSandbox(ctx, st.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ShelveSandbox(ctx, st.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("shelve of a stopped sandbox: %v, want conflict", err)
	}
	if _, err := c.ResumeSandbox(ctx, st.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("resume of a stopped sandbox: %v, want conflict", err)
	}
	if err := c.DeleteSandbox(ctx, st.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ShelveSandbox(ctx, id); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("shelve of a deleted sandbox: %v, want not found", err)
	}
	if l := leftSince(t, before, data); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}
