package control

import (
	"context"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// maxPolicySec bounds timeouts and auto-delete delays: one year.
const maxPolicySec = 365 * 24 * 3600

// Lifecycle policies, applied once a second by Run:
//   - timeout: a running or paused sandbox past ExpiresAt is stopped (an
//     ephemeral one deleted), an auto-resume one paused instead (without a
//     timeout until traffic wakes it). A start sets ExpiresAt to now + the
//     timeout; SetTimeout moves it.
//   - ephemeral: stopping deletes the sandbox, whatever stopped it.
//   - auto-delete: a stopped sandbox is deleted that long after it stopped.
//   - auto-archive: a stopped sandbox is archived that long after it stopped
//     (if auto-delete is due first, it is deleted instead).
//   - auto-stop: a running sandbox is stopped after auto_stop_sec without
//     activity. Activity is an API call about it (get, exec, files, any
//     agent route), its start, or any process of its own running besides
//     the agent; a paused sandbox is never auto-stopped.
//
// Each change goes through the same recorded transitions as an API call, with
// the policy as the reason.

// SetTimeout makes a running or paused sandbox stop req.TimeoutSec from now,
// or never for 0.
func (s *Service) SetTimeout(ctx context.Context, id string, req api.TimeoutRequest) (api.Sandbox, error) {
	if req.TimeoutSec < 0 || req.TimeoutSec > maxPolicySec {
		return api.Sandbox{}, fmt.Errorf("%w: timeout_sec must be between 0 and %d", errdefs.ErrInvalid, maxPolicySec)
	}
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "")
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	if sb.State != api.StateRunning && sb.State != api.StatePaused {
		return api.Sandbox{}, fmt.Errorf("%w: sandbox %s is %s; a timeout applies to running sandboxes", errdefs.ErrConflict, id, sb.State)
	}
	sb.TimeoutSec, sb.ExpiresAt = req.TimeoutSec, nil
	if req.TimeoutSec > 0 {
		exp := time.Now().UTC().Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	if err := s.store.Update(ctx, &sb, sb.State); err != nil {
		return api.Sandbox{}, err
	}
	return s.view(sb), nil
}

func (s *Service) applyPolicies(ctx context.Context) {
	sbs, err := s.store.List(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, sb := range sbs {
		switch {
		case (sb.State == api.StateRunning || sb.State == api.StatePaused) && sb.ExpiresAt != nil && now.After(*sb.ExpiresAt):
			s.policy(ctx, sb.ID, "timeout")
		case sb.State == api.StateRunning && sb.AutoStopSec > 0 && now.Sub(s.lastActive(sb.ID)) > time.Duration(sb.AutoStopSec)*time.Second:
			if n, err := s.runtimes[sb.Runtime].Processes(ctx, sb.ID); err == nil && n > 1 {
				s.touch(sb.ID) // its own processes are activity
				continue
			}
			s.policy(ctx, sb.ID, "auto-stop")
		case sb.State == api.StateStopped && (sb.Ephemeral ||
			sb.AutoDeleteSec > 0 && sb.StoppedAt != nil && now.After(sb.StoppedAt.Add(time.Duration(sb.AutoDeleteSec)*time.Second))):
			s.policy(ctx, sb.ID, "auto-delete")
		case sb.State == api.StateStopped && s.archive != nil && sb.AutoArchiveSec > 0 && sb.StoppedAt != nil &&
			now.After(sb.StoppedAt.Add(time.Duration(sb.AutoArchiveSec)*time.Second)):
			s.policy(ctx, sb.ID, "auto-archive")
		}
	}
}

// policy applies one policy decision to sandbox id, after checking under its
// lock that it still holds.
func (s *Service) policy(ctx context.Context, id, reason string) {
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.Get(ctx, id)
	if err != nil {
		return
	}
	now := time.Now()
	switch reason {
	case "timeout":
		if (sb.State != api.StateRunning && sb.State != api.StatePaused) || sb.ExpiresAt == nil || !now.After(*sb.ExpiresAt) {
			return
		}
		if sb.AutoResume {
			s.pauseAtTimeout(ctx, sb)
			return
		}
		s.log.Info("stopping sandbox at its timeout", "sandbox", id)
		if err := s.stopLocked(ctx, &sb, "timeout"); err != nil {
			s.log.Error("stopping at timeout", "sandbox", id, "err", err)
			return
		}
		if sb.Ephemeral {
			s.deleteByPolicy(ctx, sb)
		}
	case "auto-stop":
		if sb.State != api.StateRunning || sb.AutoStopSec == 0 || now.Sub(s.lastActive(id)) <= time.Duration(sb.AutoStopSec)*time.Second {
			return
		}
		s.log.Info("stopping idle sandbox", "sandbox", id)
		if err := s.stopLocked(ctx, &sb, "auto-stop"); err != nil {
			s.log.Error("auto-stop", "sandbox", id, "err", err)
			return
		}
		if sb.Ephemeral {
			s.deleteByPolicy(ctx, sb)
		}
	case "auto-delete":
		if sb.State != api.StateStopped {
			return
		}
		s.deleteByPolicy(ctx, sb)
	case "auto-archive":
		if sb.State != api.StateStopped {
			return
		}
		s.log.Info("archiving sandbox by its policy", "sandbox", id)
		if err := s.archiveLocked(ctx, &sb, "auto-archive"); err != nil {
			s.log.Error("auto-archive", "sandbox", id, "err", err)
		}
	}
}

// pauseAtTimeout pauses auto-resume sb at its timeout; one that is
// paused already only loses its timeout.
func (s *Service) pauseAtTimeout(ctx context.Context, sb store.Sandbox) {
	s.log.Info("pausing auto-resume sandbox at its timeout", "sandbox", sb.ID)
	if sb.State == api.StatePaused {
		sb.ExpiresAt = nil
		if err := s.store.Update(ctx, &sb, api.StatePaused); err != nil {
			s.log.Error("pausing at timeout", "sandbox", sb.ID, "err", err)
		}
		return
	}
	if err := s.pauseLocked(ctx, &sb); err != nil {
		s.log.Error("pausing at timeout", "sandbox", sb.ID, "err", err)
	}
}

func (s *Service) deleteByPolicy(ctx context.Context, sb store.Sandbox) {
	s.log.Info("deleting sandbox by its policy", "sandbox", sb.ID, "ephemeral", sb.Ephemeral)
	if err := s.deleteLocked(ctx, sb); err != nil {
		s.log.Error("deleting by policy", "sandbox", sb.ID, "err", err)
	}
}

// touch records activity of sandbox id now.
func (s *Service) touch(id string) {
	s.activityMu.Lock()
	s.activity[id] = time.Now()
	s.activityMu.Unlock()
}

// lastActive is when sandbox id was last used; a sandbox the service has not
// seen since it started counts as used now.
func (s *Service) lastActive(id string) time.Time {
	s.activityMu.Lock()
	defer s.activityMu.Unlock()
	t, ok := s.activity[id]
	if !ok {
		t = time.Now()
		s.activity[id] = t
	}
	return t
}
