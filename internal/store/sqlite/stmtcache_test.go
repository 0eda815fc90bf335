package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
)

// TestStatementCache: kept statements give the same answers as fresh ones,
// including a query nested in the open rows of the same text, a script,
// a statement made invalid by a schema change, and more texts than are kept.
func TestStatementCache(t *testing.T) {
	db, err := sql.Open(driverName, "file:"+filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	// A script: several statements in one text, not kept, all run.
	if _, err := db.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (2, 'b');`); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 2 {
		t.Fatalf("after the script: %d rows, want 2", n)
	}
	// The same text again and again, with other arguments each time:
	// compiled once.
	before := compiled.Load()
	for i := 3; i < 50; i++ {
		if _, err := db.ExecContext(ctx, `INSERT INTO t VALUES (?, ?)`, i, fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := compiled.Load() - before; n != 1 {
		t.Errorf("47 inserts of one text compiled %d statements, want 1", n)
	}
	if n := count(); n != 49 {
		t.Fatalf("%d rows, want 49", n)
	}
	// Nested: rows of a text open while the same text runs again, in one
	// transaction (one connection).
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	const q = `SELECT k, v FROM t WHERE k <= ? ORDER BY k`
	rows, err := tx.QueryContext(ctx, q, 3)
	if err != nil {
		t.Fatal(err)
	}
	var outer []string
	for rows.Next() {
		var k int
		var v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		var inner int
		in, err := tx.QueryContext(ctx, q, k)
		if err != nil {
			t.Fatal(err)
		}
		for in.Next() {
			inner++
		}
		in.Close()
		if inner != k {
			t.Errorf("nested query for %d saw %d rows", k, inner)
		}
		outer = append(outer, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if fmt.Sprint(outer) != "[a b v3]" {
		t.Errorf("outer rows %v, want [a b v3]", outer)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// A schema change under a kept statement: SQLite compiles it again.
	if _, err := db.Exec(`ALTER TABLE t ADD COLUMN w TEXT NOT NULL DEFAULT 'x'`); err != nil {
		t.Fatal(err)
	}
	var w string
	if err := db.QueryRow(`SELECT w FROM t WHERE k = ?`, 1).Scan(&w); err != nil || w != "x" {
		t.Fatalf("after ALTER: %q, %v", w, err)
	}
	// More texts than are kept: the oldest are closed, answers stay right.
	for i := 0; i < 2*maxStmts; i++ {
		var got int
		if err := db.QueryRow(fmt.Sprintf(`SELECT k + %d FROM t WHERE k = ?`, i), 2).Scan(&got); err != nil || got != 2+i {
			t.Fatalf("text %d: %d, %v", i, got, err)
		}
	}
	// An error (a constraint) leaves the kept statement usable.
	if _, err := db.Exec(`INSERT INTO t (k, v) VALUES (?, ?)`, 1, "dup"); err == nil {
		t.Fatal("duplicate key taken")
	}
	if _, err := db.Exec(`INSERT INTO t (k, v) VALUES (?, ?)`, 100, "ok"); err != nil {
		t.Fatalf("after a failed insert: %v", err)
	}
	if n := count(); n != 50 {
		t.Fatalf("%d rows, want 50", n)
	}
	// The connection's statements are all it keeps.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
