package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Pins on objects (store.BlobPins): rows of blob_pins whose until is ahead
// of PostgreSQL's clock. PinBlob and DropBlob each hold a transaction's
// advisory lock on the key's hash, so a pin waits for a deletion under way
// and a deletion sees every pin committed before it. Two keys of one hash
// only wait for each other.

// maxPin bounds a pin: a version is recorded long before.
const maxPin = 24 * time.Hour

// blobLock is the advisory lock of key, for the transaction.
const blobLock = `SELECT pg_advisory_xact_lock(hashtextextended($1, 1785))`

// PinBlob pins object key under pin for d.
func (s *Store) PinBlob(ctx context.Context, key, pin string, d time.Duration) error {
	if err := checkBlobKey(key); err != nil {
		return err
	}
	if pin == "" || len(pin) > 128 {
		return fmt.Errorf("%w: a pin's name is 1 to 128 bytes", errdefs.ErrInvalid)
	}
	if d <= 0 || d > maxPin {
		return fmt.Errorf("%w: a pin lasts from 1µs up to %v", errdefs.ErrInvalid, maxPin)
	}
	return s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, blobLock, key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO blob_pins (key, pin, until) VALUES ($1, $2, clock_timestamp() + $3 * interval '1 microsecond')
			ON CONFLICT (key, pin) DO UPDATE SET until = greatest(blob_pins.until, excluded.until)`, key, pin, d.Microseconds())
		return err
	})
}

// Unpin ends every pin named pin.
func (s *Store) Unpin(ctx context.Context, pin string) error {
	return s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM blob_pins WHERE pin = $1`, pin)
		return err
	})
}

// DropBlob deletes object key with del unless it is pinned.
func (s *Store) DropBlob(ctx context.Context, key string, del func(context.Context) error) (bool, error) {
	if err := checkBlobKey(key); err != nil {
		return false, err
	}
	var dropped bool
	err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		dropped = false // a retry starts over
		if _, err := tx.Exec(ctx, blobLock, key); err != nil {
			return err
		}
		var pinned bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM blob_pins WHERE key = $1 AND until > clock_timestamp())`, key).Scan(&pinned); err != nil {
			return err
		}
		if pinned {
			return nil
		}
		if err := del(ctx); err != nil {
			return err
		}
		// Pins that ended, of makers that died.
		_, err := tx.Exec(ctx, `DELETE FROM blob_pins WHERE key = $1`, key)
		dropped = err == nil
		return err
	})
	return dropped, err
}

// checkBlobKey refuses what is no object's key.
func checkBlobKey(key string) error {
	if key == "" || len(key) > 1024 {
		return fmt.Errorf("%w: an object key is 1 to 1,024 bytes", errdefs.ErrInvalid)
	}
	return nil
}
