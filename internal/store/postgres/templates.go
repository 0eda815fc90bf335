package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// PutTemplate records t as a version of t.Name and points the name at it,
// in one transaction; a version of the same ID is reused.
func (s *Store) PutTemplate(ctx context.Context, t store.Template) (store.Template, string, error) {
	t.ID = store.VersionID(t.Name, t.Layers, t.Config)
	layers, _ := json.Marshal(t.Layers)
	cfg, _ := json.Marshal(t.Config)
	var got store.Template
	var prev string
	err := s.write(ctx, func(tx pgx.Tx) error {
		old, err := versions(ctx, tx, `WHERE id = $1`, t.ID)
		if err != nil {
			return err
		}
		if len(old) > 0 {
			got = old[0]
		} else {
			got = t
			if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(number), 0) + 1 FROM template_versions WHERE name = $1`,
				t.Name).Scan(&got.Number); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO template_versions (id, name, number, source, digest, layers, size, config, created_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
				got.ID, got.Name, got.Number, got.Source, got.Digest, string(layers), got.Size, string(cfg), got.CreatedAt); err != nil {
				return err
			}
		}
		prev, err = point(ctx, tx, t.Name, got.ID)
		return err
	})
	if err != nil {
		return t, "", fmt.Errorf("template %.40q: %w", t.Name, err)
	}
	return got, prev, nil
}

// PointTemplate points name at the existing version id and returns the ID
// of the version name pointed to before.
func (s *Store) PointTemplate(ctx context.Context, name, id string) (string, error) {
	if !storable(id) {
		return "", fmt.Errorf("template version %s: %w", id, errdefs.ErrNotFound)
	}
	var prev string
	err := s.write(ctx, func(tx pgx.Tx) error {
		if err := versionExists(ctx, tx, id); err != nil {
			return err
		}
		var err error
		prev, err = point(ctx, tx, name, id)
		return err
	})
	return prev, err
}

func point(ctx context.Context, tx pgx.Tx, name, id string) (string, error) {
	var prev string
	err := tx.QueryRow(ctx, `SELECT version FROM template_names WHERE name = $1`, name).Scan(&prev)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	_, err = tx.Exec(ctx, `INSERT INTO template_names (name, version) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET version = excluded.version`, name, id)
	return prev, err
}

// versionExists returns errdefs.ErrNotFound unless version id exists; ""
// (the built-in template) always does.
func versionExists(ctx context.Context, tx pgx.Tx, id string) error {
	if id == "" {
		return nil
	}
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM template_versions WHERE id = $1)`, id).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("template version %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// GetTemplate returns the version name points to.
func (s *Store) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	if !storable(name) {
		return store.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	return s.oneVersion(ctx, "template "+name, `WHERE id = (SELECT version FROM template_names WHERE name = $1)`, name)
}

// GetTemplateVersion returns the version of name that ref names: its
// number, or its ID (of a version made under name or one name points to).
func (s *Store) GetTemplateVersion(ctx context.Context, name, ref string) (store.Template, error) {
	what := "template " + name + "@" + ref
	n, perr := strconv.Atoi(ref)
	switch {
	case perr == nil && n > 0 && strconv.Itoa(n) == ref:
		if !storable(name) {
			return store.Template{}, fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
		}
		return s.oneVersion(ctx, what, `WHERE name = $1 AND number = $2`, name, n)
	case store.ValidVersionID(ref):
		if !storable(name) {
			return store.Template{}, fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
		}
		return s.oneVersion(ctx, what, `WHERE id = $2 AND (name = $1 OR id = (SELECT version FROM template_names WHERE name = $1))`, name, ref)
	}
	return store.Template{}, fmt.Errorf("%w: a template version is a number or an ID of v and 19 hex digits", errdefs.ErrInvalid)
}

// TemplateVersion returns version id.
func (s *Store) TemplateVersion(ctx context.Context, id string) (store.Template, error) {
	if !storable(id) {
		return store.Template{}, fmt.Errorf("template version %s: %w", id, errdefs.ErrNotFound)
	}
	return s.oneVersion(ctx, "template version "+id, `WHERE id = $1`, id)
}

func (s *Store) oneVersion(ctx context.Context, what, where string, a ...any) (store.Template, error) {
	var ts []store.Template
	err := s.read(ctx, func(q querier) error {
		var err error
		ts, err = versions(ctx, q, where, a...)
		return err
	})
	return store.Only(ts, err, what)
}

// ListTemplates returns every name with its current version, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]store.TemplateName, error) {
	var out []store.TemplateName
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT n.name, `+versionColumns+` FROM template_names n
			JOIN template_versions v ON v.id = n.version ORDER BY n.name`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.TemplateName, error) {
			var n store.TemplateName
			err := scanVersion(row, &n.Name, &n.Current)
			return n, err
		})
		return err
	})
	return out, err
}

// ListTemplateVersions returns every version, by name and number.
func (s *Store) ListTemplateVersions(ctx context.Context) ([]store.Template, error) {
	var out []store.Template
	err := s.read(ctx, func(q querier) error {
		var err error
		out, err = versions(ctx, q, `ORDER BY name, number`)
		return err
	})
	return out, err
}

// DeleteTemplate removes name. Its versions stay while anything else holds
// them; CollectTemplates deletes the rest.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	if !storable(name) {
		return fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM template_names WHERE name = $1`, name)
		if err == nil && tag.RowsAffected() == 0 {
			return fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
		}
		return err
	})
}

// CollectTemplates deletes the versions that no name, sandbox or snapshot
// holds (only among ids, if any are given) and returns them. Serializable:
// a Create of a sandbox of one of them at the same time reads the version
// and writes what this reads, so one of the two runs again and sees the
// other's result.
func (s *Store) CollectTemplates(ctx context.Context, ids ...string) ([]store.Template, error) {
	var gone []store.Template
	// The view's check (As) after the lock, not before: its query would
	// take the snapshot.
	err := s.writeAt(ctx, pgx.Serializable, nil, func(tx pgx.Tx) error {
		// Placements (Place) record sandboxes at read committed, out of
		// the serializable checks: they take ROW EXCLUSIVE on sandboxes
		// before reading the versions they hold, and this SHARE, taken
		// before the transaction's snapshot, waits for them to commit
		// (and is seen) or makes them wait (and see the versions gone).
		if _, err := tx.Exec(ctx, `LOCK TABLE sandboxes IN SHARE MODE`); err != nil {
			return err
		}
		if err := s.as.check(ctx, tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `DELETE FROM template_versions v WHERE `+store.UnheldVersion+`
			AND (cardinality($1::text[]) = 0 OR v.id = ANY($1)) RETURNING `+versionColumns, validIDs(ids))
		if err != nil {
			return err
		}
		gone, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Template, error) {
			var t store.Template
			return t, scanVersion(row, nil, &t)
		})
		return err
	})
	return gone, err
}

// validIDs are ids without those no row can have, and never nil: an
// empty list of ids is all, and the ids given are all unstorable, none.
func validIDs(ids []string) []string {
	out := []string{}
	for _, id := range ids {
		if storable(id) {
			out = append(out, id)
		}
	}
	if len(out) == 0 && len(ids) > 0 {
		// Matches no version: an ID has no NUL.
		out = append(out, "\x01")
	}
	return out
}

// VersionUsers counts the sandboxes (not pooled ones) and snapshots made
// from each version: those of tenant t, or of every tenant if t is empty.
func (s *Store) VersionUsers(ctx context.Context, t string) (map[string]store.VersionUse, error) {
	sandboxes, err := s.counts(ctx, `SELECT template_version, COUNT(*) FROM sandboxes WHERE template_version <> ''
		AND state <> $2 AND ($1 = '' OR tenant = $1) GROUP BY template_version`, t, store.StatePooled)
	if err != nil {
		return nil, err
	}
	snapshots, err := s.counts(ctx, `SELECT template_version, COUNT(*) FROM snapshots WHERE template_version <> ''
		AND ($1 = '' OR tenant = $1) GROUP BY template_version`, t)
	if err != nil {
		return nil, err
	}
	return store.VersionUses(sandboxes, snapshots), nil
}

// TemplateUsers counts the sandboxes (not pooled ones) made from each
// template name: those of tenant t, or of every tenant if t is empty.
func (s *Store) TemplateUsers(ctx context.Context, t string) (map[string]int, error) {
	return s.counts(ctx, `SELECT template, COUNT(*) FROM sandboxes WHERE state <> $2 AND ($1 = '' OR tenant = $1)
		GROUP BY template`, t, store.StatePooled)
}

const versionColumns = `v.id, v.name, v.number, v.source, v.digest, v.layers, v.size, v.config, v.created_at`

func versions(ctx context.Context, q querier, where string, a ...any) ([]store.Template, error) {
	rows, err := q.Query(ctx, `SELECT `+versionColumns+` FROM template_versions v `+where, a...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Template, error) {
		var t store.Template
		return t, scanVersion(row, nil, &t)
	})
}

// scanVersion scans versionColumns into t, after a name first if name is
// not nil.
func scanVersion(row pgx.CollectableRow, name *string, t *store.Template) error {
	var layers, cfg string
	dest := []any{&t.ID, &t.Name, &t.Number, &t.Source, &t.Digest, &layers, &t.Size, &cfg, &t.CreatedAt}
	if name != nil {
		dest = append([]any{name}, dest...)
	}
	if err := row.Scan(dest...); err != nil {
		return err
	}
	t.CreatedAt = t.CreatedAt.UTC()
	if err := json.Unmarshal([]byte(layers), &t.Layers); err != nil {
		return err
	}
	return json.Unmarshal([]byte(cfg), &t.Config)
}
