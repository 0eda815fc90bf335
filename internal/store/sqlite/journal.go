package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// journalSchema is the journal's tables (store.Journal), made by migrate
// after every older step.
const journalSchema = `
CREATE TABLE IF NOT EXISTS audit (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	at INTEGER NOT NULL,
	tenant TEXT NOT NULL,
	key_id TEXT NOT NULL,
	source TEXT NOT NULL,
	action TEXT NOT NULL,
	target TEXT NOT NULL,
	status INTEGER NOT NULL,
	request_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_at ON audit(at);
CREATE INDEX IF NOT EXISTS audit_tenant ON audit(tenant, seq);
CREATE INDEX IF NOT EXISTS audit_target ON audit(target, seq);
CREATE TABLE IF NOT EXISTS events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	id TEXT NOT NULL UNIQUE,
	at INTEGER NOT NULL,
	type TEXT NOT NULL,
	tenant TEXT NOT NULL,
	sandbox TEXT NOT NULL,
	state TEXT NOT NULL,
	reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_at ON events(at);
CREATE TABLE IF NOT EXISTS webhooks (
	id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL,
	url TEXT NOT NULL,
	events TEXT NOT NULL,
	secret TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS webhooks_tenant ON webhooks(tenant);
CREATE TABLE IF NOT EXISTS deliveries (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	webhook_id TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
	event_seq INTEGER NOT NULL,
	sandbox TEXT NOT NULL,
	state TEXT NOT NULL,
	attempts INTEGER NOT NULL DEFAULT 0,
	next_at INTEGER NOT NULL,
	last_status INTEGER NOT NULL DEFAULT 0,
	last_error TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL,
	done_at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries(state, next_at);
CREATE INDEX IF NOT EXISTS deliveries_queue ON deliveries(webhook_id, sandbox, seq);
CREATE INDEX IF NOT EXISTS deliveries_event ON deliveries(event_seq);
`

// AddAudit appends entries.
func (s *Store) AddAudit(ctx context.Context, entries []store.AuditEntry) error {
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, e := range entries {
			if _, err := tx.ExecContext(ctx, `INSERT INTO audit (at, tenant, key_id, source, action, target, status, request_id) VALUES (?,?,?,?,?,?,?,?)`,
				unixNano(e.At), e.Tenant, e.KeyID, e.Source, e.Action, e.Target, e.Status, e.RequestID); err != nil {
				return fmt.Errorf("recording audit entry: %w", err)
			}
		}
		return nil
	})
}

// Audit returns the entries f selects, newest first.
func (s *Store) Audit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error) {
	var where []string
	var args []any
	for _, c := range []struct {
		cond string
		arg  any
		on   bool
	}{
		{"tenant = ?", f.Tenant, f.Tenant != ""},
		{"target = ?", f.Target, f.Target != ""},
		{"action = ?", f.Action, f.Action != "" && !store.IsMethod(f.Action)},
		{"action LIKE ?", f.Action + " %", store.IsMethod(f.Action)},
		{"at >= ?", unixNano(f.From), !f.From.IsZero()},
		{"at <= ?", unixNano(f.To), !f.To.IsZero()},
		{"seq < ?", f.Before, f.Before != 0},
	} {
		if c.on {
			where = append(where, c.cond)
			args = append(args, c.arg)
		}
	}
	q := `SELECT seq, at, tenant, key_id, source, action, target, status, request_id FROM audit`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY seq DESC`
	if f.Limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, f.Limit)
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.AuditEntry
	for rows.Next() {
		var e store.AuditEntry
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.Tenant, &e.KeyID, &e.Source, &e.Action, &e.Target, &e.Status, &e.RequestID); err != nil {
			return nil, err
		}
		e.At = fromUnixNano(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// AddEvents appends evs and queues their deliveries, in one transaction.
func (s *Store) AddEvents(ctx context.Context, evs []store.Event) ([]store.Event, error) {
	out := make([]store.Event, len(evs))
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		copy(out, evs)
		hooks := map[string][]store.Webhook{} // by tenant
		for i := range out {
			e := &out[i]
			e.Tenant, e.Queued = tenantOf(e.Tenant), 0
			res, err := tx.ExecContext(ctx, `INSERT INTO events (id, at, type, tenant, sandbox, state, reason) VALUES (?,?,?,?,?,?,?)`,
				e.ID, unixNano(e.At), e.Type, e.Tenant, e.Sandbox, e.State, e.Reason)
			if err != nil {
				return fmt.Errorf("recording event: %w", uniqueConflict(err, "event "+e.ID))
			}
			if e.Seq, err = res.LastInsertId(); err != nil {
				return err
			}
			ws, ok := hooks[e.Tenant]
			if !ok {
				if ws, err = webhooks(ctx, tx, `WHERE tenant = ?`, e.Tenant); err != nil {
					return err
				}
				hooks[e.Tenant] = ws
			}
			for _, w := range ws {
				if !w.Wants(e.Type) {
					continue
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO deliveries (webhook_id, event_seq, sandbox, state, next_at, created_at) VALUES (?,?,?,?,?,?)`,
					w.ID, e.Seq, e.Sandbox, store.DeliveryPending, unixNano(e.At), unixNano(e.At)); err != nil {
					return fmt.Errorf("queueing delivery: %w", err)
				}
				e.Queued++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

const eventColumns = `seq, id, at, type, tenant, sandbox, state, reason`

func scanEvent(sc interface{ Scan(...any) error }, e *store.Event, more ...any) error {
	var at int64
	if err := sc.Scan(append([]any{&e.Seq, &e.ID, &at, &e.Type, &e.Tenant, &e.Sandbox, &e.State, &e.Reason}, more...)...); err != nil {
		return err
	}
	e.At = fromUnixNano(at)
	return nil
}

// Events returns the events after seq after.
func (s *Store) Events(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	q := `SELECT ` + eventColumns + ` FROM events WHERE seq > ? ORDER BY seq`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := s.rdb.QueryContext(ctx, q, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Event
	for rows.Next() {
		var e store.Event
		if err := scanEvent(rows, &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// LastEventSeq is the highest seq recorded.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var n int64
	err := s.rdb.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM events`).Scan(&n)
	return n, err
}

// PruneJournal deletes what is older than before.
func (s *Store) PruneJournal(ctx context.Context, before time.Time) error {
	t := unixNano(before)
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, q := range []string{
			`DELETE FROM audit WHERE at < ?`,
			`DELETE FROM deliveries WHERE state != 'pending' AND done_at < ?`,
			`DELETE FROM events WHERE at < ? AND seq NOT IN (SELECT event_seq FROM deliveries)`,
		} {
			if _, err := tx.ExecContext(ctx, q, t); err != nil {
				return fmt.Errorf("pruning the journal: %w", err)
			}
		}
		return nil
	})
}

// AddWebhook records a webhook.
func (s *Store) AddWebhook(ctx context.Context, w store.Webhook) error {
	if err := w.Check(); err != nil {
		return err
	}
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO webhooks (id, tenant, url, events, secret, created_at) VALUES (?,?,?,?,?,?)`,
			w.ID, tenantOf(w.Tenant), w.URL, store.JoinEvents(w.Events), w.Secret, unixNano(w.CreatedAt))
		if err != nil {
			return fmt.Errorf("recording webhook: %w", uniqueConflict(err, "webhook "+w.ID))
		}
		return nil
	})
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func webhooks(ctx context.Context, q queryer, where string, args ...any) ([]store.Webhook, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, tenant, url, events, secret, created_at FROM webhooks `+where+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Webhook
	for rows.Next() {
		var w store.Webhook
		var events string
		var at int64
		if err := rows.Scan(&w.ID, &w.Tenant, &w.URL, &events, &w.Secret, &at); err != nil {
			return nil, err
		}
		w.Events, w.CreatedAt = store.SplitEvents(events), fromUnixNano(at)
		out = append(out, w)
	}
	return out, rows.Err()
}

// Webhooks returns tenant t's webhooks, or every tenant's.
func (s *Store) Webhooks(ctx context.Context, t string) ([]store.Webhook, error) {
	if t == "" {
		return webhooks(ctx, s.rdb, ``)
	}
	return webhooks(ctx, s.rdb, `WHERE tenant = ?`, t)
}

// GetWebhook returns one webhook.
func (s *Store) GetWebhook(ctx context.Context, id string) (store.Webhook, error) {
	ws, err := webhooks(ctx, s.rdb, `WHERE id = ?`, id)
	if err != nil {
		return store.Webhook{}, err
	}
	if len(ws) == 0 {
		return store.Webhook{}, fmt.Errorf("webhook %.40q: %w", id, errdefs.ErrNotFound)
	}
	return ws[0], nil
}

// DeleteWebhook removes a webhook and its deliveries.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM deliveries WHERE webhook_id = ?`, id); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("webhook %.40q: %w", id, errdefs.ErrNotFound)
		}
		return nil
	})
}

const deliveryColumns = `d.seq, d.webhook_id, d.state, d.attempts, d.next_at, d.last_status, d.last_error, d.created_at, d.done_at`

// deliveries reads deliveries with their events.
func deliveries(ctx context.Context, q queryer, where string, args ...any) ([]store.Delivery, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+deliveryColumns+`, e.seq, e.id, e.at, e.type, e.tenant, e.sandbox, e.state, e.reason
		FROM deliveries d JOIN events e ON e.seq = d.event_seq `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Delivery
	for rows.Next() {
		var d store.Delivery
		var next, created, done, at int64
		if err := rows.Scan(&d.Seq, &d.Webhook, &d.State, &d.Attempts, &next, &d.LastStatus, &d.LastError, &created, &done,
			&d.Event.Seq, &d.Event.ID, &at, &d.Event.Type, &d.Event.Tenant, &d.Event.Sandbox, &d.Event.State, &d.Event.Reason); err != nil {
			return nil, err
		}
		d.NextAt, d.CreatedAt, d.DoneAt, d.Event.At = fromUnixNano(next), fromUnixNano(created), fromUnixNano(done), fromUnixNano(at)
		out = append(out, d)
	}
	return out, rows.Err()
}

// ClaimDeliveries takes the deliveries due, the head of each webhook's
// queue per sandbox.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]store.Delivery, error) {
	// Nothing due is the common case (the webhook service looks after
	// every event recorded, with or without a webhook): a reader
	// connection says so without a turn of the one writer, which every
	// create and delete waits for. A delivery that becomes due just after
	// is claimed at the next look, as if this one had come a moment sooner.
	var due bool
	if err := s.rdb.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM deliveries WHERE state = 'pending' AND next_at <= ?)`,
		unixNano(now)).Scan(&due); err == nil && !due {
		return nil, nil
	}
	var out []store.Delivery
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, `SELECT d.seq FROM deliveries d WHERE d.state = 'pending' AND d.next_at <= ?
			AND NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.webhook_id = d.webhook_id AND o.sandbox = d.sandbox
				AND o.state = 'pending' AND o.seq < d.seq)
			ORDER BY d.seq LIMIT ?`, unixNano(now), limit)
		if err != nil {
			return err
		}
		var seqs []any
		for rows.Next() {
			var n int64
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, n)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(seqs) == 0 {
			return err
		}
		in := strings.TrimSuffix(strings.Repeat("?,", len(seqs)), ",")
		if _, err := tx.ExecContext(ctx, `UPDATE deliveries SET attempts = attempts + 1, next_at = ? WHERE seq IN (`+in+`)`,
			append([]any{unixNano(now.Add(hold))}, seqs...)...); err != nil {
			return err
		}
		out, err = deliveries(ctx, tx, `WHERE d.seq IN (`+in+`) ORDER BY d.seq`, seqs...)
		return err
	})
	return out, err
}

// FinishDelivery records the outcome of an attempt.
func (s *Store) FinishDelivery(ctx context.Context, d store.Delivery) error {
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE deliveries SET state = ?, next_at = ?, last_status = ?, last_error = ?, done_at = ? WHERE seq = ?`,
			d.State, unixNano(d.NextAt), d.LastStatus, d.LastError, unixNano(d.DoneAt), d.Seq)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("delivery %d: %w", d.Seq, errdefs.ErrNotFound)
		}
		return nil
	})
}

// Deliveries returns webhook id's deliveries, newest first.
func (s *Store) Deliveries(ctx context.Context, id string, limit int) ([]store.Delivery, error) {
	q := `WHERE d.webhook_id = ? ORDER BY d.seq DESC`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	out, err := deliveries(ctx, s.rdb, q, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return out, err
}
