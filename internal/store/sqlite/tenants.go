package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Quotas (store.Tenants). The store has one writer (group.go), so the
// count of a tenant's use that admit makes inside a write's transaction
// sees every write before it, and none can come in between: concurrent
// creates never overshoot.

const tenantsSchema = `CREATE TABLE IF NOT EXISTS tenants (
	name TEXT PRIMARY KEY,
	max_sandboxes INTEGER NOT NULL DEFAULT 0,
	max_cpu REAL NOT NULL DEFAULT 0,
	max_memory_mib INTEGER NOT NULL DEFAULT 0,
	max_disk_gib INTEGER NOT NULL DEFAULT 0,
	creates_per_second REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes(tenant, state);`

// rowQuerier is what reads run on: the reading pool or a write's
// transaction.
type rowQuerier interface {
	querier
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SetQuota records tenant t's quota.
func (s *Store) SetQuota(ctx context.Context, t string, q store.Quota) error {
	if !tenant.Valid(t) {
		return fmt.Errorf("%w: %.64q is not a tenant name", errdefs.ErrInvalid, t)
	}
	if err := q.Check(); err != nil {
		return err
	}
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tenants (name, max_sandboxes, max_cpu, max_memory_mib, max_disk_gib, creates_per_second)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET max_sandboxes = excluded.max_sandboxes,
			max_cpu = excluded.max_cpu, max_memory_mib = excluded.max_memory_mib, max_disk_gib = excluded.max_disk_gib,
			creates_per_second = excluded.creates_per_second`,
			t, q.Sandboxes, q.CPU, q.MemoryMiB, q.DiskGiB, q.CreatesPerSecond)
		return err
	})
}

// Tenant returns tenant t's quota and use.
func (s *Store) Tenant(ctx context.Context, t string) (store.Tenant, error) {
	out := store.Tenant{Name: t}
	var err error
	if out.Quota, err = quotaOf(ctx, s.rdb, t); err != nil {
		return out, err
	}
	out.Used, err = usage(ctx, s.rdb, t)
	return out, err
}

// Tenants returns every tenant something names, by name.
func (s *Store) Tenants(ctx context.Context) ([]store.Tenant, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT name FROM tenants UNION SELECT tenant FROM api_keys
		UNION SELECT tenant FROM sandboxes UNION SELECT tenant FROM snapshots ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]store.Tenant, 0, len(names))
	for _, n := range names {
		t, err := s.Tenant(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// quotaOf is tenant t's quota; none is the zero Quota.
func quotaOf(ctx context.Context, q rowQuerier, t string) (store.Quota, error) {
	var qt store.Quota
	err := q.QueryRowContext(ctx, `SELECT max_sandboxes, max_cpu, max_memory_mib, max_disk_gib, creates_per_second
		FROM tenants WHERE name = ?`, t).Scan(&qt.Sandboxes, &qt.CPU, &qt.MemoryMiB, &qt.DiskGiB, &qt.CreatesPerSecond)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Quota{}, nil
	}
	return qt, err
}

// usage is what tenant t's sandboxes hold against its quota (store.Charge).
func usage(ctx context.Context, q querier, t string) (store.Resources, error) {
	rows, err := q.QueryContext(ctx, `SELECT state, COUNT(*), TOTAL(cpu), TOTAL(memory_mib), TOTAL(disk_gib)
		FROM sandboxes WHERE tenant = ? GROUP BY state`, t)
	if err != nil {
		return store.Resources{}, err
	}
	defer rows.Close()
	var used store.Resources
	for rows.Next() {
		var state string
		var n int
		var cpu, mem, disk float64
		if err := rows.Scan(&state, &n, &cpu, &mem, &disk); err != nil {
			return used, err
		}
		c := store.Charge(state, cpu, int64(mem), int64(disk))
		c.Sandboxes *= n
		used = used.Plus(c)
	}
	return used, rows.Err()
}

// admit checks, in a write's transaction, that sb (of sb.Tenant, which
// held had before the write) may hold what it will: store.Quota.Admit.
func admit(ctx context.Context, tx *sql.Tx, sb *store.Sandbox, had store.Resources) error {
	want := store.ChargeOf(sb)
	if !store.Grows(had, want) {
		return nil
	}
	t := tenantOf(sb.Tenant)
	q, err := quotaOf(ctx, tx, t)
	if err != nil || !q.Limits() {
		return err
	}
	used, err := usage(ctx, tx, t)
	if err != nil {
		return err
	}
	return q.Admit(t, used, had, want)
}
