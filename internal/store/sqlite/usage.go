package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// usageSchema is the usage tables (store.Usage), made by migrate after
// every older step: the rows, one per sandbox and interval, and each
// metered sandbox's tenant, template and labels, which outlive it.
const usageSchema = `
CREATE TABLE IF NOT EXISTS usage (
	sandbox_id TEXT NOT NULL,
	start INTEGER NOT NULL,
	node TEXT NOT NULL,
	seconds INTEGER NOT NULL,
	cpu_us INTEGER NOT NULL,
	mem_byte_s INTEGER NOT NULL,
	disk_byte_s INTEGER NOT NULL,
	snapshot_byte_s INTEGER NOT NULL,
	archive_byte_s INTEGER NOT NULL,
	net_in INTEGER NOT NULL,
	net_out INTEGER NOT NULL,
	running_ms INTEGER NOT NULL,
	paused_ms INTEGER NOT NULL,
	suspended_ms INTEGER NOT NULL,
	stopped_ms INTEGER NOT NULL,
	archived_ms INTEGER NOT NULL,
	cpu_counter INTEGER NOT NULL,
	net_in_counter INTEGER NOT NULL,
	net_out_counter INTEGER NOT NULL,
	instance INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, start)
);
CREATE INDEX IF NOT EXISTS usage_start ON usage(start);
CREATE TABLE IF NOT EXISTS usage_sandboxes (
	sandbox_id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL,
	template TEXT NOT NULL,
	labels TEXT NOT NULL,
	node TEXT NOT NULL,
	last_start INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_sandboxes_tenant ON usage_sandboxes(tenant);
CREATE INDEX IF NOT EXISTS usage_sandboxes_node ON usage_sandboxes(node);
`

// PutUsage records rows in one transaction of the group commit.
func (s *Store) PutUsage(ctx context.Context, rows []store.UsageRow) error {
	if len(rows) == 0 {
		return nil
	}
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for i := range rows {
			r := &rows[i]
			labels, _ := json.Marshal(orEmpty(r.Labels))
			if _, err := tx.ExecContext(ctx, `INSERT INTO usage (`+store.UsageColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
				ON CONFLICT (sandbox_id, start) DO NOTHING`, r.UsageValues()...); err != nil {
				return fmt.Errorf("recording usage of %s: %w", r.Sandbox, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO usage_sandboxes (sandbox_id, tenant, template, labels, node, last_start) VALUES (?,?,?,?,?,?)
				ON CONFLICT (sandbox_id) DO UPDATE SET tenant = excluded.tenant, template = excluded.template, labels = excluded.labels,
					node = excluded.node, last_start = excluded.last_start WHERE excluded.last_start >= usage_sandboxes.last_start`,
				r.Sandbox, tenantOf(r.Tenant), r.Template, string(labels), r.Node, r.Start.Unix()); err != nil {
				return fmt.Errorf("recording usage of %s: %w", r.Sandbox, err)
			}
		}
		return nil
	})
}

// LastUsage returns the newest row of each sandbox node metered last.
func (s *Store) LastUsage(ctx context.Context, node string) (map[string]store.UsageRow, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+store.UsageColumnsOf("r.")+`, m.tenant, m.template, m.labels
		FROM usage_sandboxes m JOIN usage r ON r.sandbox_id = m.sandbox_id AND r.start = m.last_start WHERE m.node = ?`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]store.UsageRow{}
	for rows.Next() {
		var r store.UsageRow
		var start int64
		var labels string
		if err := rows.Scan(append(r.UsageDest(&start), &r.Tenant, &r.Template, &labels)...); err != nil {
			return nil, err
		}
		if err := finishUsage(&r, start, labels); err != nil {
			return nil, err
		}
		out[r.Sandbox] = r
	}
	return out, rows.Err()
}

// QueryUsage sums rows by sandbox and bucket.
func (s *Store) QueryUsage(ctx context.Context, q store.UsageQuery) ([]store.UsageRow, error) {
	step := int64(q.Step / time.Second)
	if step <= 0 || q.Step%time.Second != 0 {
		return nil, fmt.Errorf("%w: usage step %s is not a whole number of seconds", errdefs.ErrInvalid, q.Step)
	}
	args := []any{step, q.From.Unix(), q.To.Unix()}
	where := `r.start >= ? AND r.start < ?`
	if q.Tenant != "" {
		where += ` AND m.tenant = ?`
		args = append(args, tenantOf(q.Tenant))
	}
	args = append(args, step)
	rows, err := s.rdb.QueryContext(ctx, `SELECT r.sandbox_id, r.start - r.start % ? AS bucket, `+store.UsageSums+`, m.tenant, m.template, m.labels
		FROM usage r JOIN usage_sandboxes m ON m.sandbox_id = r.sandbox_id
		WHERE `+where+` GROUP BY r.sandbox_id, r.start - r.start % ?, m.tenant, m.template, m.labels ORDER BY bucket, r.sandbox_id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.UsageRow
	for rows.Next() {
		var r store.UsageRow
		var start int64
		var labels string
		if err := rows.Scan(append(r.UsageSumDest(&start), &r.Tenant, &r.Template, &labels)...); err != nil {
			return nil, err
		}
		if err := finishUsage(&r, start, labels); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
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
