package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Migrations. Each file of migrations/ is one step, numbered by its name's
// prefix (0001_init.sql); a database records the steps it has had in
// schema_version. Open applies the missing ones in one transaction, under
// an advisory lock, so that nodes opening a database at once apply each
// step once: the others wait, then find nothing left to do. A step is
// never edited once released; a change is a new step.

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the key of the advisory lock that migrations hold, the
// same on every node: "atoll" in ASCII.
const migrationLock = 0x61746f6c6c

type step struct {
	version int
	name    string
	sql     string
}

// steps are the migrations, in order.
func steps() ([]step, error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []step
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		n, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: no number", base)
		}
		b, err := migrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, step{n, base, string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrate applies the steps the database lacks. A database from a newer
// atoll (a step this one does not know) is left alone and refused.
func (s *Store) migrate(ctx context.Context) error {
	all, err := steps()
	if err != nil {
		return err
	}
	// Not serializable: the advisory lock already orders migrations, and
	// DDL under SSI would only add spurious failures.
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Transaction-scoped: released by the commit or the rollback,
		// also when the connection dies.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&have); err != nil {
			return err
		}
		if len(all) > 0 && have > all[len(all)-1].version {
			return fmt.Errorf("the database has schema version %d, newer than this atoll's %d", have, all[len(all)-1].version)
		}
		for _, st := range all {
			if st.version <= have {
				continue
			}
			if _, err := tx.Exec(ctx, st.sql); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_version (version, name) VALUES ($1, $2)`, st.version, st.name); err != nil {
				return err
			}
		}
		return nil
	})
}
