package store

import (
	"context"
	"fmt"
	"math"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Tenants are the tenants' quotas, and what their sandboxes hold against
// them.
//
// A quota is enforced by the store, in the transaction that records a
// sandbox (Create, Place) or changes what it holds (Update, UpdateAll: a
// stopped sandbox started again, a suspended one resumed, a pooled one
// handed to a tenant): a write that would take the sandbox's tenant over
// a limit of its quota changes nothing and returns a *QuotaError
// (errdefs.ErrQuota). Concurrent writes never take a tenant over a limit
// together. A write that holds no more than before (a stop, a delete) is
// never refused, even for a tenant already over a quota lowered since.
type Tenants interface {
	// SetQuota records tenant t's quota; a zero field is no limit, and a
	// zero Quota none at all. A name that is not a tenant name
	// (tenant.Valid) is ErrInvalid, as is a negative or not finite limit.
	SetQuota(ctx context.Context, t string, q Quota) error
	// Tenant returns tenant t's quota and use; one nothing names has
	// neither (zero values), not ErrNotFound.
	Tenant(ctx context.Context, t string) (Tenant, error)
	// Tenants returns every tenant that has a key, a sandbox, a snapshot or
	// a quota, by name.
	Tenants(ctx context.Context) ([]Tenant, error)
}

// Quota is what a tenant's sandboxes may hold at once (counted by Charge),
// and how many sandboxes a second it may create (enforced by the API; a
// cluster's buckets are kept by Cluster.TakeCreates). A zero field is no
// limit.
type Quota struct {
	Sandboxes        int
	CPU              float64
	MemoryMiB        int64
	DiskGiB          int64
	CreatesPerSecond float64
}

// Limits reports whether q limits what sandboxes hold (not only the rate
// of creates): only then do writes need to count the tenant's use.
func (q Quota) Limits() bool {
	return q.Sandboxes > 0 || q.CPU > 0 || q.MemoryMiB > 0 || q.DiskGiB > 0
}

// Check returns ErrInvalid unless every limit of q is finite and not
// negative.
func (q Quota) Check() error {
	if q.Sandboxes < 0 || q.CPU < 0 || q.MemoryMiB < 0 || q.DiskGiB < 0 || q.CreatesPerSecond < 0 ||
		math.IsNaN(q.CPU) || math.IsInf(q.CPU, 0) || math.IsNaN(q.CreatesPerSecond) || math.IsInf(q.CreatesPerSecond, 0) {
		return fmt.Errorf("%w: quota limits must be numbers from 0 (no limit) up", errdefs.ErrInvalid)
	}
	return nil
}

// Tenant is a tenant's quota and what its sandboxes hold against it.
type Tenant struct {
	Name  string
	Quota Quota
	Used  Resources
}

// Charge is what a sandbox in state, of these resources, counts against
// its tenant's quota: what it holds on its node (Holds, the scheduler's
// count of a node's committed resources), so that a quota and a node's
// capacity count alike. Its CPU, memory and one of the tenant's sandboxes
// while it has processes or may have them soon (creating, starting,
// running, paused); its disk while its files are on a node (those states,
// and stopped, suspended, shelved). An archived or lost sandbox counts for
// nothing, nor does one started ahead of demand (StatePooled,
// StatePrestarted), which is no tenant's yet: taking it for a tenant is
// the change that counts.
func Charge(state string, cpu float64, memoryMiB, diskGiB int64) Resources {
	if state == StatePooled || state == StatePrestarted {
		return Resources{}
	}
	var r Resources
	compute, slot := Holds(state)
	if compute {
		r.CPU, r.MemoryMiB, r.Sandboxes = cpu, memoryMiB, 1
	}
	if slot {
		r.DiskGiB = diskGiB
	}
	return r
}

// ChargeOf is Charge of sb as it is.
func ChargeOf(sb *Sandbox) Resources { return Charge(sb.State, sb.CPU, sb.MemoryMiB, sb.DiskGiB) }

// Grows reports whether want holds more than had of anything.
func Grows(had, want Resources) bool {
	return want.Sandboxes > had.Sandboxes || want.CPU > had.CPU || want.MemoryMiB > had.MemoryMiB || want.DiskGiB > had.DiskGiB
}

// Plus is r with o added.
func (r Resources) Plus(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, MemoryMiB: r.MemoryMiB + o.MemoryMiB, DiskGiB: r.DiskGiB + o.DiskGiB, Sandboxes: r.Sandboxes + o.Sandboxes}
}

// Minus is r with o taken away.
func (r Resources) Minus(o Resources) Resources {
	return Resources{CPU: r.CPU - o.CPU, MemoryMiB: r.MemoryMiB - o.MemoryMiB, DiskGiB: r.DiskGiB - o.DiskGiB, Sandboxes: r.Sandboxes - o.Sandboxes}
}

// Admit checks one sandbox's change from holding had to holding want, for
// tenant t whose sandboxes hold used now (had included): every limit of q
// that the change grows into must still hold after it. A limit the change
// does not grow into is not checked, so that a tenant over a quota lowered
// since may still stop, pause or delete. The error is a *QuotaError.
func (q Quota) Admit(t string, used, had, want Resources) error {
	const eps = 1e-9 // CPU sums are floats
	for _, l := range []struct {
		name                   string
		limit, used, more, was float64
	}{
		{QuotaSandboxes, float64(q.Sandboxes), float64(used.Sandboxes), float64(want.Sandboxes), float64(had.Sandboxes)},
		{QuotaCPU, q.CPU, used.CPU, want.CPU, had.CPU},
		{QuotaMemory, float64(q.MemoryMiB), float64(used.MemoryMiB), float64(want.MemoryMiB), float64(had.MemoryMiB)},
		{QuotaDisk, float64(q.DiskGiB), float64(used.DiskGiB), float64(want.DiskGiB), float64(had.DiskGiB)},
	} {
		if l.limit <= 0 || l.more <= l.was {
			continue
		}
		if l.used-l.was+l.more > l.limit+eps {
			return &errdefs.QuotaError{Tenant: t, Quota: l.name, Limit: l.limit, Used: l.used, Requested: l.more - l.was}
		}
	}
	return nil
}

// The names of the quotas, as the API's fields and errors name them.
const (
	QuotaSandboxes = "max_sandboxes"
	QuotaCPU       = "max_cpu"
	QuotaMemory    = "max_memory_mib"
	QuotaDisk      = "max_disk_gib"
	QuotaCreates   = "creates_per_second"
)
