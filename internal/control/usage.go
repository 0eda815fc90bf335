package control

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/usage"
)

// usageSource is what the node's usage meter meters (usage.Source): the
// node's sandboxes, measured by their runtimes, the layer store, the
// network and the archive store, and on a single machine the snapshots
// of deleted sandboxes, which are still stored.
type usageSource struct {
	s *Service

	mu sync.Mutex
	// sizes are the sizes of snapshots and archives, by key; they do not
	// change once written, so each is measured once.
	sizes map[string]int64
	// snaps is each sandbox's snapshots and rows its row, as Targets last
	// listed them.
	snaps map[string][]string
	rows  map[string]store.Sandbox
}

// Targets implements usage.Source. Pooled and prestarted sandboxes are
// nobody's yet: what they use before a create takes them is the node's.
func (u *usageSource) Targets(ctx context.Context) ([]usage.Target, error) {
	s := u.s
	sbs, err := s.store.ListNode(ctx, s.name)
	if err != nil {
		return nil, err
	}
	sns, err := s.store.ListSnapshots(ctx, "")
	if err != nil {
		return nil, err
	}
	snaps := map[string][]string{}
	for _, sn := range sns {
		snaps[sn.SandboxID] = append(snaps[sn.SandboxID], sn.ID)
	}
	out := make([]usage.Target, 0, len(sbs))
	mine := map[string]bool{}
	rows := map[string]store.Sandbox{}
	// keep are the stored objects whose sizes stay remembered.
	keep := map[string]bool{}
	for _, sn := range sns {
		keep[snapshotKey(sn.ID)] = true
	}
	for _, sb := range sbs {
		if hidden(sb) || sb.State == api.StateCreating {
			continue
		}
		mine[sb.ID], rows[sb.ID] = true, sb
		if sb.State == api.StateArchived {
			keep[archiveKey(sb.ID)] = true
		}
		out = append(out, usage.Target{
			ID: sb.ID, Tenant: sb.Tenant, Template: sb.Template, Labels: sb.Labels, State: sb.State,
			Since: sb.CreatedAt, Instance: int64(sb.StartTime),
		})
	}
	// A deleted sandbox's snapshots are metered on its own, as the
	// sandbox's: on a single machine only, where every snapshot is this
	// node's (in a cluster its node is gone with its row).
	if s.name == "" {
		all, err := s.store.List(ctx)
		if err != nil {
			return nil, err
		}
		live := map[string]bool{}
		for _, sb := range all {
			live[sb.ID] = true
		}
		for _, sn := range sns {
			if live[sn.SandboxID] || mine[sn.SandboxID] {
				continue
			}
			mine[sn.SandboxID] = true
			out = append(out, usage.Target{ID: sn.SandboxID, Tenant: sn.Tenant, Template: sn.Template, Since: sn.CreatedAt})
		}
	}
	u.mu.Lock()
	u.snaps, u.rows = snaps, rows
	for k := range u.sizes {
		if !keep[k] {
			delete(u.sizes, k)
		}
	}
	u.mu.Unlock()
	return out, nil
}

// finalUsage gives the meter what sb's run has used, read just before its
// processes (and their counters) end: a stop, a shelve, a delete. Without
// it what the run used since the meter's last sample would never be
// billed. Nothing for a sandbox that is nobody's (pooled) or has no
// processes; a runtime that does not answer at once (a frozen VM's guest)
// leaves its tail unbilled rather than hold the stop.
func (s *Service) finalUsage(ctx context.Context, sb store.Sandbox) {
	if s.meter == nil || sb.PID == 0 || hidden(sb) {
		return
	}
	meter, ok := s.runtimes[sb.Runtime].(runtime.Meter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ru, err := meter.Usage(ctx, sb.ID)
	if err != nil {
		return
	}
	rd := usage.Reading{Counted: true, CPU: ru.CPU}
	if s.net != nil {
		if in, out, err := s.net.Counters(sb.Slot); err == nil {
			rd.NetIn, rd.NetOut = in, out
		}
	}
	s.meter.Final(usage.Target{ID: sb.ID, Tenant: sb.Tenant, Template: sb.Template, Labels: sb.Labels,
		State: sb.State, Since: sb.CreatedAt, Instance: int64(sb.StartTime)}, rd)
}

// Read implements usage.Source.
func (u *usageSource) Read(ctx context.Context, t usage.Target) (usage.Reading, error) {
	s := u.s
	var rd usage.Reading
	u.mu.Lock()
	sb, snaps := u.rows[t.ID], u.snaps[t.ID]
	u.mu.Unlock()
	// A sandbox with processes: its cgroup's CPU time and memory, and
	// its network's counters. A paused one's cgroup is frozen, its
	// counters still.
	if (t.State == api.StateRunning || t.State == api.StatePaused) && sb.PID != 0 {
		meter, ok := s.runtimes[sb.Runtime].(runtime.Meter)
		if !ok {
			return rd, fmt.Errorf("runtime %q does not measure sandboxes", sb.Runtime)
		}
		ru, err := meter.Usage(ctx, t.ID)
		if err != nil {
			if t.State == api.StateRunning {
				return rd, err
			}
		} else {
			rd.Counted, rd.CPU, rd.MemoryBytes = true, ru.CPU, ru.MemoryBytes
			rd.DiskBytes = ru.DiskBytes
			if s.net != nil {
				if in, out, err := s.net.Counters(sb.Slot); err == nil {
					rd.NetIn, rd.NetOut = in, out
				}
			}
		}
	}
	if t.State != "" && rd.DiskBytes == 0 && s.layers.WritableExists(t.ID) {
		if used, _, err := s.layers.WritableUsage(t.ID); err == nil {
			rd.DiskBytes = used
		}
	}
	if t.State == api.StateArchived && s.archive != nil {
		rd.ArchiveBytes = u.size(ctx, archiveKey(t.ID), nil)
	}
	for _, id := range snaps {
		rd.SnapshotBytes += u.size(ctx, snapshotKey(id), func() (int64, error) { return s.layers.SnapshotUsage(id) })
	}
	return rd, nil
}

// size is the size of the snapshot or archive stored under key: local
// measures it on this node's disk, else the archive store's object is;
// 0 if neither has it (yet).
func (u *usageSource) size(ctx context.Context, key string, local func() (int64, error)) int64 {
	u.mu.Lock()
	n, ok := u.sizes[key]
	u.mu.Unlock()
	if ok {
		return n
	}
	if local != nil {
		if n, err := local(); err == nil && n > 0 {
			u.remember(key, n)
			return n
		}
	}
	if u.s.archive == nil {
		return 0
	}
	obj, err := u.s.archive.Get(ctx, key)
	if err != nil {
		return 0
	}
	n = obj.Size()
	obj.Close()
	u.remember(key, n)
	return n
}

func (u *usageSource) remember(key string, n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sizes == nil {
		u.sizes = map[string]int64{}
	}
	u.sizes[key] = n
}
