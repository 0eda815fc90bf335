package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/metrics"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// MaxMetricsIDs is how many sandboxes one LatestMetrics asks about, as on
// E2B.
const MaxMetricsIDs = 100

// meterSource is what the Service's sampler samples (metrics.Source): the
// sandboxes in the store, measured by their runtimes and the layer store.
type meterSource struct{ s *Service }

// Sandboxes implements metrics.Source. Pooled and prestarted sandboxes
// are not sampled: no tenant has them yet, and their use so far is not
// the one that gets them's.
func (m meterSource) Sandboxes(ctx context.Context) ([]metrics.Target, error) {
	sbs, err := m.s.store.ListNode(ctx, m.s.name)
	if err != nil {
		return nil, err
	}
	out := make([]metrics.Target, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, metrics.Target{
			ID: sb.ID, Runtime: sb.Runtime, Slot: sb.Slot, Running: sb.State == api.StateRunning && !hidden(sb),
			CPU: sb.CPU, MemoryBytes: sb.MemoryMiB << 20, DiskBytes: sb.DiskGiB << 30,
		})
	}
	return out, nil
}

// Read implements metrics.Source: CPU and memory from the runtime, the
// disk from the runtime if it keeps the writable disk while the sandbox
// runs (vm), from the layer store's quota group otherwise.
func (m meterSource) Read(ctx context.Context, t metrics.Target) (metrics.Reading, error) {
	meter, ok := m.s.runtimes[t.Runtime].(runtime.Meter)
	if !ok {
		return metrics.Reading{}, fmt.Errorf("runtime %q does not measure sandboxes", t.Runtime)
	}
	u, err := meter.Usage(ctx, t.ID)
	if err != nil {
		return metrics.Reading{}, err
	}
	r := metrics.Reading{CPU: u.CPU, MemUsed: u.MemoryBytes, MemCache: u.CacheBytes, DiskUsed: u.DiskBytes, DiskTotal: u.DiskTotalBytes}
	if m.s.net != nil {
		// The firewall's side of its veth (network.Manager.Counters).
		if in, out, err := m.s.net.Counters(t.Slot); err == nil {
			r.NetRx, r.NetTx = in, out
		}
	}
	if u.DiskTotalBytes == 0 {
		used, quota, err := m.s.layers.WritableUsage(t.ID)
		if err != nil {
			// CPU and memory are worth a sample without the disk's
			// figure; the quota stays the one the sandbox was given.
			m.s.log.Debug("measuring writable layer", "sandbox", t.ID, "err", err)
		}
		r.DiskUsed, r.DiskTotal = used, quota
	}
	return r, nil
}

// Metrics returns the samples of sandbox id taken from start to end (both
// inclusive, to the second; zero for open ends), oldest first. Reading
// them is not activity: it keeps no sandbox from stopping.
func (s *Service) Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error) {
	if _, err := s.get(ctx, id); err != nil {
		return nil, err
	}
	smps := s.metrics.Range(id, start, end)
	out := make([]api.Metric, len(smps))
	for i, smp := range smps {
		out[i] = apiMetric(smp)
	}
	return out, nil
}

// LatestMetrics returns the newest sample of each of ids (at most
// MaxMetricsIDs) that has one; those not found, another tenant's among
// them, are left out, as on E2B.
func (s *Service) LatestMetrics(ctx context.Context, ids []string) (map[string]api.Metric, error) {
	if len(ids) > MaxMetricsIDs {
		return nil, fmt.Errorf("%w: at most %d sandbox IDs at once", errdefs.ErrInvalid, MaxMetricsIDs)
	}
	out := map[string]api.Metric{}
	for _, id := range ids {
		if _, err := s.get(ctx, id); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			return nil, err
		}
		if smp, ok := s.metrics.Latest(id); ok {
			out[id] = apiMetric(smp)
		}
	}
	return out, nil
}

// Sampler is the service's sampler of running sandboxes, for what reads
// their metrics besides the API.
func (s *Service) Sampler() *metrics.Sampler { return s.metrics }

func apiMetric(smp metrics.Sample) api.Metric {
	return api.Metric{
		Time: smp.Time.UTC(), CPUCount: smp.CPUCount, CPUUsedPct: smp.CPUUsedPct,
		MemoryUsedBytes: smp.MemUsed, MemoryCacheBytes: smp.MemCache, MemoryTotalBytes: smp.MemTotal,
		DiskUsedBytes: smp.DiskUsed, DiskTotalBytes: smp.DiskTotal,
		NetworkRxBytes: smp.NetRx, NetworkTxBytes: smp.NetTx,
	}
}
