package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// Group commit. Every commit of the store waits for an fsync of SQLite's
// write-ahead log (synchronous=FULL), a few milliseconds on a busy disk, and
// SQLite has one writer: when hundreds of sandboxes are created and deleted
// at once, their state changes queue for that one fsync each. The sandbox
// writes (Create, UpdateAll, Delete) therefore go through one writer
// goroutine that takes every write waiting when it starts a transaction,
// runs each inside a savepoint of its own, so that one write's failure
// undoes only that write, and commits them together: one fsync for all. A
// write returns only after that commit, so what a caller acknowledges is on
// disk, as before.

// write is one queued write and where its result goes.
type write struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx *sql.Tx) error
	done chan error
}

// maxGroup bounds the writes of one transaction, so that a long queue still
// gets its answers in steps.
const maxGroup = 64

// inTx runs fn in a transaction of the group commit and returns its error,
// or the commit's.
func (s *Store) inTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	w := write{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.writes <- w:
	case <-s.closing:
		return fmt.Errorf("store closed")
	}
	return <-w.done
}

// commitLoop is the writer goroutine; it ends when closing is closed.
func (s *Store) commitLoop() {
	defer close(s.stopped)
	for {
		var batch []write
		select {
		case w := <-s.writes:
			batch = append(batch, w)
		case <-s.closing:
			return
		}
	more:
		for len(batch) < maxGroup {
			select {
			case w := <-s.writes:
				batch = append(batch, w)
			default:
				break more
			}
		}
		s.commit(batch)
	}
}

// commit runs batch in one transaction, each write in a savepoint.
func (s *Store) commit(batch []write) {
	errs := make([]error, len(batch))
	fail := func(err error) {
		for _, w := range batch {
			w.done <- err
		}
	}
	tx, err := s.db.BeginTx(context.Background(), nil)
	if err != nil {
		fail(err)
		return
	}
	defer tx.Rollback()
	for i, w := range batch {
		if _, err := tx.Exec(`SAVEPOINT w`); err != nil {
			fail(err)
			return
		}
		// A cancelled context would interrupt SQLite, which then rolls
		// back the whole transaction: the other writes too.
		if errs[i] = w.fn(context.WithoutCancel(w.ctx), tx); errs[i] != nil {
			if _, err := tx.Exec(`ROLLBACK TO w`); err != nil {
				fail(err)
				return
			}
		}
		if _, err := tx.Exec(`RELEASE w`); err != nil {
			fail(err)
			return
		}
	}
	cerr := tx.Commit()
	s.commits.Add(1)
	for i, w := range batch {
		if errs[i] == nil {
			errs[i] = cerr
		}
		w.done <- errs[i]
	}
}
