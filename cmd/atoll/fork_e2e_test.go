package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestForkWhileWriting forks and snapshots sandboxes while a process in each
// appends numbered lines to a file as fast as it can, never syncing: every
// child's copy of the file must be a prefix of what the writer writes (no
// zeros where metadata ran ahead of data, no line out of order), hold at
// least what the parent held just before, and the writer must go on. The
// parent's frozen time, which the server logs, must stay short although
// hundreds of MB were written a moment before (docs/lifecycle.md).
func TestForkWhileWriting(t *testing.T) {
	testenv.RequireRoot(t)
	d := startDaemon(t, filepath.Join(testenv.Dir(t), "data"))
	c := d.client()
	for _, rt := range []string{"ns", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireCommand(t, "runsc")
			}
			forkWhileWriting(t, d, c, rt)
		})
	}
}

// frozenLine is the server's log line for one freeze of a sandbox.
var frozenLine = regexp.MustCompile(`msg="sandbox frozen" sandbox=(\S+) op=(\S+) ms=([0-9.]+)`)

func forkWhileWriting(t *testing.T, d *daemon, c *atoll.Client, rt string) {
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: rt, MemoryMiB: 512})
	defer c.DeleteSandbox(ctx, sb.ID)
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "exec seq 1 4000000000 > /root/log", Background: true}); err != nil {
		t.Fatal(err)
	}
	size := func(id string) int64 {
		t.Helper()
		out, _ := sh(t, c, id, "stat -c %s /root/log")
		n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if err != nil {
			t.Fatalf("size of /root/log in %s: %q", id, out)
		}
		return n
	}
	// Far more than the layer store lets stay dirty: without its bound,
	// the freeze would last while this much went to the disk.
	deadline := time.Now().Add(2 * time.Minute)
	for size(sb.ID) < 256<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the writer wrote %d bytes in 2 minutes", size(sb.ID))
		}
		time.Sleep(100 * time.Millisecond)
	}

	before := size(sb.ID)
	kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 1})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork while writing: %v %v", kids, err)
	}
	defer c.DeleteSandbox(ctx, kids[0].ID)
	afterFork := size(sb.ID)
	sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatalf("snapshot while writing: %v", err)
	}
	defer c.DeleteSnapshot(ctx, sn.ID)
	from := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: rt, MemoryMiB: 512, Snapshot: sn.ID})
	defer c.DeleteSandbox(ctx, from.ID)

	// The writer goes on after both.
	grown := size(sb.ID)
	time.Sleep(300 * time.Millisecond)
	if now := size(sb.ID); now <= grown {
		t.Errorf("the writer stopped: /root/log stays at %d bytes after the fork and the snapshot", now)
	}
	sh(t, c, sb.ID, "kill $(pidof seq)")

	for _, k := range []struct {
		what string
		id   string
		min  int64
	}{{"fork", kids[0].ID, before}, {"snapshot", from.ID, afterFork}} {
		// Every byte is a digit or a newline; every whole line is its line
		// number; a last line without its newline is the start of one.
		out, code := sh(t, c, k.id, `f=/root/log
n=$(tr -d '0-9\n' < $f | wc -c)
[ "$n" = 0 ] || { echo "$n bytes neither digits nor newlines"; exit 1; }
awk '$0 != NR { if ((getline x) > 0 || index(NR "", $0) != 1) { print "line " NR " is " $0; exit 1 } }' $f || exit 1
stat -c %s $f`)
		if code != 0 {
			t.Errorf("%s of a sandbox writing: its copy of the file is not a prefix of what was written: %s", k.what, out)
			continue
		}
		got, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if got < k.min {
			t.Errorf("%s of a sandbox writing holds %d bytes of its file; the parent had %d before", k.what, got, k.min)
		}
		t.Logf("%s: the copy holds %d bytes (the parent had %d just before)", k.what, got, k.min)
	}

	// The server logs each freeze; the parent was frozen once for the fork
	// and once for the snapshot.
	var frozen []string
	for _, m := range frozenLine.FindAllStringSubmatch(d.out.String(), -1) {
		if m[1] != sb.ID {
			continue
		}
		frozen = append(frozen, m[2])
		ms, _ := strconv.ParseFloat(m[3], 64)
		t.Logf("%s: parent frozen %.1f ms", m[2], ms)
		// Generous for a loaded machine; without the bound it is seconds.
		// Not for gvisor: its pause and resume are each a start of runsc,
		// 100 ms or more on a loaded machine, beside which the flush is
		// small.
		if rt == "ns" && ms > 500 {
			t.Errorf("%s of a sandbox writing froze it for %.0f ms", m[2], ms)
		}
	}
	if fmt.Sprint(frozen) != "[fork snapshot]" {
		t.Errorf("freezes logged for the parent: %v, want [fork snapshot]", frozen)
	}
}
