package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// recent measures snapshots and forks of a sandbox that wrote 1 GiB within
// the previous second, beside the same operations a moment later (settled),
// each with the time the server kept the parent frozen; and the throughput
// of the 1 GiB write itself, beside the same write on the host's data
// directory. The server prestarts 10 processes, as the prestarted part's.
func recent(r *report, work string, n int) {
	srv := startServer(work, "recent", 0, 10)
	defer srv.stop()
	c := srv.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	// Zeros: /dev/urandom would make the writer slower than the disk.
	write := "dd if=/dev/zero of=/root/data bs=1M count=1024 2>/dev/null"

	type op struct {
		name string
		// do takes the snapshot or makes the children, and returns what
		// removes them, which is not timed.
		do func() (remove func())
	}
	fork := func(count int) func() func() {
		return func() func() {
			kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: count})
			check(err)
			return func() {
				for _, k := range kids {
					check(c.DeleteSandbox(ctx, k.ID))
				}
			}
		}
	}
	ops := []op{
		{"snapshot of a running sandbox", func() func() {
			sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
			check(err)
			return func() { check(c.DeleteSnapshot(ctx, sn.ID)) }
		}},
		{"fork into 1, child ready, prestarted", fork(1)},
		{"fork into 10, all ready, prestarted", fork(10)},
	}
	for _, o := range ops {
		var fresh, settled, frozenFresh, frozenSettled []time.Duration
		for i := 0; i < n; i++ {
			time.Sleep(refillPause(10))
			_, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: write}, io.Discard, io.Discard)
			check(err)
			mark := srv.logSize()
			t0 := time.Now()
			remove := o.do()
			fresh = append(fresh, time.Since(t0))
			frozenFresh = append(frozenFresh, srv.frozen(mark, sb.ID))
			remove()

			time.Sleep(refillPause(10))
			mark = srv.logSize()
			t0 = time.Now()
			remove = o.do()
			settled = append(settled, time.Since(t0))
			frozenSettled = append(frozenSettled, srv.frozen(mark, sb.ID))
			remove()
		}
		r.add(o.name+", 1 GiB written within the previous second", "sequential", fresh)
		r.add(o.name+", settled", "sequential", settled)
		r.add("… parent frozen in it, 1 GiB written within the previous second", "sequential", frozenFresh)
		r.add("… parent frozen in it, settled", "sequential", frozenSettled)
	}

	// The writer's side: sustained 1 GiB writes, without and with an fsync
	// at the end, inside the sandbox and on the host's data directory.
	host := filepath.Join(srv.data, "dd-host")
	defer os.Remove(host)
	runs := max(n/4, 3)
	for _, fsync := range []string{"", " conv=fsync"} {
		var in, out []time.Duration
		for i := 0; i < runs; i++ {
			_, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "rm -f /root/data; sync"}, io.Discard, io.Discard)
			check(err)
			t0 := time.Now()
			_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Shell: write + fsync}, io.Discard, io.Discard)
			check(err)
			in = append(in, time.Since(t0))

			os.Remove(host)
			must("sync")
			t0 = time.Now()
			must("sh", "-c", "dd if=/dev/zero of="+host+" bs=1M count=1024"+fsync+" 2>/dev/null")
			out = append(out, time.Since(t0))
		}
		what := "no fsync"
		if fsync != "" {
			what = "conv=fsync"
		}
		r.add("dd 1 GiB in a sandbox (exec round trip included), "+what, "sequential", in)
		r.add("dd 1 GiB on the host's data directory, "+what, "sequential", out)
		r.note(fmt.Sprintf("dd 1 GiB, %s, median throughput: %.0f MB/s in a sandbox, %.0f MB/s on the host's data directory.",
			what, mbps(in), mbps(out)))
	}
	check(c.DeleteSandbox(ctx, sb.ID))
}

// mbps is the throughput of 1 GiB written in the median of ds.
func mbps(ds []time.Duration) float64 {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(1<<30) / 1e6 / s[len(s)/2].Seconds()
}

// frozenLine is the server's log line for one freeze of a sandbox.
var frozenLine = regexp.MustCompile(`msg="sandbox frozen" sandbox=(\S+) op=\S+ ms=([0-9.]+)`)

func (s *server) logSize() int64 {
	st, err := os.Stat(s.log)
	check(err)
	return st.Size()
}

// frozen is the total time the server logged sandbox id frozen since its log
// was mark bytes long.
func (s *server) frozen(mark int64, id string) time.Duration {
	b, err := os.ReadFile(s.log)
	check(err)
	var total time.Duration
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b[mark:]))
	for sc.Scan() {
		m := frozenLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] != id {
			continue
		}
		ms, err := strconv.ParseFloat(m[2], 64)
		check(err)
		total += time.Duration(ms * float64(time.Millisecond))
		found = true
	}
	if !found {
		fatal("the server logged no freeze of %s", id)
	}
	return total
}

// hostDirtyLimit is the bench's -layer-dirty-limit, passed to every server.
var hostDirtyLimit int64

func dirtyArgs() []string {
	if hostDirtyLimit == 0 {
		return nil
	}
	return []string{"--layer-dirty-limit", strconv.FormatInt(hostDirtyLimit, 10)}
}
