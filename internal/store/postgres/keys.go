package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// AddKey stores the hash of an API key, its name and its tenant.
func (s *Store) AddKey(ctx context.Context, hash, name, tn string) error {
	now := time.Now()
	err := s.write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO api_keys (hash, name, tenant, created_at) VALUES ($1, $2, $3, $4)`,
			hash, name, tenantOf(tn), now)
		return err
	})
	if err != nil {
		return fmt.Errorf("key %.40q: %w", store.KeyID(hash), err)
	}
	return nil
}

// LookupKey returns the key whose hash is hash.
func (s *Store) LookupKey(ctx context.Context, hash string) (store.Key, error) {
	if !storable(hash) {
		return store.Key{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
	}
	ks, err := s.keys(ctx, `WHERE hash = $1`, hash)
	return store.Only(ks, err, "key")
}

// ListKeys returns every key, by creation, then hash.
func (s *Store) ListKeys(ctx context.Context) ([]store.Key, error) {
	return s.keys(ctx, `ORDER BY created_at, hash`)
}

// DeleteKey removes the key with ID id, unless it is the last key of the
// default tenant (the admin's). Serializable: two nodes deleting the last
// two admin keys at once cannot both succeed.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	if !storable(id) {
		return fmt.Errorf("key %s: %w", id, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		var hash, tn string
		// An ID is the hash's first 20 characters, compared as a string
		// (never a LIKE pattern).
		err := tx.QueryRow(ctx, `SELECT hash, tenant FROM api_keys WHERE left(hash, 20) = $1`, id).Scan(&hash, &tn)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("key %s: %w", id, errdefs.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if tn == tenant.Default {
			var n int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM api_keys WHERE tenant = $1`, tenant.Default).Scan(&n); err != nil {
				return err
			}
			if n <= 1 {
				return fmt.Errorf("%w: key %s is the last admin key; create another first", errdefs.ErrConflict, id)
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM api_keys WHERE hash = $1`, hash)
		return err
	})
}

// KeyCount is the number of stored keys.
func (s *Store) KeyCount(ctx context.Context) (int, error) {
	var n int
	err := s.read(ctx, func(q querier) error {
		return q.QueryRow(ctx, `SELECT COUNT(*) FROM api_keys`).Scan(&n)
	})
	return n, err
}

func (s *Store) keys(ctx context.Context, where string, a ...any) ([]store.Key, error) {
	var out []store.Key
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT hash, name, tenant, created_at FROM api_keys `+where, a...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Key, error) {
			var k store.Key
			err := row.Scan(&k.Hash, &k.Name, &k.Tenant, &k.CreatedAt)
			k.ID, k.CreatedAt = store.KeyID(k.Hash), k.CreatedAt.UTC()
			return k, err
		})
		return err
	})
	return out, err
}

// TenantInUse reports whether tenant t has keys, sandboxes, snapshots or
// vaults.
func (s *Store) TenantInUse(ctx context.Context, t string) (bool, error) {
	if !storable(t) {
		return false, nil
	}
	var used bool
	err := s.read(ctx, func(q querier) error {
		return q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys WHERE tenant = $1)
			OR EXISTS (SELECT 1 FROM sandboxes WHERE tenant = $1)
			OR EXISTS (SELECT 1 FROM snapshots WHERE tenant = $1)
			OR EXISTS (SELECT 1 FROM vaults WHERE tenant = $1)`, t).Scan(&used)
	})
	return used, err
}
