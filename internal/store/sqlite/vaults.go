package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// vaultSchema is the vault tables (store.Vaults), made by migrate after
// every older step.
const vaultSchema = `
CREATE TABLE IF NOT EXISTS vaults (
	id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL,
	name TEXT NOT NULL,
	layout TEXT NOT NULL DEFAULT '',
	allow_rewrite INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	UNIQUE (tenant, name)
);
CREATE TABLE IF NOT EXISTS vault_refs (
	vault_id TEXT NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	name TEXT NOT NULL,
	oid TEXT NOT NULL,
	PRIMARY KEY (vault_id, name)
);
CREATE TABLE IF NOT EXISTS vault_packs (
	vault_id TEXT NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	seq INTEGER NOT NULL,
	name TEXT NOT NULL,
	PRIMARY KEY (vault_id, seq),
	UNIQUE (vault_id, name)
);
CREATE TABLE IF NOT EXISTS vault_schedules (
	vault_id TEXT PRIMARY KEY REFERENCES vaults(id) ON DELETE CASCADE,
	every TEXT NOT NULL DEFAULT '',
	summarizer TEXT NOT NULL DEFAULT '',
	next_at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS vault_schedules_due ON vault_schedules(next_at) WHERE every <> '';
CREATE TABLE IF NOT EXISTS vault_events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	vault_id TEXT NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	at INTEGER NOT NULL,
	kind TEXT NOT NULL,
	trigger TEXT NOT NULL DEFAULT '',
	commit_id TEXT NOT NULL DEFAULT '',
	error TEXT NOT NULL DEFAULT '',
	detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS vault_events_vault ON vault_events(vault_id, seq);
`

// CreateVault records a vault.
func (s *Store) CreateVault(ctx context.Context, v store.Vault) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO vaults (id, tenant, name, layout, allow_rewrite, created_at) VALUES (?,?,?,?,?,?)`,
		v.ID, tenantOf(v.Tenant), v.Name, v.Layout, v.AllowRewrite, unixNano(v.CreatedAt))
	if err != nil {
		return fmt.Errorf("recording vault: %w", uniqueConflict(err, "vault "+v.Name))
	}
	return nil
}

// GetVault returns tenant t's vault name.
func (s *Store) GetVault(ctx context.Context, t, name string) (store.Vault, error) {
	vs, err := s.vaults(ctx, `WHERE tenant = ? AND name = ?`, tenantOf(t), name)
	if err != nil {
		return store.Vault{}, err
	}
	if len(vs) == 0 {
		return store.Vault{}, fmt.Errorf("vault %.60q: %w", name, errdefs.ErrNotFound)
	}
	return vs[0], nil
}

// ListVaults returns tenant t's vaults, by name.
func (s *Store) ListVaults(ctx context.Context, t string) ([]store.Vault, error) {
	return s.vaults(ctx, `WHERE tenant = ?`, tenantOf(t))
}

func (s *Store) vaults(ctx context.Context, where string, args ...any) ([]store.Vault, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, tenant, name, layout, allow_rewrite, created_at FROM vaults `+where+` ORDER BY name, id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Vault
	for rows.Next() {
		var v store.Vault
		var at int64
		if err := rows.Scan(&v.ID, &v.Tenant, &v.Name, &v.Layout, &v.AllowRewrite, &at); err != nil {
			return nil, err
		}
		v.CreatedAt = fromUnixNano(at)
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVault removes vault id, its refs and its pack names.
func (s *Store) DeleteVault(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM vaults WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// VaultState returns vault id's refs and pack names.
func (s *Store) VaultState(ctx context.Context, id string) (map[string]string, []string, error) {
	tx, err := s.rdb.BeginTx(ctx, nil) // one snapshot of both tables
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM vaults WHERE id = ?`, id).Scan(&n); err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	refs := map[string]string{}
	rows, err := tx.QueryContext(ctx, `SELECT name, oid FROM vault_refs WHERE vault_id = ?`, id)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var name, oid string
		if err := rows.Scan(&name, &oid); err != nil {
			rows.Close()
			return nil, nil, err
		}
		refs[name] = oid
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var packs []string
	rows, err = tx.QueryContext(ctx, `SELECT name FROM vault_packs WHERE vault_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, nil, err
		}
		packs = append(packs, name)
	}
	return refs, packs, rows.Err()
}

// UpdateVaultRefs moves vault id's refs and records its new packs in one
// transaction, compare-and-set on each ref's old value.
func (s *Store) UpdateVaultRefs(ctx context.Context, id string, updates []store.RefUpdate, packs []string) error {
	tx, err := s.vaultTx(ctx, id)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, u := range updates {
		var cur string
		err := tx.QueryRowContext(ctx, `SELECT oid FROM vault_refs WHERE vault_id = ? AND name = ?`, id, u.Name).Scan(&cur)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if cur != u.Old {
			return fmt.Errorf("ref %.200s moved meanwhile: %w", u.Name, errdefs.ErrConflict)
		}
		if u.New == "" {
			_, err = tx.ExecContext(ctx, `DELETE FROM vault_refs WHERE vault_id = ? AND name = ?`, id, u.Name)
		} else {
			_, err = tx.ExecContext(ctx, `INSERT INTO vault_refs (vault_id, name, oid) VALUES (?,?,?)
				ON CONFLICT (vault_id, name) DO UPDATE SET oid = excluded.oid`, id, u.Name, u.New)
		}
		if err != nil {
			return err
		}
	}
	for _, p := range packs {
		if _, err := tx.ExecContext(ctx, `INSERT INTO vault_packs (vault_id, seq, name)
			SELECT ?, COALESCE(MAX(seq), 0) + 1, ? FROM vault_packs WHERE vault_id = ?
			ON CONFLICT DO NOTHING`, id, p, id); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// ReplaceVaultPacks records pack in place of old in one transaction.
func (s *Store) ReplaceVaultPacks(ctx context.Context, id string, old []string, pack string) error {
	tx, err := s.vaultTx(ctx, id)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, p := range old {
		res, err := tx.ExecContext(ctx, `DELETE FROM vault_packs WHERE vault_id = ? AND name = ?`, id, p)
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || k != 1 {
			return fmt.Errorf("pack %.200s is no longer the vault's: %w", p, errdefs.ErrConflict)
		}
	}
	// First, before the packs that stay: seq 0 and below are free, the
	// appended packs taking MAX+1.
	if _, err := tx.ExecContext(ctx, `INSERT INTO vault_packs (vault_id, seq, name)
		SELECT ?, COALESCE(MIN(seq), 1) - 1, ? FROM vault_packs WHERE vault_id = ?
		ON CONFLICT DO NOTHING`, id, pack, id); err != nil {
		return err
	}
	return tx.Commit()
}

// vaultTx begins a transaction on vault id, which must exist.
func (s *Store) vaultTx(ctx context.Context, id string) (*sql.Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM vaults WHERE id = ?`, id).Scan(&n); err != nil {
		tx.Rollback()
		return nil, err
	}
	if n == 0 {
		tx.Rollback()
		return nil, fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	return tx, nil
}
