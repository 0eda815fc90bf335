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
// discards them (discardPools), and a start discards any a crash left.
const statePooled = store.StatePooled

// poolWeight is the CPU weight of a pooled sandbox (default 100): filling the
// pool must not slow the sandboxes being used.
const poolWeight = 5

// refillDelay is how long the pool waits after handing a sandbox out before it
// starts a replacement.
const refillDelay = 100 * time.Millisecond

// Pools are kept per template version (poolKey): when a name moves to a new
// version, the old version's pool is drained (drainPools) and the new one's
// filled, while sandboxes already handed out keep their version.

// poolTarget is how many pooled sandboxes of a version to keep, and the
// name they are made under.
type poolTarget struct {
	name string
	v    store.Template
	n    int
}

// poolKey is the pool of sandboxes of version v: its ID, or the name of the
// built-in template, which has no versions.
func poolKey(name string, v store.Template) string {
	if v.ID == "" {
		return name
	}
	return v.ID
}

// poolTargets is how many pooled sandboxes each version should have: the
// default template's current one --warm-pool, and the current version of
// each name whose pool size says so.
func (s *Service) poolTargets(ctx context.Context) map[string]poolTarget {
	targets := map[string]poolTarget{}
	if s.poolSize > 0 {
		if name, v, err := s.resolve(ctx, s.defaults.Template); err == nil {
			targets[poolKey(name, v)] = poolTarget{name, v, s.poolSize}
		}
	}
	ts, err := s.store.ListTemplates(ctx)
	if err != nil {
		return targets
	}
	for _, t := range ts {
		if n := t.Current.Config.PoolSize; n > 0 {
			targets[poolKey(t.Name, t.Current)] = poolTarget{t.Name, t.Current, n}
		}
	}
	return targets
}

// fillPool tops each version's pool up to its size, one sandbox at a time.
func (s *Service) fillPool(ctx context.Context) {
	for key, tg := range s.poolTargets(ctx) {
		for ctx.Err() == nil {
			s.poolMu.Lock()
			short := len(s.pool[key]) < tg.n
			s.poolMu.Unlock()
			if !short {
				break
			}
			id, err := s.createPooled(ctx, tg)
			if err != nil {
				s.log.Warn("filling warm pool", "template", tg.name, "err", err)
				break
			}
			if s.poolTargets(ctx)[key].n == 0 {
				// The name moved on while its sandbox started.
				s.drainPools(ctx)
				break
			}
			s.poolMu.Lock()
			s.pool[key] = append(s.pool[key], id)
			s.poolMu.Unlock()
		}
	}
}

// drainPools discards the pooled sandboxes of versions no pool wants any
// more (their name moved to another version, or went), including any the
// filler is just finishing; discarding them releases their versions.
func (s *Service) drainPools(ctx context.Context) {
	targets := s.poolTargets(ctx)
	s.poolMu.Lock()
	for key := range s.pool {
		if targets[key].n == 0 {
			delete(s.pool, key)
		}
	}
	s.poolMu.Unlock()
	sbs, err := s.store.List(ctx)
	if err != nil {
		return
	}
	for _, sb := range sbs {
		if sb.State != statePooled || targets[poolKey(sb.Template, store.Template{ID: sb.TemplateVersion})].n > 0 {
			continue
		}
		s.discardIf(ctx, sb.ID, statePooled)
	}
}

// discardPools discards every pooled sandbox, as the server stops: unlike
// the sandboxes handed out, nobody would come back for them.
func (s *Service) discardPools(ctx context.Context) {
	s.poolMu.Lock()
	clear(s.pool)
	s.poolMu.Unlock()
	sbs, err := s.store.List(ctx)
	if err != nil {
		return
	}
	for _, sb := range sbs {
		if sb.State == statePooled {
			s.discardIf(ctx, sb.ID, statePooled)
		}
	}
}

// discardIf discards sandbox id if it is still in state.
func (s *Service) discardIf(ctx context.Context, id, state string) {
	unlock := s.lock(id)
	defer unlock()
	if cur, err := s.store.Get(ctx, id); err == nil && cur.State == state {
		s.discard(ctx, cur)
	}
}

func (s *Service) createPooled(ctx context.Context, tg poolTarget) (string, error) {
	// Once begun, finish: a half-made sandbox is cleaned up only at restart.
	ctx = context.WithoutCancel(ctx)
	d := s.defaults
	tmpl, err := s.stack(tg.v)
	if err != nil {
		return "", err
	}
	sb := store.Sandbox{Sandbox: api.Sandbox{
		ID: newID(), State: statePooled, Template: tg.name, TemplateVersion: tg.v.ID, Runtime: d.Runtime,
		CPU: d.CPU, MemoryMiB: d.MemoryMiB, DiskGiB: d.DiskGiB, PIDs: d.PIDs, CreatedAt: time.Now().UTC(),
	}}
	unlock := s.lock(sb.ID)
	defer unlock()
	if err := s.store.Create(ctx, &sb); err != nil {
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
		s.poolMu.Lock()
		if len(s.pool[key]) == 0 {
			s.poolMu.Unlock()
			return api.Sandbox{}, false
		}
		id := s.pool[key][0]
		s.pool[key] = s.pool[key][1:]
		s.poolMu.Unlock()
		s.wakePool()
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
	sb.Ports = portAccess(req.Ports)
	sb.Tenant = tenant.Of(ctx)
	s.touch(id)
	if req.TimeoutSec > 0 {
		exp := now.Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	if err := s.store.Update(ctx, &sb, statePooled); err != nil {
		return fail(err)
	}
	return s.view(sb), nil
}

func (s *Service) wakePool() {
	select {
	case s.poolWake <- struct{}{}:
	default:
	}
}

func (s *Service) agentClient(sock string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// hidden reports whether sb is one the API must not show.
func hidden(sb store.Sandbox) bool {
	return sb.State == statePooled || sb.State == stateBuilding || sb.State == statePrestarted
}

func notFound(id string) error { return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound) }
