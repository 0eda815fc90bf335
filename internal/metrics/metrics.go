// Package metrics samples what running sandboxes use (CPU, memory, disk)
// at a fixed interval, as E2B's API reports it, and keeps each sandbox's
// recent samples in a bounded ring in memory. A sandbox's ring goes when
// the sandbox does; nothing is kept across a restart of the node.
package metrics

import (
	"context"
	"log/slog"
	"math"
	goruntime "runtime"
	"sync"
	"time"
)

// Sample is one measurement of a sandbox.
type Sample struct {
	Time time.Time
	// CPUCount is the sandbox's cores (its CPU limit, rounded up) and
	// CPUUsedPct the share of its CPU limit it used since the sample before:
	// 100 is all of it.
	CPUCount   int
	CPUUsedPct float64
	// MemUsed is its memory less the page cache, MemCache the page cache;
	// MemTotal is its memory limit.
	MemUsed, MemCache, MemTotal int64
	// DiskUsed is what its writable layer holds, DiskTotal the layer's
	// quota.
	DiskUsed, DiskTotal int64
	// NetRx and NetTx are the bytes it received and sent since its
	// network was attached (counters: they start over when it starts
	// again); 0 without a network.
	NetRx, NetTx int64
}

// Target is a sandbox as the sampler needs to know it.
type Target struct {
	ID string
	// Runtime is the backend that runs it, for the Source's Read.
	Runtime string
	// Slot is its network's slot, for the Source's Read.
	Slot int
	// Running sandboxes are sampled; the others keep their samples.
	Running bool
	// Limits: cores (0: the host's), memory and disk in bytes.
	CPU                    float64
	MemoryBytes, DiskBytes int64
}

// Reading is what Source.Read measures of a running sandbox.
type Reading struct {
	// CPU is the CPU time it used since it started; a counter that goes
	// back (the sandbox restarted) starts over.
	CPU                 time.Duration
	MemUsed, MemCache   int64
	DiskUsed, DiskTotal int64 // DiskTotal 0: the Target's DiskBytes
	NetRx, NetTx        int64 // bytes received and sent, counters
}

// Source is what the sampler samples: package control's Service.
type Source interface {
	// Sandboxes lists every sandbox there is; the rings of those it does
	// not list are dropped.
	Sandboxes(ctx context.Context) ([]Target, error)
	// Read measures a running sandbox.
	Read(ctx context.Context, t Target) (Reading, error)
}

// Config configures a Sampler. Source is required.
type Config struct {
	Source Source
	// Interval is how often each running sandbox is sampled; default
	// DefaultInterval, E2B's.
	Interval time.Duration
	// Keep is how many samples a ring holds; default DefaultKeep.
	Keep int
	// HostCPUs counts the cores of a sandbox without a CPU limit; default
	// the host's (runtime.NumCPU).
	HostCPUs int
	Logger   *slog.Logger // default: discard
}

// DefaultInterval is how often E2B samples a sandbox (its metrics are in
// buckets of 5 s), and DefaultKeep an hour's worth of samples at it.
const (
	DefaultInterval = 5 * time.Second
	DefaultKeep     = 720
)

// Sampler samples sandboxes into rings.
type Sampler struct {
	cfg Config
	log *slog.Logger

	// mu guards rings and last.
	mu    sync.Mutex
	rings map[string]*ring
	// last is each sampled sandbox's reading before, for its CPU rate.
	last map[string]mark
}

type mark struct {
	at  time.Time
	cpu time.Duration
}

// New returns a Sampler for cfg; call Run to sample.
func New(cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.HostCPUs <= 0 {
		cfg.HostCPUs = goruntime.NumCPU()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sampler{cfg: cfg, log: log, rings: map[string]*ring{}, last: map[string]mark{}}
}

// Interval is how often sandboxes are sampled.
func (s *Sampler) Interval() time.Duration { return s.cfg.Interval }

// Run samples every Interval until ctx ends. A sandbox's first sample
// comes one interval after it is first seen running: its CPU share needs
// two readings.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	s.SampleOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.SampleOnce(ctx)
		}
	}
}

// SampleOnce reads every running sandbox once, recording a sample for each
// read before, and drops the rings of sandboxes that are gone.
func (s *Sampler) SampleOnce(ctx context.Context) {
	targets, err := s.cfg.Source.Sandboxes(ctx)
	if err != nil {
		s.log.Warn("listing sandboxes to sample", "err", err)
		return
	}
	exists := make(map[string]bool, len(targets))
	for _, t := range targets {
		exists[t.ID] = true
		if !t.Running {
			s.forgetRate(t.ID)
			continue
		}
		// A read is bounded: one stuck guest must not hold up the rest.
		rctx, cancel := context.WithTimeout(ctx, s.cfg.Interval)
		r, err := s.cfg.Source.Read(rctx, t)
		cancel()
		if err != nil {
			// Stopped or paused meanwhile, most likely: the next
			// listing says.
			s.log.Debug("sampling sandbox", "sandbox", t.ID, "err", err)
			s.forgetRate(t.ID)
			continue
		}
		s.record(t, r, time.Now())
	}
	s.mu.Lock()
	for id := range s.rings {
		if !exists[id] {
			delete(s.rings, id)
		}
	}
	for id := range s.last {
		if !exists[id] {
			delete(s.last, id)
		}
	}
	s.mu.Unlock()
}

// forgetRate drops the reading a CPU rate would start from: a sandbox that
// stops or pauses starts its rate over when it runs again.
func (s *Sampler) forgetRate(id string) {
	s.mu.Lock()
	delete(s.last, id)
	s.mu.Unlock()
}

// record makes a sample of reading r of t at now, if there was a reading
// before to rate its CPU by.
func (s *Sampler) record(t Target, r Reading, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.last[t.ID]
	s.last[t.ID] = mark{at: now, cpu: r.CPU}
	if !ok || r.CPU < prev.cpu || !now.After(prev.at) {
		return
	}
	cores := t.CPU
	if cores <= 0 {
		cores = float64(s.cfg.HostCPUs)
	}
	pct := float64(r.CPU-prev.cpu) / float64(now.Sub(prev.at)) / cores * 100
	diskTotal := r.DiskTotal
	if diskTotal == 0 {
		diskTotal = t.DiskBytes
	}
	smp := Sample{
		Time:     now,
		CPUCount: int(math.Ceil(cores)),
		// Two decimals, as envd rounds; never above the limit, which a
		// cgroup's quota period can overshoot by a little.
		CPUUsedPct: math.Round(min(pct, 100)*100) / 100,
		MemUsed:    r.MemUsed, MemCache: r.MemCache, MemTotal: t.MemoryBytes,
		DiskUsed: r.DiskUsed, DiskTotal: diskTotal,
		NetRx: r.NetRx, NetTx: r.NetTx,
	}
	rg := s.rings[t.ID]
	if rg == nil {
		rg = &ring{buf: make([]Sample, 0, min(s.cfg.Keep, 64)), max: s.cfg.Keep}
		s.rings[t.ID] = rg
	}
	rg.add(smp)
}

// Range returns sandbox id's samples from start to end, both inclusive and
// to the second (as E2B's API has them), oldest first; a zero start or end
// leaves that side open.
func (s *Sampler) Range(id string, start, end time.Time) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	rg := s.rings[id]
	if rg == nil {
		return nil
	}
	var out []Sample
	rg.each(func(smp Sample) {
		sec := smp.Time.Unix()
		if (start.IsZero() || sec >= start.Unix()) && (end.IsZero() || sec <= end.Unix()) {
			out = append(out, smp)
		}
	})
	return out
}

// Latest returns sandbox id's newest sample.
func (s *Sampler) Latest(id string) (Sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rg := s.rings[id]
	if rg == nil || len(rg.buf) == 0 {
		return Sample{}, false
	}
	return rg.newest(), true
}

// Forget drops sandbox id's samples at once (it was deleted).
func (s *Sampler) Forget(id string) {
	s.mu.Lock()
	delete(s.rings, id)
	delete(s.last, id)
	s.mu.Unlock()
}

// ring holds the newest max samples: buf grows to max, then next is the
// oldest, which the next sample overwrites.
type ring struct {
	buf  []Sample
	next int
	max  int
}

func (r *ring) add(smp Sample) {
	if len(r.buf) < r.max {
		r.buf = append(r.buf, smp)
		return
	}
	r.buf[r.next] = smp
	r.next = (r.next + 1) % r.max
}

func (r *ring) each(f func(Sample)) {
	for i := range r.buf {
		f(r.buf[(r.next+i)%len(r.buf)])
	}
}

func (r *ring) newest() Sample {
	return r.buf[(r.next+len(r.buf)-1)%len(r.buf)]
}
