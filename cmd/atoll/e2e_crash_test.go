package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// restartCold starts the killed daemon d again without a warm pool, so
// that everything on the host must belong to a listed sandbox (pooled ones
// are discarded at start), and returns its client and the sandboxes it
// lists.
func restartCold(ctx context.Context, t *testing.T, d *daemon) (*atoll.Client, []api.Sandbox) {
	t.Helper()
	d.args = []string{"--warm-pool", "0"}
	d.start()
	c := d.client()
	return c, listSandboxes(ctx, t, c)
}

// TestKillDuringCreate kills the daemon while creates are in flight: after a
// restart every listed sandbox works, and nothing is left of the others.
func TestKillDuringCreate(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0")
	ctx := context.Background()
	// Warm the template so creates are in their interesting part; what is
	// on the host then is the baseline.
	before := warmBaseline(ctx, t, c, data)
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
		var sbs []api.Sandbox
		c, sbs = restartCold(ctx, t, d)
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
	before := warmBaseline(ctx, t, c, data)

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
			srcs, err := atOnce(n, func(int) (string, error) {
				sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
				if err == nil {
					_, err = run(c, sb.ID, "echo m-"+sb.ID+" > /root/marker && head -c 4194304 /dev/urandom > /root/bulk")
				}
				if err == nil && op.name == "archive" {
					_, err = c.StopSandbox(ctx, sb.ID)
				}
				return sb.ID, err
			})
			if err != nil {
				t.Fatal(err)
			}

			// One operation on each at once, then kill -9.
			snaps := make([]api.Snapshot, n)
			kids := make([][]api.Sandbox, n)
			took := make([]time.Duration, n) // till the answer, if any
			errs := make([]error, n)
			var wg sync.WaitGroup
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
			sbs := listSandboxes(ctx, t, c)
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

// TestStateRaces runs snapshots, forks, pauses and deletes of one sandbox at
// once, and kills the daemon in the middle of a fork: every snapshot is whole,
// a deleted sandbox never runs again, and nothing is left behind.
func TestStateRaces(t *testing.T) {
	d, data, c := startRooted(t)
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
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
		from := newSandbox(ctx, t, c, api.CreateSandboxRequest{Snapshot: sn.ID})
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
	other := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "other"})
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
		sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
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
	parent := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	go c.ForkSandbox(ctx, parent.ID, api.ForkRequest{Count: 5})
	time.Sleep(40 * time.Millisecond)
	d.kill()
	c, list := restartCold(ctx, t, d)
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
