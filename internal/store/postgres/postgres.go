// Package postgres is the store (package store) of a cluster: many atoll
// nodes share one PostgreSQL database (github.com/jackc/pgx, no cgo). Every
// write is one serializable transaction, retried when PostgreSQL refuses it
// for a concurrent one or loses its connection before the commit, so that
// the contract's compare-and-sets and counts hold across nodes as they do
// in SQLite's single writer. The cluster's own writes (cluster.go, place.go)
// and the writes of a sandbox's state and resources (UpdateAll, Delete,
// ServeWarm: each changes its node's kept sums, which serializable writes
// on one node would refuse each other over) are read-committed
// transactions that order themselves by row locks instead, which
// placements at thousands a second need; each says why it is still exact.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Store is a pool of connections to the database, or a node's view of it
// (As).
type Store struct {
	pool *pgxpool.Pool
	// as is the node and epoch a view writes under; nil for the store
	// itself.
	as *writer
}

// Open connects to the database that url names (a postgres:// URL or a
// key=value DSN, as libpq takes them; search_path in it picks a schema)
// and brings its schema up to date (migrate.go). It returns once the
// database answers.
//
// node, if given, names the cluster node the connections are of (their
// application_name, NodeSession): Expire ends a fenced node's sessions.
func Open(ctx context.Context, url string, node ...string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, fmt.Errorf("%w: parsing the PostgreSQL URL", errdefs.ErrInvalid)
	}
	if len(node) > 0 && node[0] != "" {
		// The database and schema in it too (hashed: an application_name
		// is cut at 63 bytes): clusters that share a server with the same
		// node names never end each other's sessions.
		name := NodeSession + node[0]
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, `SELECT set_config('application_name', $1 || ' ' || `+clusterTag+`, false)`, name)
			return err
		}
	}
	// A plan for the values at hand, each time: the generic plan a
	// prepared statement settles on after five runs is costed on the
	// table as it was then, and one made while sandboxes was small scans
	// the whole table for a node's rows forever after.
	if _, ok := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !ok {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrating schema: %w", err)
	}
	return s, nil
}

// NodeSession prefixes the application_name of a cluster node's
// connections: "atoll node ", the node's name, a space and clusterTag.
const NodeSession = "atoll node "

// clusterTag is SQL for a short tag of the cluster's database and schema.
const clusterTag = `left(md5(current_database() || '.' || current_schema()), 12)`

// Close waits for the queries under way, then closes the connections.
func (s *Store) Close() error {
	if s.as != nil {
		return nil // a view: the store owns the pool
	}
	s.pool.Close()
	return nil
}

// querier is what reads run on: a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// retryFor bounds the retries of one operation: long enough for a
// server's restart or a failover to a standby, and for a burst of
// serialization failures among concurrent writers.
const retryFor = 30 * time.Second

// write runs fn in a serializable transaction and commits it, retrying the
// whole of it while PostgreSQL refuses it for a concurrent transaction or
// it loses its connection before the commit. fn may run several times, so
// it must change nothing outside the transaction but its result. A
// connection lost during the commit is ErrUnavailable: the write may or may
// not have been applied, and only the caller can tell.
//
// Through a node's view (As), every write first checks, in its
// transaction, that the view's epoch is still the node's live one.
func (s *Store) write(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.writeAt(ctx, pgx.Serializable, s.as, fn)
}

// writeAt is write at isolation level iso, checking as's epoch (if as is
// not nil) first.
func (s *Store) writeAt(ctx context.Context, iso pgx.TxIsoLevel, as *writer, fn func(tx pgx.Tx) error) error {
	return retry(ctx, func() (bool, error) {
		tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			return retryable(err, nil), wrap(err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := as.check(ctx, tx); err != nil {
			return retryable(err, tx.Conn()), wrap(err)
		}
		if err := fn(tx); err != nil {
			return retryable(err, tx.Conn()), wrap(err)
		}
		if err := tx.Commit(ctx); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				// PostgreSQL answered: the commit was refused.
				return retryable(err, nil), wrap(err)
			}
			return false, fmt.Errorf("%w: committing: %v", errdefs.ErrUnavailable, err)
		}
		return false, nil
	})
}

// read runs fn on a connection of the pool, again on another if the first
// was lost: reads change nothing, so a retry is always safe.
func (s *Store) read(ctx context.Context, fn func(q querier) error) error {
	return retry(ctx, func() (bool, error) {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return retryable(err, nil), wrap(err)
		}
		defer c.Release()
		if err := fn(c); err != nil {
			return retryable(err, c.Conn()), wrap(err)
		}
		return false, nil
	})
}

// retry runs attempt until it succeeds, fails for good, or has failed for
// retryFor, waiting a little longer (and a random part, so that
// contenders spread out) after each failure.
func retry(ctx context.Context, attempt func() (again bool, err error)) error {
	start := time.Now()
	for i := 0; ; i++ {
		again, err := attempt()
		if !again || time.Since(start) > retryFor {
			return err
		}
		wait := time.Duration(1+rand.IntN(1+min(i, 20)*5)) * time.Millisecond
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// conflicts counts the attempts refused for a concurrent transaction (a
// serialization failure or a deadlock) and run again: what tests of
// contention measure; deadlocks, the deadlocks among them.
var conflicts, deadlocks atomic.Int64

// retryCodes are the SQLSTATEs after which running the transaction again
// is right: the server refused it, or shut its connection down, without
// applying it.
var retryCodes = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"57P01": true, // admin_shutdown: pg_terminate_backend, a fast shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now: starting up or shutting down
	"08006": true, // connection_failure
	"08003": true, // connection_does_not_exist
}

// retryConstraints are unique constraints that concurrent writers can
// collide on only by choosing a value at the same time (a slot, a version
// number); PostgreSQL usually reports that as a serialization failure, but
// not always.
var retryConstraints = map[string]bool{
	"sandboxes_node_slot_key":           true,
	"template_versions_name_number_key": true,
}

// retryable reports whether err, from a transaction on conn (nil if none
// was had), leaves nothing applied and is worth another attempt.
func retryable(err error, conn *pgx.Conn) bool {
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &pe):
		again := retryCodes[pe.Code] || pe.Code == "23505" && retryConstraints[pe.ConstraintName]
		switch {
		case again && pe.Code == "40001":
			conflicts.Add(1)
		case again && pe.Code == "40P01":
			conflicts.Add(1)
			deadlocks.Add(1)
		}
		return again
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrInvalid),
		errors.Is(err, store.ErrFenced), errors.Is(err, store.ErrNoRoom), errors.Is(err, errdefs.ErrQuota):
		return false
	}
	// Not the server's answer: the connection failed (or was never made).
	return pgconn.SafeToRetry(err) || conn == nil || conn.IsClosed()
}

// kinds are the SQLSTATEs that are the contract's error kinds.
var kinds = map[string]error{
	"23505": errdefs.ErrConflict, // unique_violation: a second row of an ID, name or hash
	"22021": errdefs.ErrInvalid,  // character_not_in_repertoire: NUL, or not UTF-8
	"22P05": errdefs.ErrInvalid,  // untranslatable_character
	"54000": errdefs.ErrInvalid,  // program_limit_exceeded: a key too long to index
	"22003": errdefs.ErrInvalid,  // numeric_value_out_of_range
}

// wrap is err with the contract's kind of PostgreSQL's error, if it has
// one; the kind comes first, as the rest of the server reads messages.
func wrap(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if kind, ok := kinds[pe.Code]; ok {
			return fmt.Errorf("%w: %s", kind, pe.Message)
		}
		if retryCodes[pe.Code] {
			return fmt.Errorf("%w: %s", errdefs.ErrUnavailable, pe.Message)
		}
	}
	return err
}

// storable reports whether PostgreSQL's text can hold s: not with a NUL,
// nor if it is not UTF-8. No row has an ID that is not storable, so a
// lookup of one finds nothing without asking.
func storable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return false
		}
	}
	return utf8.ValidString(s)
}

// tenantOf is the tenant column of a row: "" is the default tenant.
func tenantOf(t string) string {
	if t == "" {
		return tenant.Default
	}
	return t
}

// utc is t in UTC: pgx reads timestamptz in the local zone.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

var _ store.Store = (*Store)(nil)
