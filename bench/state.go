package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// state measures snapshots, forks and pause/resume of a running sandbox that
// has written 10 MB and then 1 GiB: their cost should not grow with it.
func state(r *report, srv *server, n int) {
	ctx := context.Background()
	c := atoll.New(srv.url, srv.key)
	for _, mb := range []int{10, 1024} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Shell: fmt.Sprintf("dd if=/dev/urandom of=/root/data bs=1M count=%d 2>/dev/null && sync", mb)}, io.Discard, io.Discard)
		check(err)
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

		for _, count := range []int{1, 10} {
			var forks []time.Duration
			reps := n
			if count > 1 {
				reps = max(n/4, 3)
			}
			for i := 0; i < reps; i++ {
				t0 := time.Now()
				kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: count})
				check(err)
				forks = append(forks, time.Since(t0))
				for _, k := range kids {
					check(c.DeleteSandbox(ctx, k.ID))
				}
			}
			r.add(fmt.Sprintf("fork of a running sandbox into %d (children ready), %s", count, size), "sequential", forks)
		}

		var pause, resume []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			_, err := c.PauseSandbox(ctx, sb.ID)
			check(err)
			t1 := time.Now()
			_, err = c.ResumeSandbox(ctx, sb.ID)
			check(err)
			pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
		}
		r.add("pause (API), "+size, "sequential", pause)
		r.add("resume (API), "+size, "sequential", resume)

		// Archive to the local blob store and back.
		_, err = c.StopSandbox(ctx, sb.ID)
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
