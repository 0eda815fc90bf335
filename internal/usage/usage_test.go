package usage_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/usage"
)

// script is a Source whose targets and readings the test sets between
// ticks: the meter's arithmetic is under test, the store under it real.
type script struct {
	mu       sync.Mutex
	targets  []usage.Target
	readings map[string]usage.Reading
}

func (s *script) Targets(context.Context) ([]usage.Target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]usage.Target(nil), s.targets...), nil
}

func (s *script) Read(_ context.Context, t usage.Target) (usage.Reading, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readings[t.ID], nil
}

var t0 = time.Unix(1700002800, 0).UTC() // on a whole hour

// TestMeter meters a sandbox through running, paused and stopped, a
// restart of the meter (a new Meter on the same database) in between, and
// a restart of the sandbox: CPU and network are the counters' growth,
// counted once; memory and disk are sizes times seconds; the time in each
// state adds up; the report sums and groups it.
func TestMeter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { st.Close() }()
	src := &script{readings: map[string]usage.Reading{}}
	m := usage.New(usage.Config{Source: src, Store: st})
	tick := func(m *usage.Meter, n int) {
		t.Helper()
		if err := m.Tick(ctx, t0.Add(time.Duration(n)*10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	set := func(state string, instance int64, rd usage.Reading) {
		src.mu.Lock()
		defer src.mu.Unlock()
		src.targets = []usage.Target{{ID: "a", Tenant: "team-a", Template: "py", Labels: map[string]string{"team": "x"},
			State: state, Since: t0.Add(5 * time.Second), Instance: instance}}
		src.readings["a"] = rd
	}
	// Created at 5 s, running: the first interval bills 5 s of it, and
	// every CPU second since the run began.
	set(api.StateRunning, 1, usage.Reading{Counted: true, CPU: 2 * time.Second, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, NetIn: 1000, NetOut: 500})
	tick(m, 1)
	set(api.StateRunning, 1, usage.Reading{Counted: true, CPU: 12 * time.Second, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, NetIn: 3000, NetOut: 600})
	tick(m, 2)
	// The meter dies and a new one starts from the store: the CPU used
	// meanwhile is counted once, in the next interval.
	m = usage.New(usage.Config{Source: src, Store: st})
	set(api.StateRunning, 1, usage.Reading{Counted: true, CPU: 22 * time.Second, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, NetIn: 3000, NetOut: 600})
	tick(m, 3)
	// Metering an interval again changes nothing.
	tick(m, 3)
	// Paused: the counters stand still, memory is still held.
	set(api.StatePaused, 1, usage.Reading{Counted: true, CPU: 22 * time.Second, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, NetIn: 3000, NetOut: 600})
	tick(m, 4)
	// Stopped: nothing to read but the disk.
	set(api.StateStopped, 0, usage.Reading{DiskBytes: 1 << 30})
	tick(m, 5)
	// Started again: a new run whose counters start from zero.
	set(api.StateRunning, 2, usage.Reading{Counted: true, CPU: 3 * time.Second, MemoryBytes: 1 << 29, DiskBytes: 1 << 30, NetIn: 10, NetOut: 20})
	tick(m, 6)

	rep, err := usage.Reporter{Store: st}.Report(ctx, api.UsageQuery{From: t0, To: t0.Add(time.Hour), Step: api.UsageByHour, GroupBy: api.UsageBySandbox})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Usage) != 1 {
		t.Fatalf("report: %+v", rep)
	}
	e := rep.Usage[0]
	t.Logf("%+v", e)
	want := api.UsageEntry{
		Start: t0, Group: "a",
		CPUSeconds: 22 + 3,
		// 1 GiB for 5+10+10+10 s, 0.5 GiB for 10 s.
		MemoryGiBSeconds: 35 + 5,
		DiskGiBHours:     55.0 / 3600,
		NetInBytes:       3000 + 10, NetOutBytes: 600 + 20,
		States: api.UsageStates{Running: 35, Paused: 10, Stopped: 10},
	}
	if e != want {
		t.Errorf("usage:\n got %+v\nwant %+v", e, want)
	}
	for _, g := range []struct{ by, group string }{{api.UsageByTenant, "team-a"}, {api.UsageByTemplate, "py"}, {"label:team", "x"}, {"label:other", ""}} {
		rep, err := usage.Reporter{Store: st}.Report(ctx, api.UsageQuery{From: t0, To: t0.Add(time.Minute), Step: api.UsageByMinute, GroupBy: g.by})
		if err != nil || len(rep.Usage) != 1 || rep.Usage[0].Group != g.group || rep.Usage[0].CPUSeconds != 25 {
			t.Errorf("by %s: %+v, %v", g.by, rep, err)
		}
	}
	for _, q := range []api.UsageQuery{
		{From: t0, To: t0.Add(time.Hour), Step: "2h", GroupBy: "sandbox"},
		{From: t0, To: t0.Add(time.Hour), Step: "1h", GroupBy: "node"},
		{From: t0, To: t0.Add(time.Hour), Step: "1h", GroupBy: "label:"},
		{From: t0, To: t0, Step: "1h", GroupBy: "sandbox"},
		{From: t0, To: t0.Add(-time.Hour), Step: "1h", GroupBy: "sandbox"},
		{From: t0, To: t0.Add(30 * 24 * time.Hour), Step: "1m", GroupBy: "sandbox"},
	} {
		if _, err := (usage.Reporter{Store: st}).Report(ctx, q); err == nil {
			t.Errorf("%+v: no error", q)
		}
	}
}

// TestMeterFinal bills what runs used between their last sample and their
// end (Meter.Final, read just before a stop or a delete): once, in the
// sandbox's next row or, deleted, in a row of its own; a final read
// before a later sample of the same run adds nothing.
func TestMeterFinal(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src := &script{readings: map[string]usage.Reading{}}
	m := usage.New(usage.Config{Source: src, Store: st})
	n := 0
	tick := func() {
		t.Helper()
		n++
		if err := m.Tick(ctx, t0.Add(time.Duration(n)*10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	target := func(id, state string, instance int64) usage.Target {
		return usage.Target{ID: id, Tenant: "team-a", Template: "py", State: state, Since: t0, Instance: instance}
	}
	set := func(targets ...usage.Target) func(map[string]usage.Reading) {
		return func(rds map[string]usage.Reading) {
			src.mu.Lock()
			defer src.mu.Unlock()
			src.targets, src.readings = targets, rds
		}
	}
	counted := func(cpu time.Duration, out int64) usage.Reading {
		return usage.Reading{Counted: true, CPU: cpu, NetOut: out}
	}

	// a runs, is sampled at 2 s, burns to 7 s and stops: the 5 s after
	// the sample are billed in its next row, with its bytes.
	set(target("a", api.StateRunning, 1), target("b", api.StateRunning, 1))(map[string]usage.Reading{"a": counted(2*time.Second, 100), "b": counted(time.Second, 0)})
	tick()
	m.Final(target("a", api.StateStopping, 1), counted(7*time.Second, 400))
	set(target("a", api.StateStopped, 0), target("b", api.StateRunning, 1))(map[string]usage.Reading{"b": counted(time.Second, 0)})
	tick()
	// Started again (run 2), sampled at 1 s.
	set(target("a", api.StateRunning, 2), target("b", api.StateRunning, 1))(map[string]usage.Reading{"a": counted(time.Second, 0), "b": counted(time.Second, 0)})
	tick()
	// A final of run 2 at 3 s, but the run goes on (its stop failed):
	// the samples at 4 s and 4.5 s are its growth, the final no more.
	m.Final(target("a", api.StateStopping, 2), counted(3*time.Second, 0))
	set(target("a", api.StateRunning, 2), target("b", api.StateRunning, 1))(map[string]usage.Reading{"a": counted(4*time.Second, 0), "b": counted(time.Second, 0)})
	tick()
	set(target("a", api.StateRunning, 2), target("b", api.StateRunning, 1))(map[string]usage.Reading{"a": counted(4500*time.Millisecond, 0), "b": counted(time.Second, 0)})
	tick()
	// A final read before that last sample (4.2 s < 4.5 s): nothing.
	m.Final(target("a", api.StateStopping, 2), counted(4200*time.Millisecond, 0))
	// b is being deleted: no target from here on; an interval passes
	// before its final (4 s) comes, billed in a row of its own.
	set(target("a", api.StateStopped, 0))(map[string]usage.Reading{})
	tick()
	m.Final(target("b", api.StateDeleting, 1), counted(4*time.Second, 50))
	tick()
	tick()

	rep, err := usage.Reporter{Store: st}.Report(ctx, api.UsageQuery{From: t0, To: t0.Add(time.Hour), Step: api.UsageByHour, GroupBy: api.UsageBySandbox})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.UsageEntry{}
	for _, e := range rep.Usage {
		got[e.Group] = e
	}
	if e := got["a"]; e.CPUSeconds != 2+5+1+3+0.5 || e.NetOutBytes != 400 {
		t.Errorf("a: %g CPU-s and %d bytes out, want 11.5 and 400: %+v", e.CPUSeconds, e.NetOutBytes, e)
	}
	if e := got["b"]; e.CPUSeconds != 4 || e.NetOutBytes != 50 {
		t.Errorf("b: %g CPU-s and %d bytes out, want 4 and 50: %+v", e.CPUSeconds, e.NetOutBytes, e)
	}
}
