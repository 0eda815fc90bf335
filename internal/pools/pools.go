// Package pools keeps sandboxes started ahead of demand, so that a create
// skips most of a cold start: warm pools of whole sandboxes per template
// version, handed out to a create that matches, and prestarted sandbox
// processes not yet bound to files, which a create the pools cannot serve,
// a fork child or a create from a snapshot takes. It decides how many of
// each to keep and which to hand out; the sandbox state machine makes,
// adopts and discards them through the narrow Sandboxes interface.
//
// Pooled and prestarted sandboxes are store rows in states the API never
// shows (lifecycle.Pooled, lifecycle.Prestarted), so that a crash can clean
// them up and their slots stay reserved. They are the running server's: Run
// discards them as it ends, and a start discards any a crash left.
package pools

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
)

// Sandboxes is what pools ask of the sandbox state machine.
type Sandboxes interface {
	// StartPooled starts a sandbox of version v, made under name, in state
	// lifecycle.Pooled, and returns its ID.
	StartPooled(ctx context.Context, name string, v store.Template) (string, error)
	// Prestart starts a sandbox process in state lifecycle.Prestarted.
	Prestart(ctx context.Context) (store.Sandbox, error)
	// DiscardIf discards sandbox id if it is still in state.
	DiscardIf(ctx context.Context, id, state string)
}

// Templates resolves the default template's name to its current version.
type Templates interface {
	Resolve(ctx context.Context, ref string) (name string, v store.Template, err error)
}

// Config configures a Service.
type Config struct {
	Store     store.Store
	Templates Templates
	Sandboxes Sandboxes
	// DefaultTemplate keeps WarmPool sandboxes of its current version;
	// other templates keep as many as their pool size says (LABEL
	// atoll.pool in their Dockerfile). 0 keeps none.
	DefaultTemplate string
	WarmPool        int
	// Prestart is how many sandbox processes to keep prestarted; 0 (also
	// for a default runtime that cannot prestart) keeps none.
	Prestart int
	// Node is the cluster node whose pooled sandboxes these are (the
	// rows it scans); "" on a single machine.
	Node string
	// Sizer, on a cluster node, sizes the pools from the cluster's demand
	// (demand.go): WarmPool is then the most the node keeps, and a
	// template's pool size a floor. nil keeps the fixed sizes.
	Sizer Sizer
	// BuiltIn is the built-in template's name, whose demand is counted
	// under the version ID "".
	BuiltIn string
	// Busy, if set, reports that the node is starting sandboxes for
	// creates: the pools wait to refill until it is not. A refill is a
	// sandbox start too, and in a burst the creates need the machine
	// more than the pools do.
	Busy   func() bool
	Logger *slog.Logger
}

// sizeEvery is how often a cluster node reads the demand its pools follow.
const sizeEvery = 2 * time.Second

// refillDelay is how long the pools wait after handing a sandbox out before
// they start a replacement.
const refillDelay = 100 * time.Millisecond

// Service keeps the pools.
type Service struct {
	store        store.Store
	node         string
	tmpls        Templates
	sandboxes    Sandboxes
	defaultTmpl  string
	poolSize     int
	prestartSize int
	log          *slog.Logger
	sizer        Sizer
	builtIn      string
	busy         func() bool
	rate         Rate
	wake         chan struct{}
	// held: the node is draining (Hold), so the pools stay empty.
	held atomic.Bool

	// sizeMu guards sized, the targets the demand last gave (with a
	// Sizer), and sizedAt, when they were asked for: they are asked for
	// again after sizeEvery.
	sizeMu  sync.Mutex
	sized   map[string]target
	sizedAt time.Time
	// sizedPrestart is how many processes the demand last said to fill
	// prestarted and keepPrestart how many to keep before discarding any
	// (with a Sizer; prestartSize is the most of both). Under sizeMu.
	sizedPrestart, keepPrestart int

	// startMu is held while the filler starts a pooled sandbox, and by
	// Drain (fillOne). It is taken before mu.
	startMu sync.Mutex

	// mu guards warm and prestarted. It is a leaf: nothing else is locked
	// while it is held, and no call leaves the package under it.
	mu sync.Mutex
	// warm holds the IDs of pooled sandboxes ready to hand out, by Key.
	warm map[string][]string
	// prestarted are the prestarted sandboxes ready to take, oldest first.
	prestarted []store.Sandbox
	// filling is the pool key whose sandbox the filler is starting, if
	// any; filled is closed (and replaced) each time it finishes one.
	filling string
	filled  chan struct{}
}

// New returns a Service; Run fills it.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{
		store: cfg.Store, node: cfg.Node, tmpls: cfg.Templates, sandboxes: cfg.Sandboxes, defaultTmpl: cfg.DefaultTemplate,
		poolSize: cfg.WarmPool, prestartSize: cfg.Prestart, log: cfg.Logger, sizer: cfg.Sizer, builtIn: cfg.BuiltIn, busy: cfg.Busy,
		wake: make(chan struct{}, 1), warm: map[string][]string{}, filled: make(chan struct{}),
	}
}

// Run keeps the pools filled until ctx ends, then discards what they hold.
func (p *Service) Run(ctx context.Context) {
	defer p.discardPrestarted(context.WithoutCancel(ctx))
	defer p.discardPools(context.WithoutCancel(ctx))
	for {
		retry := 5 * time.Second // after failures
		if p.isBusy() {
			retry = refillDelay
		} else {
			p.fillPool(ctx)
			p.fillPrestarted(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
			// Let the sandbox just handed out run its first commands
			// before refilling: starting a sandbox briefly blocks fork on
			// the whole host (cgroup migration).
			select {
			case <-ctx.Done():
				return
			case <-time.After(refillDelay):
			}
		case <-time.After(retry):
		}
	}
}

// isBusy reports whether the node is busy starting sandboxes for creates
// (Config.Busy).
func (p *Service) isBusy() bool { return p.busy != nil && p.busy() }

// Wake has Run refill the pools.
func (p *Service) Wake() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Pools are kept per template version (Key): when a name moves to a new
// version, the old version's pool is drained (Drain) and the new one's
// filled, while sandboxes already handed out keep their version.

// target is how many pooled sandboxes of a version to keep, and the name
// they are made under.
type target struct {
	name string
	v    store.Template
	n    int
	// keep, if more than n, is how many a pool following demand keeps
	// before it discards any: room fills no more, but takes none away
	// (demand.go).
	keep int
}

// wanted reports whether the pool keeps any sandbox.
func (t target) wanted() bool { return t.n > 0 || t.keep > 0 }

// Key is the pool of sandboxes of version v: its ID, or the name of the
// built-in template, which has no versions.
func Key(name string, v store.Template) string {
	if v.ID == "" {
		return name
	}
	return v.ID
}

// targets is how many pooled sandboxes each version should have: the
// default template's current one --warm-pool, and the current version of
// each name whose pool size says so; on a cluster node, what the demand
// says (demandTargets).
func (p *Service) targets(ctx context.Context) map[string]target {
	targets := map[string]target{}
	if p.held.Load() {
		return targets
	}
	if p.sizer != nil {
		p.sizeMu.Lock()
		defer p.sizeMu.Unlock()
		if now := time.Now(); now.Sub(p.sizedAt) >= sizeEvery {
			if t, pre, keep, ok := p.demandTargets(ctx); ok {
				p.sized, p.sizedPrestart, p.keepPrestart = t, pre, keep
			}
			p.sizedAt = now
		}
		return maps.Clone(p.sized)
	}
	if p.poolSize > 0 {
		if name, v, err := p.tmpls.Resolve(ctx, p.defaultTmpl); err == nil {
			targets[Key(name, v)] = target{name: name, v: v, n: p.poolSize}
		}
	}
	ts, err := p.store.ListTemplates(ctx)
	if err != nil {
		return targets
	}
	for _, t := range ts {
		if n := t.Current.Config.PoolSize; n > 0 {
			targets[Key(t.Name, t.Current)] = target{name: t.Name, v: t.Current, n: n}
		}
	}
	return targets
}

// fillPool tops each version's pool up to its size, one sandbox at a time;
// following demand, it first discards what a pool holds beyond its size.
func (p *Service) fillPool(ctx context.Context) {
	targets := p.targets(ctx)
	var surplus []string
	p.mu.Lock()
	for key, ids := range p.warm {
		// The fixed sizes of a single machine change only with a name's
		// version (Drain); demand moves them up and down.
		if n := max(targets[key].n, targets[key].keep); p.sizer != nil && len(ids) > n {
			surplus = append(surplus, ids[n:]...)
			p.warm[key] = ids[:n]
		}
	}
	p.mu.Unlock()
	for _, id := range surplus {
		p.sandboxes.DiscardIf(ctx, id, lifecycle.Pooled)
	}
	for key, tg := range targets {
		for ctx.Err() == nil && !p.isBusy() {
			started, err := p.fillOne(ctx, key, tg)
			if err != nil {
				p.log.Warn("filling warm pool", "template", tg.name, "err", err)
			}
			if !started {
				break
			}
		}
	}
}

// fillOne starts a pooled sandbox for pool key if it is short of its
// target and still wanted. It holds startMu throughout, so that a Drain
// after a name moved waits for a sandbox started under the old version
// and discards it, rather than leaving it to the filler after the Drain
// returned (and the old version held a moment longer than the caller
// saw).
func (p *Service) fillOne(ctx context.Context, key string, tg target) (bool, error) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	p.mu.Lock()
	short := len(p.warm[key]) < tg.n
	p.mu.Unlock()
	if !short || !p.targets(ctx)[key].wanted() {
		return false, nil
	}
	p.mu.Lock()
	p.filling = key
	p.mu.Unlock()
	id, err := p.sandboxes.StartPooled(ctx, tg.name, tg.v)
	p.mu.Lock()
	p.filling = ""
	if err == nil {
		p.warm[key] = append(p.warm[key], id)
	}
	close(p.filled)
	p.filled = make(chan struct{})
	p.mu.Unlock()
	return err == nil, err
}

// TakeWaiting is Take, except that when the pool of key is empty while
// the filler is starting a sandbox for it, it waits for that sandbox (at
// most wait): in a cluster, the store counts a pooled sandbox from the
// moment its row is written, before it is ready, and a placement may have
// reserved it already.
func (p *Service) TakeWaiting(ctx context.Context, key string, wait time.Duration) (string, bool) {
	deadline := time.After(wait)
	for {
		if id, ok := p.Take(key); ok {
			return id, true
		}
		p.mu.Lock()
		filling, filled := p.filling == key, p.filled
		p.mu.Unlock()
		if !filling {
			return "", false
		}
		select {
		case <-filled:
		case <-deadline:
			return "", false
		case <-ctx.Done():
			return "", false
		}
	}
}

// Drain discards the pooled sandboxes of versions no pool wants any more
// (their name moved to another version, or went), including any the filler
// is just finishing (it waits for that start); discarding them releases
// their versions.
func (p *Service) Drain(ctx context.Context) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	targets := p.targets(ctx)
	p.mu.Lock()
	for key := range p.warm {
		if !targets[key].wanted() {
			delete(p.warm, key)
		}
	}
	p.mu.Unlock()
	p.discardPooledWhere(ctx, func(sb store.Sandbox) bool {
		return !targets[Key(sb.Template, store.Template{ID: sb.TemplateVersion})].wanted()
	})
}

// discardPools discards every pooled sandbox, as the server stops: unlike
// the sandboxes handed out, nobody would come back for them.
func (p *Service) discardPools(ctx context.Context) {
	p.mu.Lock()
	clear(p.warm)
	p.mu.Unlock()
	p.discardPooledWhere(ctx, func(store.Sandbox) bool { return true })
}

// discardPooledWhere discards the pooled sandboxes for which drop is true.
func (p *Service) discardPooledWhere(ctx context.Context, drop func(store.Sandbox) bool) {
	sbs, err := p.store.ListNode(ctx, p.node)
	if err != nil {
		return
	}
	for _, sb := range sbs {
		if sb.State == lifecycle.Pooled && drop(sb) {
			p.sandboxes.DiscardIf(ctx, sb.ID, lifecycle.Pooled)
		}
	}
}

// Take hands out the ID of a pooled sandbox of pool key, if there is one,
// and has the pool refilled.
func (p *Service) Take(key string) (string, bool) {
	p.mu.Lock()
	if len(p.warm[key]) == 0 {
		p.mu.Unlock()
		return "", false
	}
	id := p.warm[key][0]
	p.warm[key] = p.warm[key][1:]
	p.mu.Unlock()
	p.Wake()
	return id, true
}

// Targets are the pools' sizes (--warm-pool) and how many processes the
// node keeps prestarted now, for the metrics.
func (p *Service) Targets() (pool, prestart int) {
	fill, _ := p.prestartTarget()
	return p.poolSize, fill
}

// prestartTarget is how many processes to fill prestarted, and how many
// to keep: --prestart, or on a cluster node what the demand last said
// (demand.go), which fillPool's round of targets has just read.
func (p *Service) prestartTarget() (fill, keep int) {
	if p.sizer == nil {
		return p.prestartSize, p.prestartSize
	}
	p.sizeMu.Lock()
	defer p.sizeMu.Unlock()
	return p.sizedPrestart, p.keepPrestart
}

// fillPrestarted tops the prestarted sandboxes up to their target, one at
// a time, and following demand, first discards the newest beyond what it
// keeps.
func (p *Service) fillPrestarted(ctx context.Context) {
	want, keep := p.prestartTarget()
	p.mu.Lock()
	var extra []store.Sandbox
	if n := len(p.prestarted); n > keep {
		extra = slices.Clone(p.prestarted[keep:])
		p.prestarted = p.prestarted[:keep]
	}
	p.mu.Unlock()
	for _, sb := range extra {
		p.sandboxes.DiscardIf(ctx, sb.ID, lifecycle.Prestarted)
	}
	for ctx.Err() == nil && !p.held.Load() && !p.isBusy() {
		p.mu.Lock()
		short := len(p.prestarted) < want
		p.mu.Unlock()
		if !short {
			return
		}
		sb, err := p.sandboxes.Prestart(ctx)
		if err != nil {
			p.log.Warn("prestarting a sandbox", "err", err)
			return
		}
		p.mu.Lock()
		p.prestarted = append(p.prestarted, sb)
		p.mu.Unlock()
	}
}

// TakePrestarted hands out prestarted sandboxes for sandboxes of runtimes,
// in order, as long as the oldest prestarted ones are of those runtimes:
// at most len(runtimes), maybe none.
func (p *Service) TakePrestarted(runtimes ...string) []store.Sandbox {
	p.mu.Lock()
	n := 0
	for n < len(runtimes) && n < len(p.prestarted) && p.prestarted[n].Runtime == runtimes[n] {
		n++
	}
	pre := append([]store.Sandbox(nil), p.prestarted[:n]...)
	p.prestarted = p.prestarted[n:]
	p.mu.Unlock()
	if n > 0 {
		p.Wake()
	}
	return pre
}

// Prestarted are the IDs of the prestarted sandboxes ready to hand out,
// oldest first. A prestarted row in the store can be one still starting.
func (p *Service) Prestarted() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, len(p.prestarted))
	for i, sb := range p.prestarted {
		ids[i] = sb.ID
	}
	return ids
}

// Pooled counts the pooled sandboxes ready to hand out, by template
// version ID ("" the built-in template), as a cluster node reports them
// (store.NodeStatus.Pooled).
func (p *Service) Pooled() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for key, ids := range p.warm {
		if !store.ValidVersionID(key) {
			key = "" // the built-in template's pool is kept by its name
		}
		n[key] += len(ids)
	}
	return n
}

// Hold empties the pools and keeps them empty (hold true), for a cluster
// node that is draining: its sandboxes move away, and new ones go to other
// nodes. Hold(false) fills them again.
func (p *Service) Hold(ctx context.Context, hold bool) {
	if p.held.Swap(hold) == hold {
		return
	}
	if !hold {
		p.Wake()
		return
	}
	p.Drain(ctx) // every pool's target is 0 now
	p.discardPrestarted(ctx)
}

// Forget empties the pools without discarding what they held, and returns
// the IDs of the sandboxes they held: for a node that lost its lease in a
// cluster, which must stop them without writing to the store.
func (p *Service) Forget() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, w := range p.warm {
		ids = append(ids, w...)
	}
	for _, sb := range p.prestarted {
		ids = append(ids, sb.ID)
	}
	clear(p.warm)
	p.prestarted = nil
	return ids
}

// discardPrestarted removes the prestarted sandboxes, whose processes end
// with the server anyway.
func (p *Service) discardPrestarted(ctx context.Context) {
	p.mu.Lock()
	pre := p.prestarted
	p.prestarted = nil
	p.mu.Unlock()
	for _, sb := range pre {
		p.sandboxes.DiscardIf(ctx, sb.ID, lifecycle.Prestarted)
	}
}
