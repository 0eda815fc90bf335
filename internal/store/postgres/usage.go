package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// PutUsage records rows in one transaction. It runs at READ COMMITTED:
// each node writes only its own sandboxes' rows, and an insert that meets
// an existing row does nothing, so nothing a serializable transaction
// would add is at stake, and the nodes' ticks never refuse each other.
func (s *Store) PutUsage(ctx context.Context, rows []store.UsageRow) error {
	if len(rows) == 0 {
		return nil
	}
	for _, r := range rows {
		if !storable(r.Sandbox) || !storable(r.Tenant) || !storable(r.Template) || !storable(r.Node) {
			return fmt.Errorf("usage of %.40q: %w: not UTF-8 text", r.Sandbox, errdefs.ErrInvalid)
		}
	}
	return s.writeAt(ctx, pgx.ReadCommitted, s.as, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for i := range rows {
			r := &rows[i]
			labels, _ := json.Marshal(orEmpty(r.Labels))
			b.Queue(`INSERT INTO usage (`+store.UsageColumns+`) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20)
				ON CONFLICT (sandbox_id, start) DO NOTHING`, r.UsageValues()...)
			b.Queue(`INSERT INTO usage_sandboxes (sandbox_id, tenant, template, labels, node, last_start) VALUES ($1,$2,$3,$4,$5,$6)
				ON CONFLICT (sandbox_id) DO UPDATE SET tenant = excluded.tenant, template = excluded.template, labels = excluded.labels,
					node = excluded.node, last_start = excluded.last_start WHERE excluded.last_start >= usage_sandboxes.last_start`,
				r.Sandbox, tenantOf(r.Tenant), r.Template, string(labels), r.Node, r.Start.Unix())
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// LastUsage returns the newest row of each sandbox node metered last.
func (s *Store) LastUsage(ctx context.Context, node string) (map[string]store.UsageRow, error) {
	out := map[string]store.UsageRow{}
	if !storable(node) {
		return out, nil
	}
	err := s.read(ctx, func(q querier) error {
		clear(out)
		rows, err := q.Query(ctx, `SELECT `+store.UsageColumnsOf("r.")+`, m.tenant, m.template, m.labels
			FROM usage_sandboxes m JOIN usage r ON r.sandbox_id = m.sandbox_id AND r.start = m.last_start WHERE m.node = $1`, node)
		if err != nil {
			return err
		}
		return scanUsage(rows, (*store.UsageRow).UsageDest, func(r store.UsageRow) { out[r.Sandbox] = r })
	})
	return out, err
}

// QueryUsage sums rows by sandbox and bucket.
func (s *Store) QueryUsage(ctx context.Context, q store.UsageQuery) ([]store.UsageRow, error) {
	step := int64(q.Step / time.Second)
	if step <= 0 || q.Step%time.Second != 0 {
		return nil, fmt.Errorf("%w: usage step %s is not a whole number of seconds", errdefs.ErrInvalid, q.Step)
	}
	if !storable(q.Tenant) {
		return nil, nil
	}
	args := []any{step, q.From.Unix(), q.To.Unix()}
	where := `r.start >= $2 AND r.start < $3`
	if q.Tenant != "" {
		where += ` AND m.tenant = $4`
		args = append(args, tenantOf(q.Tenant))
	}
	sums := `SUM(r.seconds)::bigint, SUM(r.cpu_us)::bigint, SUM(r.mem_byte_s)::bigint, SUM(r.disk_byte_s)::bigint,
		SUM(r.snapshot_byte_s)::bigint, SUM(r.archive_byte_s)::bigint, SUM(r.net_in)::bigint, SUM(r.net_out)::bigint,
		SUM(r.running_ms)::bigint, SUM(r.paused_ms)::bigint, SUM(r.suspended_ms)::bigint, SUM(r.stopped_ms)::bigint, SUM(r.archived_ms)::bigint`
	var out []store.UsageRow
	err := s.read(ctx, func(qr querier) error {
		out = nil
		rows, err := qr.Query(ctx, `SELECT r.sandbox_id, r.start - r.start % $1 AS bucket, `+sums+`, m.tenant, m.template, m.labels
			FROM usage r JOIN usage_sandboxes m ON m.sandbox_id = r.sandbox_id
			WHERE `+where+` GROUP BY r.sandbox_id, bucket, m.tenant, m.template, m.labels ORDER BY bucket, r.sandbox_id COLLATE "C"`, args...)
		if err != nil {
			return err
		}
		return scanUsage(rows, (*store.UsageRow).UsageSumDest, func(r store.UsageRow) { out = append(out, r) })
	})
	return out, err
}

// scanUsage reads rows of usage columns (as dest lists them) followed by
// the sandbox's tenant, template and labels, handing each row to add.
func scanUsage(rows pgx.Rows, dest func(*store.UsageRow, *int64) []any, add func(store.UsageRow)) error {
	defer rows.Close()
	for rows.Next() {
		var r store.UsageRow
		var start int64
		var labels string
		if err := rows.Scan(append(dest(&r, &start), &r.Tenant, &r.Template, &labels)...); err != nil {
			return err
		}
		if err := finishUsage(&r, start, labels); err != nil {
			return err
		}
		add(r)
	}
	return rows.Err()
}

func finishUsage(r *store.UsageRow, start int64, labels string) error {
	r.Start = time.Unix(start, 0).UTC()
	if err := json.Unmarshal([]byte(labels), &r.Labels); err != nil {
		return err
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	return nil
}
