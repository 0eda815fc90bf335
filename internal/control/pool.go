package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// The warm pool keeps sandboxes started ahead of demand, so that a create
// which matches hands one out in a few milliseconds: it gets its ID, limits,
// disk quota, environment and labels, and becomes visible. The default
// template keeps --warm-pool of them; another template keeps as many as its
// pool size says (LABEL atoll.pool in its Dockerfile), already past its start
// and ready commands: such sandboxes start warm. Pooled sandboxes are in the
// store (so a crash can clean them up) in a state the API never shows. They
// are the running server's, like prestarted processes: a graceful stop
// discards them, and a start discards any a crash left. internal/pools
// decides how many to keep and which to hand out; this file makes them
// (StartPooled), adopts one for a create (adoptPooled) and discards them.
const statePooled = lifecycle.Pooled

// poolWeight is the CPU weight of a pooled sandbox (default 100): filling the
// pool must not slow the sandboxes being used.
const poolWeight = 5

// DiscardIf discards sandbox id if it is still in state.
func (s *Service) DiscardIf(ctx context.Context, id, state string) {
	if s.relinquished.Load() {
		return // Relinquish stopped it; the store is not this node's to write
	}
	unlock := s.lock(id)
	defer unlock()
	if cur, err := s.store.Get(ctx, id); err == nil && cur.State == state {
		s.discard(ctx, cur)
	}
}

// StartPooled starts a sandbox of version v, made under name, for a warm
// pool.
func (s *Service) StartPooled(ctx context.Context, name string, v store.Template) (string, error) {
	// Once begun, finish: a half-made sandbox is cleaned up only at restart.
	ctx = context.WithoutCancel(ctx)
	if err := s.usable(); err != nil {
		return "", err
	}
	d := s.defaults
	tmpl, err := s.tmpls.Stack(ctx, v)
	if err != nil {
		return "", err
	}
	sb := store.Sandbox{Sandbox: api.Sandbox{
		ID: newID(), State: statePooled, Template: name, TemplateVersion: v.ID, Runtime: d.Runtime,
		CPU: d.CPU, MemoryMiB: d.MemoryMiB, DiskGiB: d.DiskGiB, PIDs: d.PIDs, CreatedAt: time.Now().UTC(),
	}}
	unlock := s.lock(sb.ID)
	defer unlock()
	if err := s.record(ctx, &sb); err != nil {
		return "", err
	}
	// While it waits in the pool it yields the CPU to sandboxes in use.
	if err := s.startLocked(ctx, &sb, tmpl, statePooled, statePooled, poolWeight); err != nil {
		s.discard(ctx, sb)
		return "", err
	}
	// Warm the agent's exec path so the first exec of the new owner is quick.
	c := s.agentClient(sb.Socket)
	if _, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
		s.discard(ctx, sb)
		return "", fmt.Errorf("warming pooled sandbox: %w", err)
	}
	return sb.ID, nil
}

// takePooled hands out a pooled sandbox of the pool key for req (whose
// Template is the name it asked for), with egress policy policy, if one
// fits, or returns ok false.
func (s *Service) takePooled(ctx context.Context, key string, req api.CreateSandboxRequest, policy api.NetworkPolicy) (api.Sandbox, bool) {
	if req.Runtime != s.defaults.Runtime {
		return api.Sandbox{}, false
	}
	for {
		id, ok := s.pools.Take(key)
		if !ok {
			return api.Sandbox{}, false
		}
		sb, err := s.adoptPooled(ctx, id, req, policy)
		if err == nil {
			return sb, true
		}
		s.log.Warn("handing out pooled sandbox", "sandbox", id, "err", err)
	}
}

func (s *Service) adoptPooled(ctx context.Context, id string, req api.CreateSandboxRequest, policy api.NetworkPolicy) (api.Sandbox, error) {
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.Get(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	fail := func(err error) (api.Sandbox, error) {
		s.discard(ctx, sb)
		return api.Sandbox{}, err
	}
	if sb.State != statePooled || !s.runtimes[sb.Runtime].Alive(instance(sb)) {
		return fail(errors.New("pooled sandbox is gone"))
	}
	l := runtime.Limits{CPU: req.CPU, MemoryBytes: req.MemoryMiB << 20, PIDs: req.PIDs}
	if err := s.runtimes[sb.Runtime].Update(ctx, id, l); err != nil {
		return fail(err)
	}
	if req.DiskGiB != sb.DiskGiB {
		if _, err := s.layers.CreateWritable(id, req.DiskGiB<<30); err != nil {
			return fail(err)
		}
	}
	if len(req.Env) > 0 {
		if err := s.agentClient(sb.Socket).SetEnv(ctx, req.Env); err != nil {
			return fail(err)
		}
	}
	// The pooled sandbox ran under allow-all; what it opened that the new
	// policy forbids is cut.
	sb.Policy = policy
	if s.net != nil {
		if err := s.net.SetPolicy(ctx, sb.Slot, s.policyOf(sb)); err != nil {
			return fail(err)
		}
	}
	now := time.Now().UTC()
	sb.State, sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.PIDs = api.StateRunning, req.CPU, req.MemoryMiB, req.DiskGiB, req.PIDs
	sb.Template = req.Template // the pool's name, or a second name of its version
	sb.Env, sb.Labels, sb.CreatedAt, sb.StartedAt = req.Env, req.Labels, now, &now
	sb.TimeoutSec, sb.Ephemeral, sb.AutoDeleteSec, sb.ExpiresAt = req.TimeoutSec, req.Ephemeral, req.AutoDeleteSec, nil
	sb.AutoStopSec, sb.AutoArchiveSec, sb.AutoResume = req.AutoStopSec, req.AutoArchiveSec, req.AutoResume
	sb.CheckpointEverySec = req.CheckpointEverySec
	sb.Vaults = req.Vaults
	sb.Ports = portAccess(req.Ports)
	sb.Tenant = tenant.Of(ctx)
	s.touch(id)
	if req.TimeoutSec > 0 {
		exp := now.Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	if err := s.setState(ctx, &sb, statePooled); err != nil {
		return fail(err)
	}
	return s.view(sb), nil
}

func (s *Service) agentClient(sock string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

func notFound(id string) error { return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound) }
