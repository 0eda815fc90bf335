package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/pools"
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
		sb, err := s.adoptPooled(ctx, id, req, policy, nil, "")
		if err == nil {
			return sb, true
		}
		s.log.Warn("handing out pooled sandbox", "sandbox", id, "err", err)
	}
}

// adoptPooled makes pooled sandbox id the sandbox req asks for; serving
// the warm placement recorded as row placed (if not ""), it takes its
// record placement, and the row goes.
func (s *Service) adoptPooled(ctx context.Context, id string, req api.CreateSandboxRequest, policy api.NetworkPolicy, placement json.RawMessage, placed string) (api.Sandbox, error) {
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
	sb.Placement = placement
	s.touch(id)
	if req.TimeoutSec > 0 {
		exp := now.Add(time.Duration(req.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
	if placed != "" {
		err = s.serveState(ctx, &sb, placed, statePooled)
	} else {
		err = s.setState(ctx, &sb, statePooled)
	}
	if err != nil {
		return fail(err)
	}
	return s.view(sb), nil
}

// newPools makes the pools of cfg; on a cluster node (demand not nil) they
// follow demand, within the room capacity leaves.
func (s *Service) newPools(cfg pools.Config, demand func(context.Context) (store.Demand, error), capacity store.Resources) *pools.Service {
	if demand != nil {
		cfg.Sizer = sizer{s, demand, capacity}
		cfg.Busy = s.admit.inFlight
	}
	return pools.New(cfg)
}

// sizer is a cluster node's pools.Sizer.
type sizer struct {
	s        *Service
	demand   func(context.Context) (store.Demand, error)
	capacity store.Resources
}

// Sizing reads the cluster's demand, and counts the sandboxes of the
// default size that fit in what the node's rows leave of its capacity,
// pooled ones counted as room: pools.Sizer.
func (z sizer) Sizing(ctx context.Context) (store.Demand, int, error) {
	d, err := z.demand(ctx)
	if err != nil {
		return d, 0, err
	}
	sbs, err := z.s.store.ListNode(ctx, z.s.name)
	if err != nil {
		return d, 0, err
	}
	left := z.capacity
	for _, sb := range sbs {
		if sb.State == statePooled {
			continue
		}
		compute, slot := store.Holds(sb.State)
		if compute {
			left.CPU -= sb.CPU
			left.MemoryMiB -= sb.MemoryMiB
		}
		if slot {
			left.DiskGiB -= sb.DiskGiB
			left.Sandboxes--
		}
	}
	def := z.s.defaults
	room := left.Sandboxes
	if def.CPU > 0 {
		room = min(room, int(left.CPU/def.CPU))
	}
	if def.MemoryMiB > 0 {
		room = min(room, int(left.MemoryMiB/def.MemoryMiB))
	}
	if def.DiskGiB > 0 {
		room = min(room, int(left.DiskGiB/def.DiskGiB))
	}
	return d, max(room, 0), nil
}

// In a cluster every create is placed (the scheduler ranks first the
// nodes with a warm sandbox of the template, and reserves one with the
// placement: store.Sandbox.Warm), and the node a warm placement lands on
// serves it from its pool (runWarm): the pooled sandbox becomes the
// sandbox asked for, under its own ID, and the placed row goes. A cold
// placement, or a warm one the pool cannot serve (its sandbox died),
// starts cold, as placed.

// runWarm serves placed sandbox sb (creating on this node, locked) from
// the warm pool if it has a sandbox of sb's template, and returns it.
func (s *Service) runWarm(ctx context.Context, sb store.Sandbox) (api.Sandbox, bool) {
	if sb.FromSnapshot != "" || sb.Runtime != s.defaults.Runtime {
		return api.Sandbox{}, false
	}
	key := pools.Key(sb.Template, store.Template{ID: sb.TemplateVersion})
	req := api.CreateSandboxRequest{
		Template: sb.Template, Runtime: sb.Runtime, CPU: sb.CPU, MemoryMiB: sb.MemoryMiB, DiskGiB: sb.DiskGiB, PIDs: sb.PIDs,
		Env: sb.Env, Labels: sb.Labels, TimeoutSec: sb.TimeoutSec, Ephemeral: sb.Ephemeral, AutoDeleteSec: sb.AutoDeleteSec,
		AutoStopSec: sb.AutoStopSec, AutoArchiveSec: sb.AutoArchiveSec, AutoResume: sb.AutoResume,
		CheckpointEverySec: sb.CheckpointEverySec, Ports: &sb.Ports,
	}
	// Only a placement that reserved a warm sandbox takes one: another
	// would take the one a warm placement on its way here counts on. Its
	// record goes to the sandbox that serves it, under that sandbox's ID.
	rec, err := s.store.Placement(ctx, sb.ID)
	var warm struct {
		Warm bool `json:"warm"`
	}
	if err != nil || rec == nil || json.Unmarshal(rec, &warm) != nil || !warm.Warm {
		return api.Sandbox{}, false
	}
	ctx = tenant.NewContext(ctx, sb.Tenant)
	for {
		// The store counted the one reserved from the moment its row was
		// written: it may be starting still.
		id, ok := s.pools.TakeWaiting(ctx, key, warmWait)
		if !ok {
			return api.Sandbox{}, false
		}
		out, err := s.adoptPooled(ctx, id, req, sb.Policy, recordFor(rec, id), sb.ID)
		if err != nil {
			s.log.Warn("serving a placement from the warm pool", "sandbox", id, "placed", sb.ID, "err", err)
			continue
		}
		s.admit.made() // the pool refills after the burst, not during it
		return out, true
	}
}

// warmWait bounds how long a warm placement waits for the pooled sandbox
// being started for it: about a cold start, which it would do instead.
const warmWait = time.Second

// recordFor is placement record rec as the record of sandbox id: the
// scheduler wrote it for the placed row.
func recordFor(rec json.RawMessage, id string) json.RawMessage {
	var m map[string]json.RawMessage
	if rec == nil || json.Unmarshal(rec, &m) != nil {
		return rec
	}
	m["sandbox"], _ = json.Marshal(id)
	out, err := json.Marshal(m)
	if err != nil {
		return rec
	}
	return out
}

func (s *Service) agentClient(sock string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

func notFound(id string) error { return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound) }
