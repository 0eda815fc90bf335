package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// SetVaultSchedule sets a vault's compaction schedule and summarizer.
func (s *Store) SetVaultSchedule(ctx context.Context, sc store.VaultSchedule) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO vault_schedules (vault_id, every, summarizer, next_at) VALUES (?,?,?,?)
		ON CONFLICT (vault_id) DO UPDATE SET every = excluded.every, summarizer = excluded.summarizer, next_at = excluded.next_at`,
		sc.VaultID, sc.Every, sc.Summarizer, unixNano(sc.Next))
	if err != nil && isForeignKey(err) {
		return fmt.Errorf("vault %.40q: %w", sc.VaultID, errdefs.ErrNotFound)
	}
	return err
}

// isForeignKey reports whether err is SQLite's refusal of a row whose
// parent is not there.
func isForeignKey(err error) bool {
	var e *msqlite.Error
	return errors.As(err, &e) && e.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

// VaultSchedule returns vault id's schedule, empty for none.
func (s *Store) VaultSchedule(ctx context.Context, id string) (store.VaultSchedule, error) {
	sc := store.VaultSchedule{VaultID: id}
	var next int64
	err := s.rdb.QueryRowContext(ctx, `SELECT every, summarizer, next_at FROM vault_schedules WHERE vault_id = ?`, id).Scan(&sc.Every, &sc.Summarizer, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return sc, nil
	}
	if err != nil {
		return sc, err
	}
	sc.Next = fromUnixNano(next)
	return sc, nil
}

// DueVaultSchedules returns the schedules due at now, earliest first.
func (s *Store) DueVaultSchedules(ctx context.Context, now time.Time, limit int) ([]store.VaultSchedule, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT c.vault_id, v.tenant, v.name, c.every, c.summarizer, c.next_at
		FROM vault_schedules c JOIN vaults v ON v.id = c.vault_id
		WHERE c.every <> '' AND c.next_at <= ? ORDER BY c.next_at, c.vault_id LIMIT ?`, unixNano(now), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.VaultSchedule
	for rows.Next() {
		var sc store.VaultSchedule
		var next int64
		if err := rows.Scan(&sc.VaultID, &sc.Tenant, &sc.Name, &sc.Every, &sc.Summarizer, &next); err != nil {
			return nil, err
		}
		sc.Next = fromUnixNano(next)
		out = append(out, sc)
	}
	return out, rows.Err()
}

// ClaimVaultSchedule moves a schedule's next run from was to next, if it
// is still was.
func (s *Store) ClaimVaultSchedule(ctx context.Context, id string, was, next time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE vault_schedules SET next_at = ? WHERE vault_id = ? AND next_at = ? AND every <> ''`,
		unixNano(next), id, unixNano(was))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// AddVaultEvent appends an event, and drops the vault's oldest beyond
// store.MaxVaultEvents.
func (s *Store) AddVaultEvent(ctx context.Context, e store.VaultEvent) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO vault_events (vault_id, at, kind, trigger, commit_id, error, detail) VALUES (?,?,?,?,?,?,?)`,
		e.VaultID, unixNano(e.At), e.Kind, e.Trigger, e.Commit, e.Error, e.Detail); err != nil {
		if isForeignKey(err) {
			return fmt.Errorf("vault %.40q: %w", e.VaultID, errdefs.ErrNotFound)
		}
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM vault_events WHERE vault_id = ? AND seq <= (
		SELECT seq FROM vault_events WHERE vault_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, e.VaultID, e.VaultID, store.MaxVaultEvents); err != nil {
		return err
	}
	return tx.Commit()
}

// VaultEvents returns a vault's newest events, newest first.
func (s *Store) VaultEvents(ctx context.Context, id string, limit int) ([]store.VaultEvent, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT at, kind, trigger, commit_id, error, detail FROM vault_events
		WHERE vault_id = ? ORDER BY seq DESC LIMIT ?`, id, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.VaultEvent
	for rows.Next() {
		e := store.VaultEvent{VaultID: id}
		var at int64
		if err := rows.Scan(&at, &e.Kind, &e.Trigger, &e.Commit, &e.Error, &e.Detail); err != nil {
			return nil, err
		}
		e.At = fromUnixNano(at)
		out = append(out, e)
	}
	return out, rows.Err()
}
