package control

import (
	"context"
	"fmt"
	"slices"
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
	return s.locked(ctx, id, "timeout", func(ctx context.Context, sb *store.Sandbox) error {
		sb.TimeoutSec, sb.ExpiresAt = req.TimeoutSec, nil
		if req.TimeoutSec > 0 {
			exp := time.Now().UTC().Add(time.Duration(req.TimeoutSec) * time.Second)
			sb.ExpiresAt = &exp
		}
		return s.setState(ctx, sb, sb.State)
	})
}

// lifecyclePolicy is one policy: the states it applies in, when it is due
// for a sandbox, and what it does then.
type lifecyclePolicy struct {
	name   string
	states []string
	due    func(s *Service, sb store.Sandbox, now time.Time) bool
	// busy, if set, vetoes a due policy in Run's sweep (not under the
	// sandbox's lock): the sandbox is in use after all.
	busy  func(s *Service, ctx context.Context, sb store.Sandbox) bool
	apply func(s *Service, ctx context.Context, sb store.Sandbox)
}

// policies are applied in order: a sandbox gets the first that is due.
var policies = []lifecyclePolicy{
	{
		name:   "timeout",
		states: []string{api.StateRunning, api.StatePaused},
		due: func(_ *Service, sb store.Sandbox, now time.Time) bool {
			return sb.ExpiresAt != nil && now.After(*sb.ExpiresAt)
		},
		apply: func(s *Service, ctx context.Context, sb store.Sandbox) {
			if sb.AutoResume {
				s.pauseAtTimeout(ctx, sb)
				return
			}
			s.log.Info("stopping sandbox at its timeout", "sandbox", sb.ID)
			s.stopByPolicy(ctx, sb, "timeout")
		},
	},
	{
		name:   "auto-stop",
		states: []string{api.StateRunning},
		due: func(s *Service, sb store.Sandbox, now time.Time) bool {
			return sb.AutoStopSec > 0 && now.Sub(s.lastActive(sb.ID)) > time.Duration(sb.AutoStopSec)*time.Second
		},
		busy: func(s *Service, ctx context.Context, sb store.Sandbox) bool {
			if n, err := s.runtimes[sb.Runtime].Processes(ctx, sb.ID); err == nil && n > 1 {
				s.touch(sb.ID) // its own processes are activity
				return true
			}
			return false
		},
		apply: func(s *Service, ctx context.Context, sb store.Sandbox) {
			s.log.Info("stopping idle sandbox", "sandbox", sb.ID)
			s.stopByPolicy(ctx, sb, "auto-stop")
		},
	},
	{
		name:   "auto-delete",
		states: []string{api.StateStopped},
		due: func(_ *Service, sb store.Sandbox, now time.Time) bool {
			return sb.Ephemeral || sb.AutoDeleteSec > 0 && sb.StoppedAt != nil && now.After(sb.StoppedAt.Add(time.Duration(sb.AutoDeleteSec)*time.Second))
		},
		apply: (*Service).deleteByPolicy,
	},
	{
		name:   "auto-archive",
		states: []string{api.StateStopped},
		due: func(s *Service, sb store.Sandbox, now time.Time) bool {
			return s.archive != nil && sb.AutoArchiveSec > 0 && sb.StoppedAt != nil &&
				now.After(sb.StoppedAt.Add(time.Duration(sb.AutoArchiveSec)*time.Second))
		},
		apply: func(s *Service, ctx context.Context, sb store.Sandbox) {
			s.log.Info("archiving sandbox by its policy", "sandbox", sb.ID)
			if err := s.archiveLocked(ctx, &sb, "auto-archive"); err != nil {
				s.log.Error("auto-archive", "sandbox", sb.ID, "err", err)
			}
		},
	},
	// Last: a checkpoint waits for the policies that stop a sandbox.
	checkpointPolicy,
}

// dueOf returns the policy due for sb now, if any.
func (s *Service) dueOf(sb store.Sandbox, now time.Time) (lifecyclePolicy, bool) {
	for _, p := range policies {
		if slices.Contains(p.states, sb.State) && p.due(s, sb, now) {
			return p, true
		}
	}
	return lifecyclePolicy{}, false
}

// applyPolicies applies the policies due for the sandboxes of sbs (this
// node's). Lost sandboxes are in no policy's states; those whose writes the
// cluster refused are left alone.
func (s *Service) applyPolicies(ctx context.Context, sbs []store.Sandbox) {
	now := time.Now()
	for _, sb := range sbs {
		if s.isFenced(sb.ID) {
			continue
		}
		p, ok := s.dueOf(sb, now)
		if !ok || p.busy != nil && p.busy(s, ctx, sb) {
			continue
		}
		s.policy(ctx, sb.ID, p.name)
	}
}

// policy applies policy name to sandbox id, after checking under its lock
// that it is still the one due.
func (s *Service) policy(ctx context.Context, id, name string) {
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.Get(ctx, id)
	if err != nil || sb.Node != s.name {
		return // gone, or moved to another node meanwhile
	}
	if p, ok := s.dueOf(sb, time.Now()); ok && p.name == name {
		p.apply(s, ctx, sb)
	}
}

// stopByPolicy stops sb for reason, deleting it if it is ephemeral.
func (s *Service) stopByPolicy(ctx context.Context, sb store.Sandbox, reason string) {
	if err := s.stopLocked(ctx, &sb, reason); err != nil {
		s.log.Error(reason, "sandbox", sb.ID, "err", err)
		return
	}
	if sb.Ephemeral {
		s.deleteByPolicy(ctx, sb)
	}
}

// pauseAtTimeout pauses auto-resume sb at its timeout; one that is
// paused already only loses its timeout.
func (s *Service) pauseAtTimeout(ctx context.Context, sb store.Sandbox) {
	s.log.Info("pausing auto-resume sandbox at its timeout", "sandbox", sb.ID)
	if sb.State == api.StatePaused {
		sb.ExpiresAt = nil
		if err := s.setState(ctx, &sb, api.StatePaused); err != nil {
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
