package store

import (
	"context"
	"strings"
	"time"
)

// Usage is the metered use of sandboxes (package usage): one row per
// sandbox and metering interval, written by the meter of the sandbox's node
// at the end of the interval. Rows are kept after their sandbox is deleted,
// so that what it used is still billed.
type Usage interface {
	// PutUsage records rows, all or none. A row whose sandbox and Start
	// are already recorded is left as recorded and not counted twice
	// (a meter that restarts and meters an interval again is harmless).
	// Each row's Tenant, Template and Labels are recorded as its
	// sandbox's, the newest replacing older ones.
	PutUsage(ctx context.Context, rows []UsageRow) error
	// LastUsage returns the newest row of each sandbox metered by node,
	// by sandbox ID: what a restarted meter goes on from.
	LastUsage(ctx context.Context, node string) (map[string]UsageRow, error)
	// QueryUsage returns the rows whose Start is in [q.From, q.To), of
	// tenant q.Tenant (of every tenant if empty), summed per sandbox and
	// bucket of q.Step: each result's Start is its bucket's (Start
	// truncated to a multiple of Step since the Unix epoch) and Seconds
	// the sum of its rows'. By Start, then Sandbox. A Step that is not a
	// positive number of whole seconds is ErrInvalid.
	QueryUsage(ctx context.Context, q UsageQuery) ([]UsageRow, error)
}

// UsageQuery selects rows for QueryUsage.
type UsageQuery struct {
	Tenant   string
	From, To time.Time
	Step     time.Duration
}

// UsageRow is what one sandbox used in one interval, in integer units so
// that sums are exact: CPU in microseconds, memory and storage in byte-
// seconds (the sampled size times the seconds it was held), network in
// bytes, states in milliseconds.
type UsageRow struct {
	Sandbox string
	// Tenant, Template and Labels are the sandbox's when metered; Node
	// the node that metered it.
	Tenant, Template, Node string
	Labels                 map[string]string
	// Start is the interval's start, to the second; Seconds its length.
	Start   time.Time
	Seconds int64

	CPUMicros       int64
	MemoryByteSec   int64 // working set (memory less page cache)
	DiskByteSec     int64 // writable layer
	SnapshotByteSec int64
	ArchiveByteSec  int64
	NetInBytes      int64
	NetOutBytes     int64
	// Milliseconds in each state during the interval.
	RunningMs, PausedMs, SuspendedMs, StoppedMs, ArchivedMs int64

	// Counters are the raw cumulative counters the interval's figures
	// were taken against (the runtime's CPU time, the firewall's bytes),
	// which the next interval subtracts from its own: a restarted meter
	// reads them from LastUsage so that it neither loses nor counts twice
	// what the sandbox used while the meter was down.
	CPUCounter, NetInCounter, NetOutCounter int64
	// Instance names the run of the sandbox the counters belong to (its
	// init's start time): a new run starts them again from zero.
	Instance int64
}

// Add adds o's figures (not its identity or counters) to r's.
func (r *UsageRow) Add(o UsageRow) {
	r.Seconds += o.Seconds
	r.CPUMicros += o.CPUMicros
	r.MemoryByteSec += o.MemoryByteSec
	r.DiskByteSec += o.DiskByteSec
	r.SnapshotByteSec += o.SnapshotByteSec
	r.ArchiveByteSec += o.ArchiveByteSec
	r.NetInBytes += o.NetInBytes
	r.NetOutBytes += o.NetOutBytes
	r.RunningMs += o.RunningMs
	r.PausedMs += o.PausedMs
	r.SuspendedMs += o.SuspendedMs
	r.StoppedMs += o.StoppedMs
	r.ArchivedMs += o.ArchivedMs
}

// UsageSums are the SQL sums of a usage row's figures, in UsageRow.Add's
// order, shared by both stores' QueryUsage.
const UsageSums = `SUM(r.seconds), SUM(r.cpu_us), SUM(r.mem_byte_s), SUM(r.disk_byte_s), SUM(r.snapshot_byte_s), SUM(r.archive_byte_s),
	SUM(r.net_in), SUM(r.net_out), SUM(r.running_ms), SUM(r.paused_ms), SUM(r.suspended_ms), SUM(r.stopped_ms), SUM(r.archived_ms)`

// UsageColumns are a usage row's columns, in UsageValues' order.
const UsageColumns = `sandbox_id, start, node, seconds, cpu_us, mem_byte_s, disk_byte_s, snapshot_byte_s, archive_byte_s,
	net_in, net_out, running_ms, paused_ms, suspended_ms, stopped_ms, archived_ms, cpu_counter, net_in_counter, net_out_counter, instance`

// UsageValues are r's values for UsageColumns.
func (r *UsageRow) UsageValues() []any {
	return []any{r.Sandbox, r.Start.Unix(), r.Node, r.Seconds, r.CPUMicros, r.MemoryByteSec, r.DiskByteSec,
		r.SnapshotByteSec, r.ArchiveByteSec, r.NetInBytes, r.NetOutBytes, r.RunningMs, r.PausedMs, r.SuspendedMs,
		r.StoppedMs, r.ArchivedMs, r.CPUCounter, r.NetInCounter, r.NetOutCounter, r.Instance}
}

// UsageSumDest are pointers into r for the columns "r.sandbox_id,
// bucket" and UsageSums; start receives the bucket's Unix seconds.
func (r *UsageRow) UsageSumDest(start *int64) []any {
	return []any{&r.Sandbox, start, &r.Seconds, &r.CPUMicros, &r.MemoryByteSec, &r.DiskByteSec, &r.SnapshotByteSec,
		&r.ArchiveByteSec, &r.NetInBytes, &r.NetOutBytes, &r.RunningMs, &r.PausedMs, &r.SuspendedMs, &r.StoppedMs, &r.ArchivedMs}
}

// UsageDest are pointers into r for UsageColumns; start receives the
// start's Unix seconds.
func (r *UsageRow) UsageDest(start *int64) []any {
	return []any{&r.Sandbox, start, &r.Node, &r.Seconds, &r.CPUMicros, &r.MemoryByteSec, &r.DiskByteSec,
		&r.SnapshotByteSec, &r.ArchiveByteSec, &r.NetInBytes, &r.NetOutBytes, &r.RunningMs, &r.PausedMs, &r.SuspendedMs,
		&r.StoppedMs, &r.ArchivedMs, &r.CPUCounter, &r.NetInCounter, &r.NetOutCounter, &r.Instance}
}

// UsageColumnsOf is UsageColumns with each column prefixed by p ("r.").
func UsageColumnsOf(p string) string {
	cols := strings.Split(UsageColumns, ",")
	for i, c := range cols {
		cols[i] = p + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}
