package metrics

import (
	"context"
	"errors"
	"testing"
	"time"
)

// script is a Source whose sandboxes and readings a test sets: the
// sandboxes' figures are not what this package's tests check (the runtime
// conformance suite and the end-to-end tests read real cgroups), the
// sampler's arithmetic and bookkeeping are.
type script struct {
	targets  []Target
	readings map[string]Reading
}

func (s *script) Sandboxes(ctx context.Context) ([]Target, error) { return s.targets, nil }

func (s *script) Read(ctx context.Context, t Target) (Reading, error) {
	r, ok := s.readings[t.ID]
	if !ok {
		return Reading{}, errors.New("not running")
	}
	return r, nil
}

func TestSamplerCPUShare(t *testing.T) {
	src := &script{
		targets:  []Target{{ID: "a", Running: true, CPU: 0.5, MemoryBytes: 1 << 30, DiskBytes: 10 << 30}},
		readings: map[string]Reading{"a": {CPU: time.Second, MemUsed: 100, MemCache: 7, DiskUsed: 42}},
	}
	s := New(Config{Source: src})
	t0 := time.Unix(1000, 0)
	s.record(src.targets[0], src.readings["a"], t0)
	if got := s.Range("a", time.Time{}, time.Time{}); len(got) != 0 {
		t.Fatalf("a first reading made samples: %+v", got)
	}
	// 1 s of CPU in 4 s on a half-core limit: half of the limit.
	s.record(src.targets[0], Reading{CPU: 2 * time.Second, MemUsed: 200, MemCache: 7, DiskUsed: 42}, t0.Add(4*time.Second))
	got, ok := s.Latest("a")
	if !ok {
		t.Fatal("no sample after two readings")
	}
	want := Sample{Time: t0.Add(4 * time.Second), CPUCount: 1, CPUUsedPct: 50, MemUsed: 200, MemCache: 7, MemTotal: 1 << 30, DiskUsed: 42, DiskTotal: 10 << 30}
	if got != want {
		t.Errorf("sample:\n got %+v\nwant %+v", got, want)
	}
	// A counter that goes back (a restart) starts over: no sample.
	s.record(src.targets[0], Reading{CPU: time.Millisecond}, t0.Add(8*time.Second))
	if n := len(s.Range("a", time.Time{}, time.Time{})); n != 1 {
		t.Errorf("%d samples after a restart's reading, want 1", n)
	}
	// A quota's overshoot does not make more than 100 %.
	s.record(src.targets[0], Reading{CPU: time.Millisecond + 3*time.Second}, t0.Add(12*time.Second))
	if got, _ := s.Latest("a"); got.CPUUsedPct != 100 {
		t.Errorf("CPU share over the limit: %v, want 100", got.CPUUsedPct)
	}
}

func TestSamplerRangeAndRing(t *testing.T) {
	tg := Target{ID: "a", Running: true, CPU: 1}
	s := New(Config{Source: &script{}, Keep: 5})
	t0 := time.Unix(1000, 0)
	for i := range 9 { // 8 samples, the ring keeps the last 5: 1004..1008
		s.record(tg, Reading{CPU: time.Duration(i) * time.Second}, t0.Add(time.Duration(i)*time.Second+300*time.Millisecond))
	}
	secs := func(smps []Sample) (out []int64) {
		for _, x := range smps {
			out = append(out, x.Time.Unix())
		}
		return out
	}
	for _, c := range []struct {
		name       string
		start, end time.Time
		want       []int64
	}{
		{"all", time.Time{}, time.Time{}, []int64{1004, 1005, 1006, 1007, 1008}},
		{"inclusive to the second", time.Unix(1005, 0), time.Unix(1007, 0), []int64{1005, 1006, 1007}},
		{"open start", time.Time{}, time.Unix(1004, 0), []int64{1004}},
		{"open end", time.Unix(1008, 0), time.Time{}, []int64{1008}},
		{"before", time.Unix(0, 0), time.Unix(999, 0), nil},
		{"start after end", time.Unix(1007, 0), time.Unix(1005, 0), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := secs(s.Range("a", c.start, c.end))
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestSamplerDropsGoneSandboxes(t *testing.T) {
	src := &script{
		targets: []Target{{ID: "a", Running: true, CPU: 1}, {ID: "b", Running: true, CPU: 1}},
		readings: map[string]Reading{
			"a": {CPU: time.Second}, "b": {CPU: time.Second},
		},
	}
	s := New(Config{Source: src, Interval: time.Millisecond})
	ctx := context.Background()
	s.SampleOnce(ctx)
	time.Sleep(2 * time.Millisecond) // a later reading than the first
	s.SampleOnce(ctx)
	for _, id := range []string{"a", "b"} {
		if _, ok := s.Latest(id); !ok {
			t.Fatalf("no sample of %s", id)
		}
	}
	// b stops: its samples stay. a is deleted: its go.
	src.targets = []Target{{ID: "b", CPU: 1}}
	s.SampleOnce(ctx)
	if _, ok := s.Latest("a"); ok {
		t.Error("a deleted sandbox's samples are kept")
	}
	if _, ok := s.Latest("b"); !ok {
		t.Error("a stopped sandbox's samples are dropped")
	}
	s.Forget("b")
	if _, ok := s.Latest("b"); ok {
		t.Error("Forget kept the samples")
	}
}
