package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// PutSnapshot records a snapshot.
func (s *Store) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	err := s.write(ctx, func(tx pgx.Tx) error {
		if err := s.as.ownsSandbox(ctx, tx, sn.SandboxID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO snapshots (id, name, sandbox_id, template, template_version, state, tenant, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			sn.ID, sn.Name, sn.SandboxID, sn.Template, sn.TemplateVersion, sn.State, tenantOf(sn.Tenant), sn.CreatedAt)
		return err
	})
	if err != nil {
		return fmt.Errorf("snapshot %.40q: %w", sn.ID, err)
	}
	return nil
}

// SetSnapshotState moves snapshot id from state from to state to; if it is
// not in state from it changes nothing and returns errdefs.ErrConflict.
func (s *Store) SetSnapshotState(ctx context.Context, id, from, to string) error {
	if !storable(id) {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := s.as.ownsSnapshot(ctx, tx, id); err != nil {
			return err
		}
		var cur string
		err := tx.QueryRow(ctx, `SELECT state FROM snapshots WHERE id = $1 FOR UPDATE`, id).Scan(&cur)
		switch {
		case err == pgx.ErrNoRows:
			return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
		case err != nil:
			return err
		case cur != from:
			return fmt.Errorf("snapshot %s is not %s: %w", id, from, errdefs.ErrConflict)
		}
		_, err = tx.Exec(ctx, `UPDATE snapshots SET state = $2 WHERE id = $1`, id, to)
		return err
	})
}

// GetSnapshot returns one snapshot.
func (s *Store) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	if !storable(id) {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	sns, err := s.snapshots(ctx, `WHERE id = $1`, id)
	return store.Only(sns, err, "snapshot "+id)
}

// ListSnapshots returns the snapshots of sandboxID, or all if it is empty,
// by creation, then ID.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID string) ([]store.Snapshot, error) {
	switch {
	case sandboxID == "":
		return s.snapshots(ctx, `ORDER BY created_at, id`)
	case !storable(sandboxID):
		return nil, nil
	}
	return s.snapshots(ctx, `WHERE sandbox_id = $1 ORDER BY created_at, id`, sandboxID)
}

// DeleteSnapshot removes a snapshot's row.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if !storable(id) {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := s.as.ownsSnapshot(ctx, tx, id); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id)
		if err == nil && tag.RowsAffected() == 0 {
			return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
		}
		return err
	})
}

func (s *Store) snapshots(ctx context.Context, where string, a ...any) ([]store.Snapshot, error) {
	var out []store.Snapshot
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT id, name, sandbox_id, template, template_version, state, tenant, created_at
			FROM snapshots `+where, a...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Snapshot, error) {
			var sn store.Snapshot
			err := row.Scan(&sn.ID, &sn.Name, &sn.SandboxID, &sn.Template, &sn.TemplateVersion, &sn.State, &sn.Tenant, &sn.CreatedAt)
			sn.CreatedAt = sn.CreatedAt.UTC()
			return sn, err
		})
		return err
	})
	return out, err
}
