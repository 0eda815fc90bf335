package vault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// A vault's compaction schedule (api.VaultUpdate.Compact): daily, at
// 00:00 UTC, or weekly, on Mondays at 00:00 UTC, with the default
// windows (the days before the current week into weeks, the weeks before
// that week's month into months) and the vault's summarizer. Turned on
// or changed, a schedule's first compaction is due at once, then at each
// boundary. Every node runs RunSchedules; of the nodes of a cluster that
// find a compaction due, the one whose claim moves its next run on in the
// store (compare-and-set) makes it.

// nextRun is the first boundary of schedule every after now: the next
// midnight UTC, or the next Monday's.
func nextRun(every string, now time.Time) time.Time {
	now = now.UTC()
	d := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).AddDate(0, 0, 1)
	if every == api.VaultCompactWeekly {
		d = d.AddDate(0, 0, (8-int(d.Weekday()))%7)
	}
	return d
}

// checkSchedule returns the stored form of schedule every ("" for off),
// or errdefs.ErrInvalid.
func checkSchedule(every string) (string, error) {
	switch every {
	case api.VaultCompactDaily, api.VaultCompactWeekly:
		return every, nil
	case api.VaultCompactOff, "":
		return "", nil
	}
	return "", fmt.Errorf("%w: compact %.40q: want %s, %s or %s", errdefs.ErrInvalid, every, api.VaultCompactDaily, api.VaultCompactWeekly, api.VaultCompactOff)
}

// Update changes the context's tenant's vault name as u says: its
// compaction schedule, its summarizer.
func (s *Service) Update(ctx context.Context, name string, u api.VaultUpdate) (api.Vault, error) {
	every, cmd := "", ""
	var err error
	if u.Compact != nil {
		if every, err = checkSchedule(*u.Compact); err != nil {
			return api.Vault{}, err
		}
	}
	if u.Summarizer != nil {
		if cmd = *u.Summarizer; checkSummarizer(cmd) != nil {
			return api.Vault{}, checkSummarizer(cmd)
		}
	}
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.Vault{}, err
	}
	sc, err := s.cfg.Store.VaultSchedule(ctx, v.ID)
	if err != nil {
		return api.Vault{}, err
	}
	if u.Compact != nil && every != sc.Every {
		sc.Every, sc.Next = every, time.Time{}
		if every != "" {
			sc.Next = time.Now().UTC().Truncate(time.Microsecond) // the first at once
		}
	}
	if u.Summarizer != nil {
		sc.Summarizer = cmd
	}
	if err := s.cfg.Store.SetVaultSchedule(ctx, sc); err != nil {
		return api.Vault{}, err
	}
	return s.describe(ctx, v)
}

// ScheduleTick is how often RunSchedules looks for due compactions.
const ScheduleTick = time.Minute

// RunSchedules makes the vaults' scheduled compactions, looking every
// tick (ScheduleTick if 0) for those due, until ctx ends.
func (s *Service) RunSchedules(ctx context.Context, tick time.Duration) {
	if tick <= 0 {
		tick = ScheduleTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		s.runDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// runDue makes the compactions due now that this node claims, one after
// the other.
func (s *Service) runDue(ctx context.Context) {
	now := time.Now().UTC()
	due, err := s.cfg.Store.DueVaultSchedules(ctx, now, 32)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("looking for due vault compactions", "err", err)
		}
		return
	}
	for _, sc := range due {
		ok, err := s.cfg.Store.ClaimVaultSchedule(ctx, sc.VaultID, sc.Next, nextRun(sc.Every, now))
		if err != nil || !ok {
			continue // another node has it, or it was changed meanwhile
		}
		s.runScheduled(ctx, sc, now)
	}
}

// scheduledTimeout bounds one scheduled compaction, summarizer included.
const scheduledTimeout = 15 * time.Minute

func (s *Service) runScheduled(ctx context.Context, sc store.VaultSchedule, now time.Time) {
	ctx, cancel := context.WithTimeout(tenant.NewContext(ctx, sc.Tenant), scheduledTimeout)
	defer cancel()
	v, err := s.cfg.Store.GetVault(ctx, sc.Tenant, sc.Name)
	if err != nil || v.ID != sc.VaultID {
		return // deleted (and perhaps made again) meanwhile
	}
	before := DefaultBefore(now)
	res, err := s.compactLogged(ctx, v, CompactOptions{Before: before, WeeksBefore: DefaultWeeksBefore(before)}, sc.Summarizer, "schedule")
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		s.log.Warn("a scheduled vault compaction failed", "vault", v.ID, "err", err)
	case res.Commit != "":
		s.log.Info("vault compacted", "vault", v.ID, "commit", res.Commit)
	}
}

// Events returns the newest events of the context's tenant's vault name,
// at most limit (0: 100), newest first.
func (s *Service) Events(ctx context.Context, name string, limit int) ([]api.VaultEvent, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > store.MaxVaultEvents {
		limit = 100
	}
	evs, err := s.cfg.Store.VaultEvents(ctx, v.ID, limit)
	if err != nil {
		return nil, err
	}
	out := make([]api.VaultEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, api.VaultEvent{Time: e.At, Kind: e.Kind, Trigger: e.Trigger, Commit: e.Commit, Error: e.Error, Detail: e.Detail})
	}
	return out, nil
}
