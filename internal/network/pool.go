package network

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Pool keeps warm namespaces, each with its veth made and its sandbox end
// up, so that giving a sandbox its network is a rename, four netlink
// messages inside the namespace and one nftables batch. A warm entry has no
// address and its host end is down: it carries no traffic. Run refills the
// pool in the background; Get works without it, falling back to
// Manager.Attach when the pool is empty.
type Pool struct {
	m    *Manager
	size int
	kick chan struct{}

	mu sync.Mutex
	// warm entries ready for Get, oldest first.
	warm []*entry
}

// NewPool returns a pool that keeps size entries warm once Run runs.
func NewPool(m *Manager, size int) *Pool {
	return &Pool{m: m, size: size, kick: make(chan struct{}, 1)}
}

// Len is the number of warm entries.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.warm)
}

// Get gives slot its network, with egress policy pol: a warm entry if there
// is one, else a cold Attach.
func (p *Pool) Get(ctx context.Context, slot int, pol egress.Policy) (*Attachment, error) {
	if err := p.m.cfg.checkSlot(slot); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	var e *entry
	if n := len(p.warm); n > 0 {
		e, p.warm = p.warm[0], p.warm[1:]
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	if e == nil {
		return p.m.Attach(ctx, slot, pol)
	}
	start := time.Now()
	m := p.m
	m.mu.RLock()
	defer m.mu.RUnlock()
	defer m.disown(e.name)
	a, err := m.assign(e, slot, pol)
	if err != nil {
		return nil, err
	}
	m.log.Debug("network attached", "slot", slot, "op", "attach", "warm", true, "ms", msSince(start))
	return a, nil
}

// Run fills the pool and refills it as Get takes entries, until ctx ends;
// then it removes the warm entries and returns.
func (p *Pool) Run(ctx context.Context) error {
	defer p.drain()
	backoff := time.Duration(0)
	for {
		for p.Len() < p.size && ctx.Err() == nil {
			e, err := p.m.warmEntry()
			if err != nil {
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				p.m.log.Warn("warming network namespace", "op", "pool", "err", err)
				break
			}
			backoff = 0
			p.mu.Lock()
			p.warm = append(p.warm, e)
			p.mu.Unlock()
		}
		var retry <-chan time.Time
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.kick:
		case <-retry:
		}
	}
}

func (p *Pool) drain() {
	p.mu.Lock()
	warm := p.warm
	p.warm = nil
	p.mu.Unlock()
	for _, e := range warm {
		if err := p.m.destroyWarm(e); err != nil {
			p.m.log.Warn("removing warm network namespace", "op", "pool", "err", err)
		}
	}
}

// warmEntry makes an entry under a fresh warm name that Sweep leaves alone.
func (m *Manager) warmEntry() (*entry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for tries := 0; ; tries++ {
		m.warmMu.Lock()
		m.warmSeq = (m.warmSeq + 1) % maxSlots
		name := m.cfg.warmName(m.warmSeq)
		m.warm[name] = true
		m.warmMu.Unlock()
		e, err := m.create(name)
		if err == nil {
			return e, nil
		}
		m.disown(name)
		if !errors.Is(err, errdefs.ErrConflict) || tries > 10 {
			return nil, err
		}
	}
}

func (m *Manager) disown(name string) {
	m.warmMu.Lock()
	delete(m.warm, name)
	m.warmMu.Unlock()
}

func (m *Manager) destroyWarm(e *entry) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	defer m.disown(e.name)
	return m.destroy(e)
}
