package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Quotas (store.Tenants), enforced across the nodes of a cluster.
//
// Every write that may grow what a tenant with limits holds first updates
// the tenant's row (its charged count), then sums what the tenant's
// sandboxes hold, in the same transaction. The update orders those writes
// per tenant whatever their isolation: a read-committed one (Place, most
// of UpdateAll's) waits for the row, and its sum, a later statement, sees
// what the writer before it committed; a serializable one (Create, an
// update that changes a version or node) whose snapshot predates a
// concurrent writer's commit fails to update the row (a serialization
// failure, retried from the start, with a new snapshot). Two writes can
// therefore not both count the use without the other's sandbox: concurrent
// creates on any nodes never overshoot. A tenant without limits has no
// row to update (or one without limits, which is not updated), and its
// writes pay nothing.

// limited is the condition on a tenants row that it limits what sandboxes
// hold (store.Quota.Limits).
const limited = `(max_sandboxes > 0 OR max_cpu > 0 OR max_memory_mib > 0 OR max_disk_gib > 0)`

// SetQuota records tenant t's quota.
func (s *Store) SetQuota(ctx context.Context, t string, q store.Quota) error {
	if !tenant.Valid(t) {
		return fmt.Errorf("%w: %.64q is not a tenant name", errdefs.ErrInvalid, t)
	}
	if err := q.Check(); err != nil {
		return err
	}
	return s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO tenants (name, max_sandboxes, max_cpu, max_memory_mib, max_disk_gib, creates_per_second)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET max_sandboxes = excluded.max_sandboxes,
			max_cpu = excluded.max_cpu, max_memory_mib = excluded.max_memory_mib, max_disk_gib = excluded.max_disk_gib,
			creates_per_second = excluded.creates_per_second`,
			t, q.Sandboxes, q.CPU, q.MemoryMiB, q.DiskGiB, q.CreatesPerSecond)
		return err
	})
}

// Tenant returns tenant t's quota and use.
func (s *Store) Tenant(ctx context.Context, t string) (store.Tenant, error) {
	out := store.Tenant{Name: t}
	if !storable(t) {
		return out, nil
	}
	err := s.read(ctx, func(q querier) error {
		var err error
		if out.Quota, err = quotaOf(ctx, q, t); err != nil {
			return err
		}
		out.Used, err = usage(ctx, q, t)
		return err
	})
	return out, err
}

// Tenants returns every tenant something names, by name.
func (s *Store) Tenants(ctx context.Context) ([]store.Tenant, error) {
	var names []string
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT name FROM tenants UNION SELECT tenant FROM api_keys
			UNION SELECT tenant FROM sandboxes UNION SELECT tenant FROM snapshots ORDER BY 1`)
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
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

func quotaOf(ctx context.Context, q querier, t string) (store.Quota, error) {
	var qt store.Quota
	err := q.QueryRow(ctx, `SELECT max_sandboxes, max_cpu, max_memory_mib, max_disk_gib, creates_per_second
		FROM tenants WHERE name = $1`, t).Scan(&qt.Sandboxes, &qt.CPU, &qt.MemoryMiB, &qt.DiskGiB, &qt.CreatesPerSecond)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Quota{}, nil
	}
	return qt, err
}

// useQuery sums, by tenant and state, the sandboxes of the tenants $1.
const useQuery = `SELECT tenant, state, COUNT(*), COALESCE(SUM(cpu), 0), COALESCE(SUM(memory_mib), 0), COALESCE(SUM(disk_gib), 0)
	FROM sandboxes WHERE tenant = ANY($1) GROUP BY tenant, state`

// addUse adds a row of useQuery to used, by store.Charge.
func addUse(used map[string]store.Resources, t, state string, n int, cpu float64, mem, disk int64) {
	c := store.Charge(state, cpu, mem, disk)
	c.Sandboxes *= n
	used[t] = used[t].Plus(c)
}

// usage is what tenant t's sandboxes hold against its quota.
func usage(ctx context.Context, q querier, t string) (store.Resources, error) {
	rows, err := q.Query(ctx, useQuery, []string{t})
	if err != nil {
		return store.Resources{}, err
	}
	used := map[string]store.Resources{}
	var tn, state string
	var n int
	var cpu float64
	var mem, disk int64
	_, err = pgx.ForEachRow(rows, []any{&tn, &state, &n, &cpu, &mem, &disk}, func() error {
		addUse(used, tn, state, n, cpu, mem, disk)
		return nil
	})
	return used[t], err
}

// admit checks, in a serializable write's transaction, that sb (of
// sb.Tenant, which held had before the write) may hold what it will
// (store.Quota.Admit), updating the tenant's row first (see above).
func admit(ctx context.Context, tx pgx.Tx, sb *store.Sandbox, had store.Resources) error {
	want := store.ChargeOf(sb)
	if !store.Grows(had, want) {
		return nil
	}
	t := tenantOf(sb.Tenant)
	var q store.Quota
	err := tx.QueryRow(ctx, `UPDATE tenants SET charged = charged + 1 WHERE name = $1 AND `+limited+`
		RETURNING max_sandboxes, max_cpu, max_memory_mib, max_disk_gib`, t).Scan(&q.Sandboxes, &q.CPU, &q.MemoryMiB, &q.DiskGiB)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	used, err := usage(ctx, tx, t)
	if err != nil {
		return err
	}
	return q.Admit(t, used, had, want)
}

// TakeCreates counts n creates of tenant t against rate, in the tenant's
// row of create_buckets: the row's lock orders the takes of every node,
// and PostgreSQL's clock refills it, so that nodes whose clocks differ
// agree. A tenant's first take makes its row full.
func (s *Store) TakeCreates(ctx context.Context, t string, n int, rate, burst float64) (time.Duration, error) {
	if !tenant.Valid(t) || n < 0 || !(rate > 0) || math.IsInf(rate, 0) || !(burst >= 1) || math.IsInf(burst, 0) {
		return 0, fmt.Errorf("%w: a create rate is taken for a tenant, by a positive rate and a burst of one at least", errdefs.ErrInvalid)
	}
	var had float64
	err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO create_buckets (tenant, tokens, at) VALUES ($1, $2, clock_timestamp())
			ON CONFLICT (tenant) DO NOTHING`, t, burst); err != nil {
			return err
		}
		// The locked read waits for another take of the tenant and then
		// reads the row it left; the update takes from it at the time
		// the read refilled it to.
		return tx.QueryRow(ctx, `WITH cur AS (
				SELECT tenant, clock_timestamp() AS now,
					least($3::float8, tokens + extract(epoch FROM clock_timestamp() - at)::float8 * $4::float8) AS had
				FROM create_buckets WHERE tenant = $1 FOR UPDATE)
			UPDATE create_buckets b SET tokens = CASE WHEN cur.had >= 1 THEN cur.had - $2 ELSE cur.had END, at = cur.now
			FROM cur WHERE b.tenant = cur.tenant RETURNING cur.had`, t, n, burst, rate).Scan(&had)
	})
	if err != nil || had >= 1 {
		return 0, err
	}
	return time.Duration((1 - had) / rate * float64(time.Second)), nil
}
