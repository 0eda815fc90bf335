package control

import (
	"context"
	goruntime "runtime"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/templates"
)

// The sandbox side of template builds: internal/templates asks for a
// scratch sandbox per RUN step through templates.Sandboxes, and for its
// warm pools to follow a template that moved.

var _ templates.Sandboxes = (*Service)(nil)

// Templates returns the template service, for the API.
func (s *Service) Templates() *templates.Service { return s.tmpls }

// StartScratch starts a build step's sandbox over tmpl, in a state the
// API never shows (so that it gets a uid range and a crash cleans it up),
// and holds its lock until it is discarded.
func (s *Service) StartScratch(ctx context.Context, tmpl layers.Template) (templates.Scratch, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	sb := store.Sandbox{Sandbox: api.Sandbox{
		ID: newID(), State: lifecycle.Building, Template: "", Runtime: s.defaults.Runtime,
		CPU: float64(goruntime.NumCPU()), MemoryMiB: 4096, DiskGiB: 64, PIDs: 4096, CreatedAt: time.Now().UTC(),
	}}
	unlock := s.lock(sb.ID)
	if err := s.record(ctx, &sb); err != nil {
		unlock()
		return nil, err
	}
	rec := sb // as recorded: discarded as such
	if err := s.startLocked(ctx, &sb, tmpl, lifecycle.Building, lifecycle.Building, 0); err != nil {
		s.discard(ctx, rec)
		unlock()
		return nil, err
	}
	return &scratch{s: s, sb: sb, rec: rec, unlock: unlock}, nil
}

type scratch struct {
	s      *Service
	sb     store.Sandbox
	rec    store.Sandbox
	unlock func()
}

func (c *scratch) ID() string           { return c.sb.ID }
func (c *scratch) Agent() *agent.Client { return c.s.agentClient(c.sb.Socket) }
func (c *scratch) Stop(ctx context.Context) error {
	return c.s.runtimes[c.sb.Runtime].Stop(ctx, c.sb.ID, instance(c.sb))
}
func (c *scratch) Discard(ctx context.Context) {
	c.s.discard(ctx, c.rec)
	c.unlock()
}

// DrainPools discards the pooled sandboxes of versions no pool wants.
func (s *Service) DrainPools(ctx context.Context) { s.pools.Drain(ctx) }

// Pooled counts the pooled sandboxes ready to hand out, by template
// version ID ("" the built-in), for a cluster node's heartbeat.
func (s *Service) Pooled() map[string]int { return s.pools.Pooled() }

// Demand is the creates a minute by template version this node placed
// lately, for the heartbeat (store.NodeStatus.Demand).
func (s *Service) Demand() map[string]float64 { return s.pools.Demand() }

// WakePools has the pools refilled.
func (s *Service) WakePools() { s.pools.Wake() }
