package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// eventLock is the advisory lock that orders the appends of events
// ("atolm" in ASCII, beside the migrations' "atoll"): a bigserial is
// handed out before its transaction commits, so without it a reader that
// has seen seq n could later see a smaller seq commit and would skip it.
const eventLock = 0x61746f6c6d

// newEventID is an event ID for events the store itself records (a
// fenced node's lost sandboxes), of events.NewID's shape.
func newEventID() string {
	var r [12]byte
	rand.Read(r[:])
	return "evt_" + hex.EncodeToString(r[:])
}

// AddAudit appends entries.
func (s *Store) AddAudit(ctx context.Context, entries []store.AuditEntry) error {
	for _, e := range entries {
		for _, v := range []string{e.Tenant, e.KeyID, e.Source, e.Action, e.Target, e.RequestID} {
			if !storable(v) {
				return fmt.Errorf("%w: audit entry: not UTF-8 text", errdefs.ErrInvalid)
			}
		}
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, e := range entries {
			b.Queue(`INSERT INTO audit (at, tenant, key_id, source, action, target, status, request_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)`,
				e.At, e.Tenant, e.KeyID, e.Source, e.Action, e.Target, e.Status, e.RequestID)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// Audit returns the entries f selects, newest first.
func (s *Store) Audit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error) {
	for _, v := range []string{f.Tenant, f.Target, f.Action} {
		if !storable(v) {
			return nil, nil
		}
	}
	var where []string
	var args []any
	for _, c := range []struct {
		cond string
		arg  any
		on   bool
	}{
		{"tenant = $%d", f.Tenant, f.Tenant != ""},
		{"target = $%d", f.Target, f.Target != ""},
		{"action = $%d", f.Action, f.Action != "" && !store.IsMethod(f.Action)},
		{"action LIKE $%d", f.Action + " %", store.IsMethod(f.Action)},
		{"at >= $%d", f.From, !f.From.IsZero()},
		{"at <= $%d", f.To, !f.To.IsZero()},
		{"seq < $%d", f.Before, f.Before != 0},
	} {
		if c.on {
			args = append(args, c.arg)
			where = append(where, fmt.Sprintf(c.cond, len(args)))
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
	var out []store.AuditEntry
	err := s.read(ctx, func(qr querier) error {
		out = nil
		rows, err := qr.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var e store.AuditEntry
			if err := rows.Scan(&e.Seq, &e.At, &e.Tenant, &e.KeyID, &e.Source, &e.Action, &e.Target, &e.Status, &e.RequestID); err != nil {
				return err
			}
			e.At = e.At.UTC()
			out = append(out, e)
		}
		return rows.Err()
	})
	return out, err
}

// AddEvents appends evs and queues their deliveries, in one transaction.
func (s *Store) AddEvents(ctx context.Context, evs []store.Event) ([]store.Event, error) {
	for _, e := range evs {
		for _, v := range []string{e.ID, e.Type, e.Tenant, e.Sandbox, e.State, e.Reason} {
			if !storable(v) {
				return nil, fmt.Errorf("%w: event: not UTF-8 text", errdefs.ErrInvalid)
			}
		}
	}
	out := make([]store.Event, len(evs))
	err := s.write(ctx, func(tx pgx.Tx) error {
		copy(out, evs)
		return appendEvents(ctx, tx, out)
	})
	if err != nil {
		return nil, fmt.Errorf("recording events: %w", err)
	}
	return out, nil
}

// appendEvents records evs (their Seq written into them) and queues their
// deliveries in tx, under the lock that orders appends.
func appendEvents(ctx context.Context, tx pgx.Tx, evs []store.Event) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, eventLock); err != nil {
		return err
	}
	hooks := map[string][]store.Webhook{}
	for i := range evs {
		e := &evs[i]
		e.Tenant, e.Queued = tenantOf(e.Tenant), 0
		if err := tx.QueryRow(ctx, `INSERT INTO events (id, at, type, tenant, sandbox, state, reason) VALUES ($1,$2,$3,$4,$5,$6,$7) RETURNING seq`,
			e.ID, e.At, e.Type, e.Tenant, e.Sandbox, e.State, e.Reason).Scan(&e.Seq); err != nil {
			return err
		}
		ws, ok := hooks[e.Tenant]
		if !ok {
			var err error
			if ws, err = webhooks(ctx, tx, `WHERE tenant = $1`, e.Tenant); err != nil {
				return err
			}
			hooks[e.Tenant] = ws
		}
		for _, w := range ws {
			if !w.Wants(e.Type) {
				continue
			}
			if _, err := tx.Exec(ctx, `INSERT INTO deliveries (webhook_id, event_seq, sandbox, state, next_at, created_at) VALUES ($1,$2,$3,$4,$5,$5)`,
				w.ID, e.Seq, e.Sandbox, store.DeliveryPending, e.At); err != nil {
				return err
			}
			e.Queued++
		}
	}
	return nil
}

// Events returns the events after seq after.
func (s *Store) Events(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	q := `SELECT seq, id, at, type, tenant, sandbox, state, reason FROM events WHERE seq > $1 ORDER BY seq`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	var out []store.Event
	err := s.read(ctx, func(qr querier) error {
		out = nil
		rows, err := qr.Query(ctx, q, after)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var e store.Event
			if err := rows.Scan(&e.Seq, &e.ID, &e.At, &e.Type, &e.Tenant, &e.Sandbox, &e.State, &e.Reason); err != nil {
				return err
			}
			e.At = e.At.UTC()
			out = append(out, e)
		}
		return rows.Err()
	})
	return out, err
}

// LastEventSeq is the highest seq recorded.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var n int64
	err := s.read(ctx, func(q querier) error {
		return q.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM events`).Scan(&n)
	})
	return n, err
}

// PruneJournal deletes what is older than before.
func (s *Store) PruneJournal(ctx context.Context, before time.Time) error {
	return s.writeAt(ctx, pgx.ReadCommitted, s.as, func(tx pgx.Tx) error {
		for _, q := range []string{
			`DELETE FROM audit WHERE at < $1`,
			`DELETE FROM deliveries WHERE state <> 'pending' AND done_at < $1`,
			`DELETE FROM events e WHERE at < $1 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq)`,
		} {
			if _, err := tx.Exec(ctx, q, before); err != nil {
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
	err := s.write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO webhooks (id, tenant, url, events, secret, created_at) VALUES ($1,$2,$3,$4,$5,$6)`,
			w.ID, tenantOf(w.Tenant), w.URL, store.JoinEvents(w.Events), w.Secret, w.CreatedAt)
		return err
	})
	if err != nil {
		return fmt.Errorf("webhook %s: %w", w.ID, err)
	}
	return nil
}

func webhooks(ctx context.Context, q querier, where string, args ...any) ([]store.Webhook, error) {
	rows, err := q.Query(ctx, `SELECT id, tenant, url, events, secret, created_at FROM webhooks `+where+` ORDER BY created_at, id COLLATE "C"`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Webhook
	for rows.Next() {
		var w store.Webhook
		var events string
		if err := rows.Scan(&w.ID, &w.Tenant, &w.URL, &events, &w.Secret, &w.CreatedAt); err != nil {
			return nil, err
		}
		w.Events, w.CreatedAt = store.SplitEvents(events), w.CreatedAt.UTC()
		out = append(out, w)
	}
	return out, rows.Err()
}

// Webhooks returns tenant t's webhooks, or every tenant's.
func (s *Store) Webhooks(ctx context.Context, t string) ([]store.Webhook, error) {
	if !storable(t) {
		return nil, nil
	}
	var out []store.Webhook
	err := s.read(ctx, func(q querier) error {
		var err error
		if t == "" {
			out, err = webhooks(ctx, q, ``)
		} else {
			out, err = webhooks(ctx, q, `WHERE tenant = $1`, t)
		}
		return err
	})
	return out, err
}

// GetWebhook returns one webhook.
func (s *Store) GetWebhook(ctx context.Context, id string) (store.Webhook, error) {
	var ws []store.Webhook
	if storable(id) {
		err := s.read(ctx, func(q querier) error {
			var err error
			ws, err = webhooks(ctx, q, `WHERE id = $1`, id)
			return err
		})
		if err != nil {
			return store.Webhook{}, err
		}
	}
	if len(ws) == 0 {
		return store.Webhook{}, fmt.Errorf("webhook %.40q: %w", id, errdefs.ErrNotFound)
	}
	return ws[0], nil
}

// DeleteWebhook removes a webhook and (by its foreign key) its
// deliveries.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	if !storable(id) {
		return fmt.Errorf("webhook %.40q: %w", id, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM webhooks WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("webhook %.40q: %w", id, errdefs.ErrNotFound)
		}
		return nil
	})
}

func deliveries(ctx context.Context, q querier, where string, args ...any) ([]store.Delivery, error) {
	rows, err := q.Query(ctx, `SELECT d.seq, d.webhook_id, d.state, d.attempts, d.next_at, d.last_status, d.last_error, d.created_at, d.done_at,
		e.seq, e.id, e.at, e.type, e.tenant, e.sandbox, e.state, e.reason
		FROM deliveries d JOIN events e ON e.seq = d.event_seq `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Delivery
	for rows.Next() {
		var d store.Delivery
		var done *time.Time
		if err := rows.Scan(&d.Seq, &d.Webhook, &d.State, &d.Attempts, &d.NextAt, &d.LastStatus, &d.LastError, &d.CreatedAt, &done,
			&d.Event.Seq, &d.Event.ID, &d.Event.At, &d.Event.Type, &d.Event.Tenant, &d.Event.Sandbox, &d.Event.State, &d.Event.Reason); err != nil {
			return nil, err
		}
		d.NextAt, d.CreatedAt, d.Event.At = d.NextAt.UTC(), d.CreatedAt.UTC(), d.Event.At.UTC()
		if done != nil {
			d.DoneAt = done.UTC()
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// ClaimDeliveries takes the deliveries due, the head of each webhook's
// queue per sandbox. Read committed with SKIP LOCKED, so that nodes
// claiming at once take different deliveries rather than fail each
// other: a head another node is claiming is locked and skipped, and the
// delivery behind it is not a head while that one is pending, so a
// sandbox's deliveries still go one at a time, in order.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]store.Delivery, error) {
	var out []store.Delivery
	err := s.writeAt(ctx, pgx.ReadCommitted, s.as, func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `UPDATE deliveries SET attempts = attempts + 1, next_at = $3 WHERE seq IN (
			SELECT d.seq FROM deliveries d WHERE d.state = 'pending' AND d.next_at <= $1
			AND NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.webhook_id = d.webhook_id AND o.sandbox = d.sandbox
				AND o.state = 'pending' AND o.seq < d.seq)
			ORDER BY d.seq LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING seq`, now, limit, now.Add(hold))
		if err != nil {
			return err
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(seqs) == 0 {
			return err
		}
		out, err = deliveries(ctx, tx, `WHERE d.seq = ANY($1) ORDER BY d.seq`, seqs)
		return err
	})
	return out, err
}

// FinishDelivery records the outcome of an attempt.
func (s *Store) FinishDelivery(ctx context.Context, d store.Delivery) error {
	if !storable(d.LastError) {
		d.LastError = strings.ToValidUTF8(strings.ReplaceAll(d.LastError, "\x00", ""), "?")
	}
	var done *time.Time
	if !d.DoneAt.IsZero() {
		done = &d.DoneAt
	}
	return s.writeAt(ctx, pgx.ReadCommitted, s.as, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE deliveries SET state = $1, next_at = $2, last_status = $3, last_error = $4, done_at = $5 WHERE seq = $6`,
			d.State, d.NextAt, d.LastStatus, d.LastError, done, d.Seq)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("delivery %d: %w", d.Seq, errdefs.ErrNotFound)
		}
		return nil
	})
}

// Deliveries returns webhook id's deliveries, newest first.
func (s *Store) Deliveries(ctx context.Context, id string, limit int) ([]store.Delivery, error) {
	if !storable(id) {
		return nil, nil
	}
	q := `WHERE d.webhook_id = $1 ORDER BY d.seq DESC`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	var out []store.Delivery
	err := s.read(ctx, func(qr querier) error {
		var err error
		out, err = deliveries(ctx, qr, q, id)
		return err
	})
	return out, err
}
