package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// CreateVault records a vault.
func (s *Store) CreateVault(ctx context.Context, v store.Vault) error {
	if !storable(v.ID) || !storable(v.Name) || !storable(v.Tenant) || !storable(v.Layout) {
		return fmt.Errorf("vault %.60q: %w: not UTF-8 text", v.Name, errdefs.ErrInvalid)
	}
	err := s.write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO vaults (id, tenant, name, layout, allow_rewrite, created_at) VALUES ($1,$2,$3,$4,$5,$6)`,
			v.ID, tenantOf(v.Tenant), v.Name, v.Layout, v.AllowRewrite, v.CreatedAt)
		return err
	})
	if err != nil {
		return fmt.Errorf("vault %.60q: %w", v.Name, err)
	}
	return nil
}

// GetVault returns tenant t's vault name.
func (s *Store) GetVault(ctx context.Context, t, name string) (store.Vault, error) {
	if !storable(t) || !storable(name) {
		return store.Vault{}, fmt.Errorf("vault %.60q: %w", name, errdefs.ErrNotFound)
	}
	vs, err := s.vaults(ctx, `WHERE tenant = $1 AND name = $2`, tenantOf(t), name)
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
	if !storable(t) {
		return nil, nil
	}
	return s.vaults(ctx, `WHERE tenant = $1`, tenantOf(t))
}

func (s *Store) vaults(ctx context.Context, where string, args ...any) ([]store.Vault, error) {
	var out []store.Vault
	err := s.read(ctx, func(q querier) error {
		out = nil
		rows, err := q.Query(ctx, `SELECT id, tenant, name, layout, allow_rewrite, created_at FROM vaults `+where+` ORDER BY name COLLATE "C", id COLLATE "C"`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v store.Vault
			if err := rows.Scan(&v.ID, &v.Tenant, &v.Name, &v.Layout, &v.AllowRewrite, &v.CreatedAt); err != nil {
				return err
			}
			v.CreatedAt = v.CreatedAt.UTC()
			out = append(out, v)
		}
		return rows.Err()
	})
	return out, err
}

// DeleteVault removes vault id, its refs and its pack names.
func (s *Store) DeleteVault(ctx context.Context, id string) error {
	if !storable(id) {
		return fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM vaults WHERE id = $1`, id)
		if err == nil && tag.RowsAffected() == 0 {
			err = fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
		}
		return err
	})
}

// VaultState returns vault id's refs and pack names, read in one
// transaction.
func (s *Store) VaultState(ctx context.Context, id string) (map[string]string, []string, error) {
	if !storable(id) {
		return nil, nil, fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	var refs map[string]string
	var packs []string
	err := s.writeAt(ctx, pgx.RepeatableRead, nil, func(tx pgx.Tx) error {
		refs, packs = map[string]string{}, nil
		if err := vaultExists(ctx, tx, id, false); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT name, oid FROM vault_refs WHERE vault_id = $1`, id)
		if err != nil {
			return err
		}
		for rows.Next() {
			var name, oid string
			if err := rows.Scan(&name, &oid); err != nil {
				rows.Close()
				return err
			}
			refs[name] = oid
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT name FROM vault_packs WHERE vault_id = $1 ORDER BY seq`, id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				return err
			}
			packs = append(packs, name)
		}
		return rows.Err()
	})
	return refs, packs, err
}

// vaultExists returns ErrNotFound unless vault id exists; with lock, it
// locks the vault's row until the transaction ends, which orders the
// transactions that update one vault's refs.
func vaultExists(ctx context.Context, tx pgx.Tx, id string, lock bool) error {
	q := `SELECT 1 FROM vaults WHERE id = $1`
	if lock {
		q += ` FOR UPDATE`
	}
	var one int
	err := tx.QueryRow(ctx, q, id).Scan(&one)
	if err == pgx.ErrNoRows {
		return fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	return err
}

// UpdateVaultRefs moves vault id's refs and records its new packs in one
// transaction, compare-and-set on each ref's old value.
func (s *Store) UpdateVaultRefs(ctx context.Context, id string, updates []store.RefUpdate, packs []string) error {
	if !storable(id) {
		return fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	for _, u := range updates {
		if !storable(u.Name) || !storable(u.Old) || !storable(u.New) {
			return fmt.Errorf("ref %.200q: %w: not UTF-8 text", u.Name, errdefs.ErrInvalid)
		}
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := vaultExists(ctx, tx, id, true); err != nil {
			return err
		}
		for _, u := range updates {
			var cur string
			err := tx.QueryRow(ctx, `SELECT oid FROM vault_refs WHERE vault_id = $1 AND name = $2`, id, u.Name).Scan(&cur)
			if err != nil && err != pgx.ErrNoRows {
				return err
			}
			if cur != u.Old {
				return fmt.Errorf("ref %.200s moved meanwhile: %w", u.Name, errdefs.ErrConflict)
			}
			if u.New == "" {
				_, err = tx.Exec(ctx, `DELETE FROM vault_refs WHERE vault_id = $1 AND name = $2`, id, u.Name)
			} else {
				_, err = tx.Exec(ctx, `INSERT INTO vault_refs (vault_id, name, oid) VALUES ($1, $2, $3)
					ON CONFLICT (vault_id, name) DO UPDATE SET oid = excluded.oid`, id, u.Name, u.New)
			}
			if err != nil {
				return err
			}
		}
		for _, p := range packs {
			if _, err := tx.Exec(ctx, `INSERT INTO vault_packs (vault_id, seq, name)
				SELECT $1, COALESCE(MAX(seq), 0) + 1, $2 FROM vault_packs WHERE vault_id = $1
				ON CONFLICT (vault_id, name) DO NOTHING`, id, p); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReplaceVaultPacks records pack in place of old in one transaction.
func (s *Store) ReplaceVaultPacks(ctx context.Context, id string, old []string, pack string) error {
	if !storable(id) || !storable(pack) {
		return fmt.Errorf("vault %.40q: %w", id, errdefs.ErrNotFound)
	}
	for _, p := range old {
		if !storable(p) {
			return fmt.Errorf("pack %.200q: %w: not UTF-8 text", p, errdefs.ErrInvalid)
		}
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := vaultExists(ctx, tx, id, true); err != nil {
			return err
		}
		for _, p := range old {
			tag, err := tx.Exec(ctx, `DELETE FROM vault_packs WHERE vault_id = $1 AND name = $2`, id, p)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("pack %.200s is no longer the vault's: %w", p, errdefs.ErrConflict)
			}
		}
		// First, before the packs that stay (see the SQLite store).
		_, err := tx.Exec(ctx, `INSERT INTO vault_packs (vault_id, seq, name)
			SELECT $1, COALESCE(MIN(seq), 1) - 1, $2 FROM vault_packs WHERE vault_id = $1
			ON CONFLICT (vault_id, name) DO NOTHING`, id, pack)
		return err
	})
}
