package sqlite

import (
	"container/list"
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
	"strings"
	"sync/atomic"

	msqlite "modernc.org/sqlite"
)

// Prepared statements, kept. The store passes SQL text to database/sql
// (tx.ExecContext(ctx, query, args...)), and modernc's driver compiles the
// text anew each time: under a burst of creates and deletes that parsing
// was an eighth of the server's CPU. The driver registered here wraps
// modernc's and keeps each connection's compiled statements by their text,
// so that a statement is compiled once per connection and then only reset,
// bound and stepped (docs/benchmarks.md, issue #13).

// driverName is the wrapped driver's name for sql.Open.
const driverName = "atoll-sqlite"

func init() { sql.Register(driverName, cachingDriver{}) }

// maxStmts bounds the statements each connection keeps; past it the least
// recently used is closed. The store has a few hundred texts at most, but
// some are built with a variable number of placeholders.
const maxStmts = 256

// compiled counts the statements kept, for the test.
var compiled atomic.Int64

type cachingDriver struct{}

func (cachingDriver) Open(dsn string) (driver.Conn, error) {
	c, err := (&msqlite.Driver{}).Open(dsn)
	if err != nil {
		return nil, err
	}
	return &cachingConn{conn: c, stmts: map[string]*list.Element{}, lru: list.New()}, nil
}

// modernConn is what the store uses of modernc's connection.
type modernConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.SessionResetter
	driver.Validator
	driver.Pinger
}

// cachingConn is a connection with its statements kept. database/sql uses a
// connection from one goroutine at a time, so it needs no lock.
type cachingConn struct {
	conn  driver.Conn
	stmts map[string]*list.Element // of *cachedStmt, by text
	lru   *list.List               // most recently used first
}

// cachedStmt is a kept statement; busy while rows of it are open, when a
// query of the same text (a nested one) gets a statement of its own.
type cachedStmt struct {
	query string
	stmt  driver.Stmt
	busy  bool
}

var (
	_ modernConn                    = (*cachingConn)(nil)
	_ driver.RowsColumnTypeScanType = (*cachedRows)(nil)
)

func (c *cachingConn) mc() modernConn { return c.conn.(modernConn) }

// cacheable is whether query is one statement, which the driver compiles
// once: a script (several statements) is run by modernc statement by
// statement, and gains nothing.
func cacheable(query string) bool {
	return !strings.Contains(strings.TrimRight(query, "; \t\n"), ";")
}

// take returns the kept statement for query, compiling it if needed; nil
// when it is not to be kept (a script, or busy with open rows).
func (c *cachingConn) take(ctx context.Context, query string) (*cachedStmt, error) {
	if !cacheable(query) {
		return nil, nil
	}
	if e, ok := c.stmts[query]; ok {
		cs := e.Value.(*cachedStmt)
		if cs.busy {
			return nil, nil
		}
		c.lru.MoveToFront(e)
		return cs, nil
	}
	st, err := c.mc().PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	compiled.Add(1)
	cs := &cachedStmt{query: query, stmt: st}
	c.stmts[query] = c.lru.PushFront(cs)
	for c.lru.Len() > maxStmts {
		old := c.lru.Back().Value.(*cachedStmt)
		if old.busy {
			break // closed when its rows are, below
		}
		c.drop(old)
	}
	return cs, nil
}

func (c *cachingConn) drop(cs *cachedStmt) {
	if e, ok := c.stmts[cs.query]; ok && e.Value == cs {
		c.lru.Remove(e)
		delete(c.stmts, cs.query)
	}
	_ = cs.stmt.Close()
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		return c.mc().ExecContext(ctx, query, args)
	}
	return cs.stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		return c.mc().QueryContext(ctx, query, args)
	}
	rows, err := cs.stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	cs.busy = true
	return &cachedRows{Rows: rows, release: func() {
		cs.busy = false
		if _, kept := c.stmts[cs.query]; !kept || c.lru.Len() > maxStmts {
			c.drop(cs)
		}
	}}, nil
}

func (c *cachingConn) Close() error {
	for e := c.lru.Front(); e != nil; e = e.Next() {
		_ = e.Value.(*cachedStmt).stmt.Close()
	}
	c.stmts, c.lru = map[string]*list.Element{}, list.New()
	return c.conn.Close()
}

func (c *cachingConn) Prepare(query string) (driver.Stmt, error) { return c.conn.Prepare(query) }
func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.mc().PrepareContext(ctx, query)
}
func (c *cachingConn) Begin() (driver.Tx, error) {
	return c.mc().BeginTx(context.Background(), driver.TxOptions{})
}
func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.mc().BeginTx(ctx, opts)
}
func (c *cachingConn) ResetSession(ctx context.Context) error { return c.mc().ResetSession(ctx) }
func (c *cachingConn) IsValid() bool                          { return c.mc().IsValid() }
func (c *cachingConn) Ping(ctx context.Context) error         { return c.mc().Ping(ctx) }

// cachedRows are a kept statement's rows: closing them frees the statement
// for the next use.
type cachedRows struct {
	driver.Rows
	release func()
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	if r.release != nil {
		r.release()
		r.release = nil
	}
	return err
}

// The column types modernc's rows report, passed on.

func (r *cachedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *cachedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *cachedRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}
