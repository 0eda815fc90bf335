// Package pgtest gives tests, benchmarks and the cluster harness a
// PostgreSQL schema of their own on a shared server (the one
// scripts/test.sh starts and names in ATOLL_TEST_POSTGRES_URL), so that
// each sees an empty database and leaves nothing behind.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/store/postgres"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// Env names the test server's URL.
const Env = "ATOLL_TEST_POSTGRES_URL"

// Schema makes a schema with a fresh name, prefix and random hex digits, on
// the server base names, and returns its name and how to drop it.
func Schema(ctx context.Context, base, prefix string) (name string, drop func() error, err error) {
	var b [6]byte
	rand.Read(b[:])
	name = prefix + hex.EncodeToString(b[:])
	if err := exec(ctx, base, "CREATE SCHEMA "+name); err != nil {
		return "", nil, err
	}
	return name, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return exec(ctx, base, "DROP SCHEMA "+name+" CASCADE")
	}, nil
}

// exec runs sql on a connection of its own.
func exec(ctx context.Context, base, sql string) error {
	c, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// WithSearchPath is u (a postgres:// URL or key=value settings) with its
// connections using schema.
func WithSearchPath(u, schema string) (string, error) {
	if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
		return u + " search_path=" + schema, nil
	}
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	q := p.Query()
	q.Set("search_path", schema)
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// URL is the test server's URL; without one t is skipped (failed with
// ATOLL_TEST_STRICT=1).
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(Env)
	if u == "" {
		testenv.Skip(t, Env+" is not set (scripts/test.sh starts a PostgreSQL server and sets it)")
	}
	return u
}

// NewSchema makes a schema on the test server, dropped when t ends, and
// returns its name.
func NewSchema(t testing.TB, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, drop, err := Schema(ctx, URL(t), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// NewURL is the URL of a NewSchema on the test server.
func NewURL(t testing.TB, prefix string) string {
	t.Helper()
	u, err := WithSearchPath(URL(t), NewSchema(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Open opens the PostgreSQL store in a NewSchema, closed when t ends.
func Open(t testing.TB, prefix string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), NewURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
