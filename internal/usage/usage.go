// Package usage meters what sandboxes use, for billing: every interval (10 s
// by default) a node's Meter samples each of its sandboxes and writes one
// row per sandbox and interval through the store (store.Usage). CPU time and
// network bytes are differences of cumulative counters (the cgroup's, the
// firewall's), so nothing between two samples escapes; memory and storage
// are sampled sizes times the time they were held; the time in each state
// is the interval's time in the state the sample found.
//
// Rows are written once per (sandbox, interval) and carry the counters
// they were taken against, so a meter that restarts (a kill -9 of the
// server among them) goes on from its last row: what the sandbox used
// while the meter was down is counted in the first interval after, once,
// and at most the figures of the interval under way when it died
// (memory and storage time, state time) are lost.
//
// A run's counters end with its processes: what a sandbox used between
// the last sample and its stop or delete would be lost, so the node reads
// them just before (Meter.Final) and the next interval bills them.
package usage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
)

// DefaultInterval is how often a Meter samples, the granularity the
// metering promises (at most 10 s).
const DefaultInterval = 10 * time.Second

// Target is a sandbox (or what is left of a deleted one: its snapshots) as
// the meter needs to know it.
type Target struct {
	ID, Tenant, Template string
	Labels               map[string]string
	// State is its state (api.State*); "" for a deleted sandbox whose
	// snapshots are still stored.
	State string
	// Since is when it was created: an interval is billed from then.
	Since time.Time
	// Instance names its current run (its init's start time), 0 when
	// it has no processes.
	Instance int64
}

// Reading is what Source.Read measures of a target. Counters are
// cumulative since the target's run began.
type Reading struct {
	// Counted is true when the counters below were read: the sandbox has
	// processes (running or paused).
	Counted bool
	CPU     time.Duration
	NetIn   int64
	NetOut  int64
	// MemoryBytes is the working set (memory less page cache), 0 when it
	// has no processes.
	MemoryBytes int64
	// Bytes stored: its writable layer, its snapshots and its archive.
	DiskBytes, SnapshotBytes, ArchiveBytes int64
}

// Source is what the meter meters: package control's Service.
type Source interface {
	// Targets lists what the node meters.
	Targets(ctx context.Context) ([]Target, error)
	// Read measures one target; an error skips it this interval (it is
	// counted in the next, from its counters).
	Read(ctx context.Context, t Target) (Reading, error)
}

// Config configures a Meter. Source and Store are required.
type Config struct {
	Source Source
	Store  store.Usage
	// Node is the node's name ("" on a single machine).
	Node string
	// Interval is how often it samples; default DefaultInterval.
	Interval time.Duration
	// Now is the clock; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Meter samples a node's sandboxes and writes their usage.
type Meter struct {
	cfg Config

	mu sync.Mutex
	// last is each target's newest row (its counters and its interval's
	// end), nil until loaded from the store.
	last map[string]store.UsageRow
	// missed counts the intervals in a row that did not see a target of
	// last.
	missed map[string]int

	// finals are the readings Final took of runs about to end, by target
	// ID, for the next Tick; under their own lock, so that a stop never
	// waits for a Tick's store writes.
	fmu    sync.Mutex
	finals map[string]final
}

// final is a target as its run ended and what the run had used.
type final struct {
	t  Target
	rd Reading
}

// Final notes what t's run (t.Instance) has used, read (rd.Counted) just
// before its processes end: a stop, a shelve, a delete. Its counters end
// with them; the next Tick bills their growth since the last sample, in
// t's row, or in a row of its own if t is no longer a target (deleted).
func (m *Meter) Final(t Target, rd Reading) {
	if !rd.Counted {
		return
	}
	m.fmu.Lock()
	defer m.fmu.Unlock()
	if m.finals == nil {
		m.finals = map[string]final{}
	}
	m.finals[t.ID] = final{t: t, rd: rd}
}

// New returns a Meter; Run starts it.
func New(cfg Config) *Meter {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Meter{cfg: cfg}
}

// Interval is how often the meter samples.
func (m *Meter) Interval() time.Duration { return m.cfg.Interval }

// Run meters at each multiple of the interval until ctx ends. Intervals
// are aligned to the clock (a row's Start is a multiple of the interval
// since the Unix epoch), so that a restart meets the same boundaries.
func (m *Meter) Run(ctx context.Context) {
	for {
		now := m.cfg.Now()
		next := now.Truncate(m.cfg.Interval).Add(m.cfg.Interval)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := m.Tick(ctx, next); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("metering usage", "err", err)
		}
	}
}

// Tick meters the interval that ends at end (a multiple of the interval)
// and writes its rows. Run calls it; tests call it with their own ends.
func (m *Meter) Tick(ctx context.Context, end time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		last, err := m.cfg.Store.LastUsage(ctx, m.cfg.Node)
		if err != nil {
			return err
		}
		m.last = last
		m.missed = map[string]int{}
	}
	// The finals noted so far are this interval's (one noted from now on
	// is the next's); those it does not bill go back for the next.
	m.fmu.Lock()
	finals := m.finals
	m.finals = nil
	m.fmu.Unlock()
	billed := map[string]bool{}
	defer func() {
		for id := range billed {
			delete(finals, id)
		}
		m.keepFinals(finals)
	}()
	targets, err := m.cfg.Source.Targets(ctx)
	if err != nil {
		return err
	}
	start := end.Add(-m.cfg.Interval)
	rows := make([]store.UsageRow, 0, len(targets)+len(finals))
	seen := make(map[string]bool, len(targets))
	for _, t := range targets {
		seen[t.ID] = true
		rd, err := m.cfg.Source.Read(ctx, t)
		if err != nil {
			m.cfg.Logger.Debug("metering sandbox", "sandbox", t.ID, "err", err)
			continue
		}
		var f *final
		if v, ok := finals[t.ID]; ok {
			f = &v
		}
		if row, ok := m.row(t, rd, f, start, end); ok {
			rows = append(rows, row)
		}
	}
	// Runs that ended with their sandbox (deleted, so no longer a
	// target): their last use in a row of their own, without state time
	// or sizes.
	for id, f := range finals {
		if seen[id] {
			continue
		}
		seen[id] = true
		t := f.t
		t.State = ""
		if row, ok := m.row(t, Reading{}, &f, start, end); ok {
			rows = append(rows, row)
		}
	}
	if err := m.cfg.Store.PutUsage(ctx, rows); err != nil {
		return err
	}
	for _, r := range rows {
		m.last[r.Sandbox] = r
		billed[r.Sandbox] = true
	}
	// The gone (deleted, moved to another node) are forgotten once a
	// second interval has not seen them: a sandbox being deleted is no
	// target, and its final reading may come just after an interval
	// that did not see it, to be billed against its last row. Their rows
	// stay.
	for id := range m.last {
		if seen[id] {
			delete(m.missed, id)
			continue
		}
		if m.missed[id]++; m.missed[id] >= 2 {
			delete(m.last, id)
			delete(m.missed, id)
		}
	}
	return nil
}

// keepFinals puts back finals a Tick did not bill, for the next, unless
// newer ones were noted meanwhile.
func (m *Meter) keepFinals(finals map[string]final) {
	if len(finals) == 0 {
		return
	}
	m.fmu.Lock()
	defer m.fmu.Unlock()
	if m.finals == nil {
		m.finals = map[string]final{}
	}
	for id, f := range finals {
		if _, ok := m.finals[id]; !ok {
			m.finals[id] = f
		}
	}
}

// row is target t's row for [start, end), from reading rd, its last row
// and, if its last run ended since, that run's final reading f.
func (m *Meter) row(t Target, rd Reading, f *final, start, end time.Time) (store.UsageRow, bool) {
	prev, hadPrev := m.last[t.ID]
	// The ended run's growth since the last row, or since it began if
	// the last row is of another run. A final below the last row's
	// counters of its run was read before them (the run went on a little
	// after Final): nothing more to bill. Then the counters go on from
	// the final's.
	var tailCPU, tailIn, tailOut int64
	if f != nil {
		same := hadPrev && prev.Instance == f.t.Instance
		cpu := f.rd.CPU.Nanoseconds()
		tailCPU = grown(same, prev.CPUCounter, cpu)
		tailIn = grown(same, prev.NetInCounter, f.rd.NetIn)
		tailOut = grown(same, prev.NetOutCounter, f.rd.NetOut)
		if !same {
			prev.CPUCounter, prev.NetInCounter, prev.NetOutCounter = 0, 0, 0
		}
		prev.Instance = f.t.Instance
		prev.CPUCounter = max(prev.CPUCounter, cpu)
		prev.NetInCounter = max(prev.NetInCounter, f.rd.NetIn)
		prev.NetOutCounter = max(prev.NetOutCounter, f.rd.NetOut)
	}
	// The time billed: the interval, less what came before the sandbox
	// or the end of its last row (an interval already written).
	from := start
	if t.Since.After(from) {
		from = t.Since
	}
	if hadPrev {
		if pe := prev.Start.Add(time.Duration(prev.Seconds) * time.Second); pe.After(from) {
			from = pe
		}
	}
	if !end.After(from) {
		return store.UsageRow{}, false
	}
	ms := end.Sub(from).Milliseconds()
	r := store.UsageRow{
		Sandbox: t.ID, Tenant: t.Tenant, Template: t.Template, Labels: t.Labels, Node: m.cfg.Node,
		Start: start, Seconds: int64(m.cfg.Interval / time.Second),
		MemoryByteSec:   rd.MemoryBytes * ms / 1000,
		DiskByteSec:     rd.DiskBytes * ms / 1000,
		SnapshotByteSec: rd.SnapshotBytes * ms / 1000,
		ArchiveByteSec:  rd.ArchiveBytes * ms / 1000,
	}
	if col := stateColumn(&r, t.State); col != nil {
		*col = ms
	}
	// Counters: the difference from the last row's, if it was of the
	// same run and they did not go back; else everything since the run
	// began. Without a reading they stay as they were.
	r.Instance, r.CPUCounter, r.NetInCounter, r.NetOutCounter = prev.Instance, prev.CPUCounter, prev.NetInCounter, prev.NetOutCounter
	if rd.Counted {
		same := (hadPrev || f != nil) && prev.Instance == t.Instance
		cpu := rd.CPU.Nanoseconds()
		r.CPUMicros = delta(same, prev.CPUCounter, cpu) / 1000
		r.NetInBytes = delta(same, prev.NetInCounter, rd.NetIn)
		r.NetOutBytes = delta(same, prev.NetOutCounter, rd.NetOut)
		// CPU is billed in whole microseconds; the remainder stays in
		// the counter for the next interval.
		r.Instance, r.CPUCounter, r.NetInCounter, r.NetOutCounter = t.Instance, cpu-delta(same, prev.CPUCounter, cpu)%1000, rd.NetIn, rd.NetOut
	}
	r.CPUMicros += tailCPU / 1000
	r.NetInBytes += tailIn
	r.NetOutBytes += tailOut
	return r, true
}

// grown is what a counter of an ended run grew by since prev (of the
// same run if same), never less than nothing.
func grown(same bool, prev, cur int64) int64 {
	if !same {
		return cur
	}
	return max(cur-prev, 0)
}

// delta is what a cumulative counter grew by since prev (of the same run
// if same); a counter that went back started over.
func delta(same bool, prev, cur int64) int64 {
	if !same || cur < prev {
		return cur
	}
	return cur - prev
}

// stateColumn is the field of r that counts time in state, nil for a
// state that is not billed as one of them (creating, a deleted sandbox's
// snapshots).
func stateColumn(r *store.UsageRow, state string) *int64 {
	switch state {
	case api.StateRunning, api.StateStopping:
		return &r.RunningMs
	case api.StatePaused:
		return &r.PausedMs
	case api.StateSuspended, api.StateSuspending, api.StateShelved:
		return &r.SuspendedMs
	case api.StateStopped, api.StateStarting, api.StateArchiving, api.StateError, api.StateLost:
		return &r.StoppedMs
	case api.StateArchived:
		return &r.ArchivedMs
	}
	return nil
}
