package usage

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Steps are the buckets a report may sum in.
var Steps = map[string]time.Duration{
	api.UsageByMinute: time.Minute,
	api.UsageByHour:   time.Hour,
	api.UsageByDay:    24 * time.Hour,
}

// MaxBuckets bounds the buckets of one report: a year by the day, a week
// by the minute.
const MaxBuckets = 10080

// groupings name what a row is grouped by; a label grouping is handled
// apart (its key varies).
var groupings = map[string]func(r store.UsageRow) string{
	api.UsageBySandbox:  func(r store.UsageRow) string { return r.Sandbox },
	api.UsageByTenant:   func(r store.UsageRow) string { return r.Tenant },
	api.UsageByTemplate: func(r store.UsageRow) string { return r.Template },
}

// Reporter answers usage queries from the store.
type Reporter struct{ Store store.Usage }

// Report sums the usage q asks for. Its From and To are truncated to the
// step; a bad step, grouping or range is ErrInvalid.
func (rp Reporter) Report(ctx context.Context, q api.UsageQuery) (api.UsageReport, error) {
	step, ok := Steps[q.Step]
	if !ok {
		return api.UsageReport{}, fmt.Errorf("%w: step %.20q: want 1m, 1h or 1d", errdefs.ErrInvalid, q.Step)
	}
	key := groupings[q.GroupBy]
	if label, ok := strings.CutPrefix(q.GroupBy, api.UsageByLabel); ok {
		if label == "" || len(label) > 256 {
			return api.UsageReport{}, fmt.Errorf("%w: group_by label: needs a key (label:KEY)", errdefs.ErrInvalid)
		}
		key = func(r store.UsageRow) string { return r.Labels[label] }
	}
	if key == nil {
		return api.UsageReport{}, fmt.Errorf("%w: group_by %.40q: want sandbox, tenant, template or label:KEY", errdefs.ErrInvalid, q.GroupBy)
	}
	from, to := q.From.UTC().Truncate(step), q.To.UTC().Truncate(step)
	if q.To.After(to) {
		to = to.Add(step)
	}
	if !to.After(from) {
		return api.UsageReport{}, fmt.Errorf("%w: from must be before to", errdefs.ErrInvalid)
	}
	if to.Sub(from)/step > MaxBuckets {
		return api.UsageReport{}, fmt.Errorf("%w: %d buckets of %s asked, at most %d", errdefs.ErrInvalid, to.Sub(from)/step, q.Step, MaxBuckets)
	}
	rows, err := rp.Store.QueryUsage(ctx, store.UsageQuery{Tenant: q.Tenant, From: from, To: to, Step: step})
	if err != nil {
		return api.UsageReport{}, err
	}
	type bucket struct {
		start time.Time
		group string
	}
	sums := map[bucket]*store.UsageRow{}
	for _, r := range rows {
		b := bucket{r.Start, key(r)}
		if sums[b] == nil {
			sums[b] = &store.UsageRow{}
		}
		sums[b].Add(r)
	}
	out := api.UsageReport{From: from, To: to, Step: q.Step, GroupBy: q.GroupBy, Usage: []api.UsageEntry{}}
	for b, r := range sums {
		out.Usage = append(out.Usage, Entry(b.start, b.group, *r))
	}
	slices.SortFunc(out.Usage, func(a, b api.UsageEntry) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return strings.Compare(a.Group, b.Group)
	})
	return out, nil
}

// Units of the report.
const (
	gib       = 1 << 30
	gibHour   = gib * 3600
	microsecs = 1e6
	millisecs = 1e3
)

// Entry is r's figures in the API's units.
func Entry(start time.Time, group string, r store.UsageRow) api.UsageEntry {
	return api.UsageEntry{
		Start: start, Group: group,
		CPUSeconds:       float64(r.CPUMicros) / microsecs,
		MemoryGiBSeconds: float64(r.MemoryByteSec) / gib,
		DiskGiBHours:     float64(r.DiskByteSec) / gibHour,
		SnapshotGiBHours: float64(r.SnapshotByteSec) / gibHour,
		ArchiveGiBHours:  float64(r.ArchiveByteSec) / gibHour,
		NetInBytes:       r.NetInBytes, NetOutBytes: r.NetOutBytes,
		States: api.UsageStates{
			Running: float64(r.RunningMs) / millisecs, Paused: float64(r.PausedMs) / millisecs,
			Suspended: float64(r.SuspendedMs) / millisecs, Stopped: float64(r.StoppedMs) / millisecs,
			Archived: float64(r.ArchivedMs) / millisecs,
		},
	}
}
