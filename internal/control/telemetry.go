package control

import (
	"context"
	"sort"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/telemetry"
)

// holds says which states hold a node's resources: what the node's
// allocation counts (a stopped sandbox keeps only its disk, which the
// capacity's free space already shows).
var holds = map[string]bool{
	api.StateRunning: true, api.StatePaused: true, api.StateStarting: true, api.StateCreating: true,
	lifecycle.Pooled: true, lifecycle.Prestarted: true,
}

// Levels reads what the node's Prometheus metrics show at a scrape
// (telemetry.Source), all but its capacity, which is the server's to know:
// its sandboxes by state and runtime, its warm pools and prestarted
// processes, and what the sandboxes holding resources are given.
func (s *Service) Levels(ctx context.Context) (telemetry.Levels, error) {
	sbs, err := s.store.ListNode(ctx, s.name)
	if err != nil {
		return telemetry.Levels{}, err
	}
	var l telemetry.Levels
	counts := map[[2]string]int{}
	for _, sb := range sbs {
		counts[[2]string{sb.State, sb.Runtime}]++
		if sb.State == lifecycle.Prestarted {
			l.Prestarted++
		}
		if holds[sb.State] {
			l.Allocated.CPU += sb.CPU
			l.Allocated.MemoryBytes += sb.MemoryMiB << 20
			l.Allocated.DiskBytes += sb.DiskGiB << 30
			l.Allocated.Sandboxes++
		}
	}
	for k, n := range counts {
		l.Sandboxes = append(l.Sandboxes, telemetry.SandboxCount{State: k[0], Runtime: k[1], N: n})
	}
	sort.Slice(l.Sandboxes, func(i, j int) bool {
		a, b := l.Sandboxes[i], l.Sandboxes[j]
		return a.State < b.State || a.State == b.State && a.Runtime < b.Runtime
	})
	l.Pooled = s.pools.Pooled()
	l.PoolTarget, l.PrestartTarget = s.pools.Targets()
	return l, nil
}

// The sandbox operations the metrics time (atoll_operation_seconds), for
// both APIs: each is its lower-case method, timed.

// Create is create, timed.
func (s *Service) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	start := time.Now()
	v, err := s.create(ctx, req)
	telemetry.Op(telemetry.OpCreate, start, err)
	return v, err
}

// Start is start, timed.
func (s *Service) Start(ctx context.Context, id string) (api.Sandbox, error) {
	start := time.Now()
	v, err := s.start(ctx, id)
	telemetry.Op(telemetry.OpStart, start, err)
	return v, err
}

// Pause is pause, timed.
func (s *Service) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	start := time.Now()
	v, err := s.pause(ctx, id)
	telemetry.Op(telemetry.OpPause, start, err)
	return v, err
}

// Resume is resume, timed.
func (s *Service) Resume(ctx context.Context, id string) (api.Sandbox, error) {
	start := time.Now()
	v, err := s.resume(ctx, id)
	telemetry.Op(telemetry.OpResume, start, err)
	return v, err
}

// CreateSnapshot is createSnapshot, timed.
func (s *Service) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	start := time.Now()
	v, err := s.createSnapshot(ctx, id, req)
	telemetry.Op(telemetry.OpSnapshot, start, err)
	return v, err
}

// Fork is fork, timed.
func (s *Service) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	start := time.Now()
	v, err := s.fork(ctx, id, req)
	telemetry.Op(telemetry.OpFork, start, err)
	return v, err
}

// Restore is restore, timed.
func (s *Service) Restore(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	start := time.Now()
	v, err := s.restore(ctx, id, req)
	telemetry.Op(telemetry.OpRestore, start, err)
	return v, err
}
