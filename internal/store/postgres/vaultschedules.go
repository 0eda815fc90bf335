package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// nullTime is t as a column that is NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// SetVaultSchedule sets a vault's compaction schedule and summarizer.
func (s *Store) SetVaultSchedule(ctx context.Context, sc store.VaultSchedule) error {
	if !storable(sc.VaultID) || !storable(sc.Every) || !storable(sc.Summarizer) {
		return fmt.Errorf("%w: vault schedule: not UTF-8 text", errdefs.ErrInvalid)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := vaultExists(ctx, tx, sc.VaultID, false); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO vault_schedules (vault_id, every, summarizer, next_at) VALUES ($1,$2,$3,$4)
			ON CONFLICT (vault_id) DO UPDATE SET every = excluded.every, summarizer = excluded.summarizer, next_at = excluded.next_at`,
			sc.VaultID, sc.Every, sc.Summarizer, nullTime(sc.Next))
		return err
	})
}

// VaultSchedule returns vault id's schedule, empty for none.
func (s *Store) VaultSchedule(ctx context.Context, id string) (store.VaultSchedule, error) {
	sc := store.VaultSchedule{VaultID: id}
	if !storable(id) {
		return sc, nil
	}
	err := s.read(ctx, func(q querier) error {
		var next *time.Time
		err := q.QueryRow(ctx, `SELECT every, summarizer, next_at FROM vault_schedules WHERE vault_id = $1`, id).Scan(&sc.Every, &sc.Summarizer, &next)
		if err == pgx.ErrNoRows {
			return nil
		}
		if next != nil {
			sc.Next = next.UTC()
		}
		return err
	})
	return sc, err
}

// DueVaultSchedules returns the schedules due at now, earliest first.
func (s *Store) DueVaultSchedules(ctx context.Context, now time.Time, limit int) ([]store.VaultSchedule, error) {
	var out []store.VaultSchedule
	err := s.read(ctx, func(q querier) error {
		out = nil
		rows, err := q.Query(ctx, `SELECT c.vault_id, v.tenant, v.name, c.every, c.summarizer, c.next_at
			FROM vault_schedules c JOIN vaults v ON v.id = c.vault_id
			WHERE c.every <> '' AND c.next_at <= $1 ORDER BY c.next_at, c.vault_id COLLATE "C" LIMIT $2`, now, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sc store.VaultSchedule
			if err := rows.Scan(&sc.VaultID, &sc.Tenant, &sc.Name, &sc.Every, &sc.Summarizer, &sc.Next); err != nil {
				return err
			}
			sc.Next = sc.Next.UTC()
			out = append(out, sc)
		}
		return rows.Err()
	})
	return out, err
}

// ClaimVaultSchedule moves a schedule's next run from was to next, if it
// is still was: of the nodes that race for it, one does.
func (s *Store) ClaimVaultSchedule(ctx context.Context, id string, was, next time.Time) (bool, error) {
	if !storable(id) {
		return false, nil
	}
	var ok bool
	err := s.write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE vault_schedules SET next_at = $1 WHERE vault_id = $2 AND next_at = $3 AND every <> ''`, next, id, was)
		ok = err == nil && tag.RowsAffected() == 1
		return err
	})
	return ok, err
}

// AddVaultEvent appends an event, and drops the vault's oldest beyond
// store.MaxVaultEvents.
func (s *Store) AddVaultEvent(ctx context.Context, e store.VaultEvent) error {
	for _, f := range []string{e.VaultID, e.Kind, e.Trigger, e.Commit, e.Error, e.Detail} {
		if !storable(f) {
			return fmt.Errorf("%w: vault event: not UTF-8 text", errdefs.ErrInvalid)
		}
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := vaultExists(ctx, tx, e.VaultID, false); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO vault_events (vault_id, at, kind, trigger, commit_id, error, detail) VALUES ($1,$2,$3,$4,$5,$6,$7)`,
			e.VaultID, e.At, e.Kind, e.Trigger, e.Commit, e.Error, e.Detail); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM vault_events WHERE vault_id = $1 AND seq <= (
			SELECT seq FROM vault_events WHERE vault_id = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)`, e.VaultID, store.MaxVaultEvents)
		return err
	})
}

// VaultEvents returns a vault's newest events, newest first.
func (s *Store) VaultEvents(ctx context.Context, id string, limit int) ([]store.VaultEvent, error) {
	var out []store.VaultEvent
	if !storable(id) {
		return nil, nil
	}
	err := s.read(ctx, func(q querier) error {
		out = nil
		rows, err := q.Query(ctx, `SELECT at, kind, trigger, commit_id, error, detail FROM vault_events
			WHERE vault_id = $1 ORDER BY seq DESC LIMIT $2`, id, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			e := store.VaultEvent{VaultID: id}
			if err := rows.Scan(&e.At, &e.Kind, &e.Trigger, &e.Commit, &e.Error, &e.Detail); err != nil {
				return err
			}
			e.At = e.At.UTC()
			out = append(out, e)
		}
		return rows.Err()
	})
	return out, err
}
