package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"
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

// While several writers are at it (the last commit carried more than one
// write, and the next write came within busyGap of it), a transaction
// waits up to gather for more writes before it commits: under a burst of
// creates and deletes most commits then carry several sandboxes' writes,
// and the log's pages and its fsync are shared by more of them. One client
// writing one thing after another never waits, nor does a write on an idle
// store.
const (
	busyGap = 5 * time.Millisecond
	gather  = 2 * time.Millisecond
)

// commitLoop is the writer goroutine; it ends when closing is closed.
func (s *Store) commitLoop() {
	defer close(s.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var last time.Time // when the last commit ended
	lastSize := 0      // how many writes it carried
	for {
		var batch []write
		select {
		case w := <-s.writes:
			batch = append(batch, w)
		case <-s.closing:
			return
		}
		busy := lastSize > 1 && time.Since(last) < busyGap
	more:
		for len(batch) < maxGroup {
			select {
			case w := <-s.writes:
				batch = append(batch, w)
			default:
				break more
			}
		}
		if busy && len(batch) < maxGroup {
			s.gathered.Add(1)
			timer.Reset(gather)
		wait:
			for len(batch) < maxGroup {
				select {
				case w := <-s.writes:
					batch = append(batch, w)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		s.commit(batch)
		last, lastSize = time.Now(), len(batch)
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
