package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// sandboxWith creates a sandbox that has written mb MB of random data to
// its disk.
func sandboxWith(ctx context.Context, c *atoll.Client, mb int) api.Sandbox {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Shell: fmt.Sprintf("dd if=/dev/urandom of=/root/data bs=1M count=%d 2>/dev/null && sync", mb)}, io.Discard, io.Discard)
	check(err)
	return sb
}

// state measures snapshots, forks and pause/resume of a running sandbox that
// has written 10 MB and then 1 GiB: their cost should not grow with it.
func state(r *report, srv *server, n int) {
	ctx := context.Background()
	c := srv.client()
	for _, mb := range []int{10, 1024} {
		sb := sandboxWith(ctx, c, mb)
		size := fmt.Sprintf("%d MB written", mb)

		var snaps []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
			check(err)
			snaps = append(snaps, time.Since(t0))
			check(c.DeleteSnapshot(ctx, sn.ID))
		}
		r.add("snapshot of a running sandbox, "+size, "sequential", snaps)

		pause, resume := pairs(n, func() { ok(c.PauseSandbox(ctx, sb.ID)) }, func() { ok(c.ResumeSandbox(ctx, sb.ID)) })
		r.add("pause (API), "+size, "sequential", pause)
		r.add("resume (API), "+size, "sequential", resume)

		// Archive to the local blob store and back.
		_, err := c.StopSandbox(ctx, sb.ID)
		check(err)
		t0 := time.Now()
		_, err = c.ArchiveSandbox(ctx, sb.ID)
		check(err)
		arch := time.Since(t0)
		t0 = time.Now()
		_, err = c.StartSandbox(ctx, sb.ID)
		check(err)
		restore := time.Since(t0)
		r.add("archive to the local blob store, "+size, "once", []time.Duration{arch})
		r.add("start from the archive (restore + start), "+size, "once", []time.Duration{restore})
		r.notes = append(r.notes, fmt.Sprintf("Archive throughput, %s: %.0f MB/s out, %.0f MB/s back (including the sandbox's start).",
			size, float64(mb)/arch.Seconds(), float64(mb)/restore.Seconds()))
		check(c.DeleteSandbox(ctx, sb.ID))
	}
}

// forks measures forks of a running sandbox that has written 10 MB and then
// 1 GiB, into 1 and into 10 children, each fork answered once every child is
// ready. Between forks the server gets time to replace what a fork used of
// its prestarted processes.
func forks(r *report, srv *server, label string, n int) {
	ctx := context.Background()
	c := srv.client()
	for _, mb := range []int{10, 1024} {
		sb := sandboxWith(ctx, c, mb)
		for _, count := range []int{1, 10} {
			var ds []time.Duration
			reps := n
			if count > 1 {
				reps = max(n/4, 3)
			}
			for i := 0; i < reps; i++ {
				time.Sleep(refillPause(count))
				t0 := time.Now()
				kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: count})
				check(err)
				ds = append(ds, time.Since(t0))
				for _, k := range kids {
					check(c.DeleteSandbox(ctx, k.ID))
				}
			}
			r.add(fmt.Sprintf("fork of a running sandbox into %d (children ready), %d MB written, %s", count, mb, label), "sequential", ds)
		}
		check(c.DeleteSandbox(ctx, sb.ID))
	}
}

// refillPause is how long a server needs to prestart count processes again.
func refillPause(count int) time.Duration {
	return 200*time.Millisecond + time.Duration(count)*60*time.Millisecond
}

// prestarted measures creates and forks on a server that keeps 10 sandbox
// processes prestarted (--prestart 10) and no warm pool.
func prestarted(r *report, work string, n int) {
	srv := startServer(work, "prestarted", 0, 10)
	defer srv.stop()
	c := srv.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{}) // builds the host template
	check(err)
	check(c.DeleteSandbox(ctx, sb.ID))
	var ds []time.Duration
	for i := 0; i < n; i++ {
		time.Sleep(refillPause(1))
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		ds = append(ds, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
	}
	r.add("atoll create → ready (API), prestarted process", "sequential", ds)
	forks(r, srv, "10 prestarted processes", min(n, 20))
}
