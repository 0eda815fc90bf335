package control

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Quotas. The store enforces what a tenant's sandboxes hold, in the
// transaction that records or starts each (store.Tenants); this file
// serves the quotas (Tenants), limits the rate of each tenant's creates,
// and keeps a tenant already at its quota from spending a warm sandbox.

// Tenants serves the tenants' quotas and use (server.Tenants).
type Tenants struct{ s *Service }

// Tenants returns the service's view of the tenants.
func (s *Service) Tenants() *Tenants { return &Tenants{s} }

// List returns every tenant something names, by name.
func (ts *Tenants) List(ctx context.Context) ([]api.Tenant, error) {
	list, err := ts.s.store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Tenant, 0, len(list))
	for _, t := range list {
		out = append(out, tenantView(t))
	}
	return out, nil
}

// Get returns tenant name's quota and use.
func (ts *Tenants) Get(ctx context.Context, name string) (api.Tenant, error) {
	t, err := ts.s.store.Tenant(ctx, name)
	if err != nil {
		return api.Tenant{}, err
	}
	return tenantView(t), nil
}

// SetQuota replaces tenant name's quota. This node's rate limit takes the
// new rate at once; other nodes' within rateTTL.
func (ts *Tenants) SetQuota(ctx context.Context, name string, q api.TenantQuota) (api.Tenant, error) {
	sq := store.Quota{Sandboxes: q.MaxSandboxes, CPU: q.MaxCPU, MemoryMiB: q.MaxMemoryMiB, DiskGiB: q.MaxDiskGiB, CreatesPerSecond: q.CreatesPerSecond}
	if err := ts.s.store.SetQuota(ctx, name, sq); err != nil {
		return api.Tenant{}, err
	}
	ts.s.rates.forget(name)
	return ts.Get(ctx, name)
}

func tenantView(t store.Tenant) api.Tenant {
	return api.Tenant{
		Name: t.Name, Admin: tenant.IsAdmin(t.Name),
		Quota: api.TenantQuota{MaxSandboxes: t.Quota.Sandboxes, MaxCPU: t.Quota.CPU, MaxMemoryMiB: t.Quota.MemoryMiB,
			MaxDiskGiB: t.Quota.DiskGiB, CreatesPerSecond: t.Quota.CreatesPerSecond},
		Used: api.TenantUsage{Sandboxes: t.Used.Sandboxes, CPU: t.Used.CPU, MemoryMiB: t.Used.MemoryMiB, DiskGiB: t.Used.DiskGiB},
	}
}

// rateTTL is how long a node trusts the quota it read of a tenant before
// it reads it again: a changed creates_per_second reaches the other nodes
// of a cluster within it.
const rateTTL = 2 * time.Second

// rates limits each tenant's creates to its quota's creates_per_second, a
// token bucket per tenant holding at most a second's worth (at least one
// create). On a single machine the buckets are this process's; in a
// cluster they are the store's (shared), which every node takes from, so
// that a tenant spreading its creates over nodes gets its rate, not a
// multiple of it. It also keeps the quota it read, for admitWarm.
type rates struct {
	st     store.Store
	now    func() time.Time
	shared func(ctx context.Context, t string, n int, rate, burst float64) (time.Duration, error)

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	quota  store.Quota
	read   time.Time // when quota was read
	tokens float64
	at     time.Time // when tokens was counted
}

func newRates(st store.Store, shared func(ctx context.Context, t string, n int, rate, burst float64) (time.Duration, error)) *rates {
	return &rates{st: st, now: time.Now, shared: shared, buckets: map[string]*bucket{}}
}

// forget drops what is known of tenant t, to read its quota again.
func (r *rates) forget(t string) {
	r.mu.Lock()
	delete(r.buckets, t)
	r.mu.Unlock()
}

// quota is tenant t's quota as read within rateTTL.
func (r *rates) quota(ctx context.Context, t string) (store.Quota, error) {
	b, err := r.bucket(ctx, t)
	if err != nil {
		return store.Quota{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return b.quota, nil
}

func (r *rates) bucket(ctx context.Context, t string) (*bucket, error) {
	now := r.now()
	r.mu.Lock()
	b := r.buckets[t]
	r.mu.Unlock()
	if b != nil && now.Sub(b.read) < rateTTL {
		return b, nil
	}
	// Read outside the lock: a slow store holds back only this
	// tenant's creates.
	tn, err := r.st.Tenant(ctx, t)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.buckets[t]; cur != nil {
		b = cur
	} else {
		b = &bucket{tokens: burst(tn.Quota.CreatesPerSecond), at: now}
		r.buckets[t] = b
	}
	b.quota, b.read = tn.Quota, now
	return b, nil
}

// burst is the most creates a bucket of rate holds.
func burst(rate float64) float64 { return math.Max(1, rate) }

// take counts n creates of tenant t, or refuses them with a Busy quota
// error whose Retry-After is when the bucket has a create again. A bucket
// with a create left takes n all (it may run below zero, which later
// creates wait for): a fork of many is not refused for ever.
func (r *rates) take(ctx context.Context, t string, n int) error {
	b, err := r.bucket(ctx, t)
	if err != nil {
		return err
	}
	r.mu.Lock()
	rate := b.quota.CreatesPerSecond
	if rate <= 0 {
		r.mu.Unlock()
		return nil
	}
	if r.shared != nil {
		r.mu.Unlock()
		wait, err := r.shared(ctx, t, n, rate, burst(rate))
		if err != nil || wait == 0 {
			return err
		}
		return rateRefusal(t, rate, wait)
	}
	defer r.mu.Unlock()
	now := r.now()
	b.tokens = math.Min(burst(rate), b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return rateRefusal(t, rate, time.Duration((1-b.tokens)/rate*float64(time.Second)))
	}
	b.tokens -= float64(n)
	return nil
}

// rateRefusal is tenant t's create refused by its rate, to be sent again
// after wait.
func rateRefusal(t string, rate float64, wait time.Duration) error {
	qe := &errdefs.QuotaError{Tenant: t, Quota: store.QuotaCreates, Limit: rate}
	return &errdefs.Busy{Kind: qe, Msg: fmt.Sprintf("%v; retry after the Retry-After header's seconds", qe), After: wait}
}

// limitCreates counts n creates against the rate of ctx's tenant; the
// server's own creates (pools, builds) are not limited.
func (s *Service) limitCreates(ctx context.Context, n int) error {
	t, ok := tenant.FromContext(ctx)
	if !ok {
		return nil
	}
	return s.quotaHit(ctx, s.rates.take(ctx, t, n))
}

// admitWarm reports whether ctx's tenant may have a sandbox of req's
// resources by the use the store reports now: checked before a create
// takes a warm sandbox or a prestarted process, so that a tenant at its
// quota does not spend one (the store's refusal of the hand-out would
// discard it). The store's check when the sandbox is recorded stays the
// one that counts.
func (s *Service) admitWarm(ctx context.Context, req api.CreateSandboxRequest) error {
	t := tenant.Of(ctx)
	q, err := s.rates.quota(ctx, t)
	if err != nil || !q.Limits() {
		return err
	}
	tn, err := s.store.Tenant(ctx, t)
	if err != nil {
		return err
	}
	return s.quotaHit(ctx, tn.Quota.Admit(t, tn.Used, store.Resources{}, store.Charge(api.StateRunning, req.CPU, req.MemoryMiB, req.DiskGiB)))
}
