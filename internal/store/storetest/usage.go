package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// usageBase is a start of metering intervals on a whole hour.
var usageBase = time.Unix(1700002800, 0).UTC()

func usageRow(sb, tn, node string, sec int, cpu int64) store.UsageRow {
	return store.UsageRow{
		Sandbox: sb, Tenant: tn, Template: "py", Node: node, Labels: map[string]string{"team": tn},
		Start: usageBase.Add(time.Duration(sec) * time.Second), Seconds: 10,
		CPUMicros: cpu, MemoryByteSec: 10 << 30, DiskByteSec: 1 << 20, SnapshotByteSec: 3, ArchiveByteSec: 4,
		NetInBytes: 5, NetOutBytes: 6, RunningMs: 10000, PausedMs: 1, SuspendedMs: 2, StoppedMs: 3, ArchivedMs: 4,
		CPUCounter: cpu * 1000, NetInCounter: 50, NetOutCounter: 60, Instance: 77,
	}
}

// testUsage: rows are written once per sandbox and interval, summed by
// bucket and tenant, the newest found per node, and kept across a reopen.
func testUsage(t *testing.T, s suite) {
	ctx := context.Background()
	dir := t.TempDir()
	st, closeSt := s.at(t, dir)
	var rows []store.UsageRow
	for sec := 0; sec < 120; sec += 10 {
		rows = append(rows, usageRow("a", "team-a", "n1", sec, 1_000_000+int64(sec)), usageRow("b", "", "n1", sec, 2))
	}
	rows = append(rows, usageRow("c", "team-a", "n2", 0, 7))
	if err := st.PutUsage(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// A meter that writes an interval again (it restarted) counts nothing
	// twice, and a batch of new and written rows adds the new ones.
	again := usageRow("a", "team-a", "n1", 0, 999_999_999)
	again.Labels = map[string]string{"team": "old"}
	late := usageRow("c", "team-a", "n2", 10, 8)
	if err := st.PutUsage(ctx, []store.UsageRow{again, late}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutUsage(ctx, nil); err != nil {
		t.Errorf("no rows: %v", err)
	}
	if err := closeSt(); err != nil {
		t.Fatal(err)
	}
	st, _ = s.at(t, dir)

	q := store.UsageQuery{From: usageBase, To: usageBase.Add(2 * time.Minute), Step: time.Minute}
	got, err := st.QueryUsage(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(sb, tn string, bucket, n int, cpu int64) store.UsageRow {
		r := usageRow(sb, tn, "", bucket, 0)
		r.Node, r.Tenant = "", tenant.Default
		if tn != "" {
			r.Tenant = tn
		}
		r.CPUCounter, r.NetInCounter, r.NetOutCounter, r.Instance = 0, 0, 0, 0
		one := r
		r.Seconds, r.MemoryByteSec, r.DiskByteSec, r.SnapshotByteSec, r.ArchiveByteSec = 0, 0, 0, 0, 0
		r.NetInBytes, r.NetOutBytes, r.RunningMs, r.PausedMs, r.SuspendedMs, r.StoppedMs, r.ArchivedMs = 0, 0, 0, 0, 0, 0, 0
		for range n {
			r.Add(one)
		}
		r.CPUMicros = cpu
		return r
	}
	want := []store.UsageRow{
		sum("a", "team-a", 0, 6, 6_000_000+0+10+20+30+40+50),
		sum("b", "", 0, 6, 12),
		sum("c", "team-a", 0, 2, 15),
		sum("a", "team-a", 60, 6, 6_000_000+60+70+80+90+100+110),
		sum("b", "", 60, 6, 12),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("by minute (-want +got):\n%s", diff)
	}

	// A tenant sees its own; [From, To) is half open.
	q.Tenant, q.To, q.Step = "team-a", usageBase.Add(70*time.Second), time.Hour
	got, err = st.QueryUsage(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	want = []store.UsageRow{sum("a", "team-a", 0, 7, 7_000_000+210), sum("c", "team-a", 0, 2, 15)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("team-a by hour (-want +got):\n%s", diff)
	}
	q.Tenant = tenant.Default
	if got, err := st.QueryUsage(ctx, q); err != nil || len(got) != 1 || got[0].Sandbox != "b" {
		t.Errorf("default tenant: %+v, %v", got, err)
	}
	q.Tenant = "nobody\x00"
	if got, err := st.QueryUsage(ctx, q); err != nil || len(got) != 0 {
		t.Errorf("unknown tenant: %+v, %v", got, err)
	}
	for _, step := range []time.Duration{0, -time.Second, 1500 * time.Millisecond} {
		q.Step = step
		if _, err := st.QueryUsage(ctx, q); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("step %s: %v, want ErrInvalid", step, err)
		}
	}

	// A restarted meter finds each of its sandboxes' newest row.
	last, err := st.LastUsage(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	wantLast := map[string]store.UsageRow{"a": usageRow("a", "team-a", "n1", 110, 1_000_110), "b": usageRow("b", tenant.Default, "n1", 110, 2)}
	wantLast["b"].Labels["team"] = ""
	if diff := cmp.Diff(wantLast, last); diff != "" {
		t.Errorf("last of n1 (-want +got):\n%s", diff)
	}
	if last, err := st.LastUsage(ctx, "n2"); err != nil || len(last) != 1 || last["c"].Start != usageBase.Add(10*time.Second) {
		t.Errorf("last of n2: %+v, %v", last, err)
	}
	if last, err := st.LastUsage(ctx, "n3"); err != nil || len(last) != 0 {
		t.Errorf("last of n3: %+v, %v", last, err)
	}
}
