package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// PutTemplate records t as a version of t.Name and points the name at it,
// in one transaction. A version of the same ID (the same content) is reused
// rather than recorded twice. It returns the version as recorded (ID,
// Number) and the ID of the version the name pointed to before ("" if
// none).
func (s *Store) PutTemplate(ctx context.Context, t store.Template) (store.Template, string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return t, "", err
	}
	defer tx.Rollback()
	t.ID = store.VersionID(t.Name, t.Layers, t.Config)
	if old, err := versions(ctx, tx, `WHERE id = ?`, t.ID); err != nil {
		return t, "", err
	} else if len(old) > 0 {
		t = old[0]
	} else {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(number), 0) + 1 FROM template_versions WHERE name = ?`, t.Name).Scan(&t.Number); err != nil {
			return t, "", err
		}
		layers, _ := json.Marshal(t.Layers)
		cfg, _ := json.Marshal(t.Config)
		if _, err := tx.ExecContext(ctx, `INSERT INTO template_versions (id, name, number, source, digest, layers, size, config, created_at)
			VALUES (?,?,?,?,?,?,?,?,?)`, t.ID, t.Name, t.Number, t.Source, t.Digest, string(layers), t.Size, string(cfg), unixNano(t.CreatedAt)); err != nil {
			return t, "", err
		}
	}
	prev, err := point(ctx, tx, t.Name, t.ID)
	if err != nil {
		return t, "", err
	}
	return t, prev, tx.Commit()
}

// PointTemplate points name at the existing version id (a second name for
// it) and returns the ID of the version name pointed to before.
func (s *Store) PointTemplate(ctx context.Context, name, id string) (string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	if err := versionExists(ctx, tx, id); err != nil {
		return "", err
	}
	prev, err := point(ctx, tx, name, id)
	if err != nil {
		return "", err
	}
	return prev, tx.Commit()
}

func point(ctx context.Context, tx *sql.Tx, name, id string) (string, error) {
	var prev string
	err := tx.QueryRowContext(ctx, `SELECT version FROM template_names WHERE name = ?`, name).Scan(&prev)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO template_names (name, version) VALUES (?, ?)
		ON CONFLICT(name) DO UPDATE SET version = excluded.version`, name, id)
	return prev, err
}

// versionExists returns errdefs.ErrNotFound unless version id exists; ""
// (the built-in template) always does.
func versionExists(ctx context.Context, tx *sql.Tx, id string) error {
	if id == "" {
		return nil
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM template_versions WHERE id = ?`, id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("template version %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// GetTemplate returns the version name points to.
func (s *Store) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	ts, err := versions(ctx, s.db, `WHERE id = (SELECT version FROM template_names WHERE name = ?)`, name)
	return store.Only(ts, err, "template "+name)
}

// GetTemplateVersion returns the version of name that ref names: its
// number, or its ID (of a version made under name or one name points to).
func (s *Store) GetTemplateVersion(ctx context.Context, name, ref string) (store.Template, error) {
	var ts []store.Template
	var err error
	if n, perr := strconv.Atoi(ref); perr == nil && n > 0 && strconv.Itoa(n) == ref {
		ts, err = versions(ctx, s.db, `WHERE name = ? AND number = ?`, name, n)
	} else if store.ValidVersionID(ref) {
		ts, err = versions(ctx, s.db, `WHERE id = ? AND (name = ? OR id = (SELECT version FROM template_names WHERE name = ?))`, ref, name, name)
	} else {
		return store.Template{}, fmt.Errorf("%w: a template version is a number or an ID of v and 19 hex digits", errdefs.ErrInvalid)
	}
	return store.Only(ts, err, "template "+name+"@"+ref)
}

// TemplateVersion returns version id.
func (s *Store) TemplateVersion(ctx context.Context, id string) (store.Template, error) {
	ts, err := versions(ctx, s.db, `WHERE id = ?`, id)
	return store.Only(ts, err, "template version "+id)
}

// ListTemplates returns every name with its current version, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]store.TemplateName, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT name, version FROM template_names ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var names, ids []string
	for rows.Next() {
		var n, id string
		if err := rows.Scan(&n, &id); err != nil {
			rows.Close()
			return nil, err
		}
		names, ids = append(names, n), append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	all, err := s.ListTemplateVersions(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]store.Template{}
	for _, v := range all {
		byID[v.ID] = v
	}
	out := make([]store.TemplateName, len(names))
	for i := range names {
		out[i] = store.TemplateName{Name: names[i], Current: byID[ids[i]]}
	}
	return out, nil
}

// ListTemplateVersions returns every version, by name and number.
func (s *Store) ListTemplateVersions(ctx context.Context) ([]store.Template, error) {
	return versions(ctx, s.db, `ORDER BY name, number`)
}

// DeleteTemplate removes name. Its versions stay while anything else holds
// them; CollectTemplates deletes the rest.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM template_names WHERE name = ?`, name)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

// CollectTemplates deletes the versions that no name, sandbox or snapshot
// holds (only among ids, if any are given) and returns them.
func (s *Store) CollectTemplates(ctx context.Context, ids ...string) ([]store.Template, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	where, args := `WHERE `+store.UnheldVersion, []any{}
	if len(ids) > 0 {
		where += ` AND v.id IN (?` + strings.Repeat(",?", len(ids)-1) + `)`
		for _, id := range ids {
			args = append(args, id)
		}
	}
	gone, err := versions(ctx, tx, `v `+where, args...)
	if err != nil || len(gone) == 0 {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM template_versions AS v `+where, args...); err != nil {
		return nil, err
	}
	return gone, tx.Commit()
}

// VersionUsers counts the sandboxes (not pooled ones) and snapshots made from
// each version: those of tenant t, or of every tenant if t is empty.
func (s *Store) VersionUsers(ctx context.Context, t string) (map[string]store.VersionUse, error) {
	sandboxes, err := s.counts(ctx, `SELECT template_version, COUNT(*) FROM sandboxes WHERE template_version != ''
		AND state != '`+store.StatePooled+`' AND (? = '' OR tenant = ?) GROUP BY template_version`, t, t)
	if err != nil {
		return nil, err
	}
	snapshots, err := s.counts(ctx, `SELECT template_version, COUNT(*) FROM snapshots WHERE template_version != ''
		AND (? = '' OR tenant = ?) GROUP BY template_version`, t, t)
	if err != nil {
		return nil, err
	}
	return store.VersionUses(sandboxes, snapshots), nil
}

// TemplateUsers counts the sandboxes made from each template name: those of
// tenant t, or of every tenant if t is empty.
func (s *Store) TemplateUsers(ctx context.Context, t string) (map[string]int, error) {
	return s.counts(ctx, `SELECT template, COUNT(*) FROM sandboxes WHERE state != '`+store.StatePooled+`' AND (? = '' OR tenant = ?)
		GROUP BY template`, t, t)
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func versions(ctx context.Context, q querier, where string, args ...any) ([]store.Template, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, name, number, source, digest, layers, size, config, created_at
		FROM template_versions `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Template
	for rows.Next() {
		var t store.Template
		var layers, cfg string
		var created int64
		if err := rows.Scan(&t.ID, &t.Name, &t.Number, &t.Source, &t.Digest, &layers, &t.Size, &cfg, &created); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(layers), &t.Layers); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(cfg), &t.Config); err != nil {
			return nil, err
		}
		t.CreatedAt = fromUnixNano(created)
		out = append(out, t)
	}
	return out, rows.Err()
}

// migrateTemplates turns the templates table of an older version (one row
// per name, no versions) into versions: each template becomes version 1 of
// its name, and the sandboxes and snapshots made from it hold that version.
// It is one transaction: a crash leaves the old table or the new ones.
func migrateTemplates(db *sql.DB) error {
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'templates'`).Scan(&n); err != nil || n == 0 {
		return err
	}
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	rows, err := tx.Query(`SELECT name, source, digest, layers, size, config, created_at FROM templates`)
	if err != nil {
		return err
	}
	var old []store.Template
	for rows.Next() {
		var t store.Template
		var layers, cfg string
		var created int64
		if err := rows.Scan(&t.Name, &t.Source, &t.Digest, &layers, &t.Size, &cfg, &created); err != nil {
			rows.Close()
			return err
		}
		if json.Unmarshal([]byte(layers), &t.Layers) != nil || json.Unmarshal([]byte(cfg), &t.Config) != nil {
			rows.Close()
			return fmt.Errorf("template %s: unreadable row", t.Name)
		}
		t.CreatedAt = fromUnixNano(created)
		old = append(old, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range old {
		id := store.VersionID(t.Name, t.Layers, t.Config)
		layers, _ := json.Marshal(t.Layers)
		cfg, _ := json.Marshal(t.Config)
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO template_versions (id, name, number, source, digest, layers, size, config, created_at) VALUES (?,?,1,?,?,?,?,?,?)`,
				[]any{id, t.Name, t.Source, t.Digest, string(layers), t.Size, string(cfg), unixNano(t.CreatedAt)}},
			{`INSERT INTO template_names (name, version) VALUES (?, ?)`, []any{t.Name, id}},
			{`UPDATE sandboxes SET template_version = ? WHERE template = ? AND template_version = ''`, []any{id, t.Name}},
			{`UPDATE snapshots SET template_version = ? WHERE template = ? AND template_version = ''`, []any{id, t.Name}},
		} {
			if _, err := tx.Exec(q.sql, q.args...); err != nil {
				return fmt.Errorf("template %s: %w", t.Name, err)
			}
		}
	}
	if _, err := tx.Exec(`DROP TABLE templates`); err != nil {
		return err
	}
	return tx.Commit()
}
