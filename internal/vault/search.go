package vault

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Limits of a query.
const (
	// MaxQuery bounds a search query, in bytes.
	MaxQuery = 1000
	// DefaultSearchLimit and MaxSearchLimit bound the hits of a search.
	DefaultSearchLimit = 20
	MaxSearchLimit     = 200
)

// Search finds the notes of vault name's main branch that match q, in
// SQLite FTS5's query syntax (words, "phrases", prefix*, AND, OR, NOT,
// NEAR(...), title:word), best first; at most limit (0: the default).
// A query FTS5 cannot parse is errdefs.ErrInvalid.
func (s *Service) Search(ctx context.Context, name, q string, limit int) (api.VaultSearch, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.VaultSearch{}, err
	}
	switch {
	case strings.TrimSpace(q) == "":
		return api.VaultSearch{}, fmt.Errorf("%w: an empty search query", errdefs.ErrInvalid)
	case len(q) > MaxQuery:
		return api.VaultSearch{}, fmt.Errorf("%w: the search query is longer than %d bytes", errdefs.ErrInvalid, MaxQuery)
	case !utf8.ValidString(q) || strings.ContainsRune(q, 0):
		return api.VaultSearch{}, fmt.Errorf("%w: the search query is not text", errdefs.ErrInvalid)
	}
	if limit <= 0 {
		limit = DefaultSearchLimit
	}
	limit = min(limit, MaxSearchLimit)
	out := api.VaultSearch{Hits: []api.VaultSearchHit{}}
	out.Commit, err = s.query(ctx, v, func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `
SELECT n.path, n.title, n.type, n.tags, n.updated, snippet(fts, 1, '**', '**', '…', 16), rank
FROM fts JOIN notes n ON n.rowid = fts.rowid
WHERE fts MATCH ? ORDER BY rank LIMIT ?`, q, limit)
		if err != nil {
			return queryError(err)
		}
		defer rows.Close()
		for rows.Next() {
			var h api.VaultSearchHit
			var tags string
			if err := rows.Scan(&h.Path, &h.Title, &h.Type, &tags, &h.Updated, &h.Snippet, &h.Score); err != nil {
				return err
			}
			json.Unmarshal([]byte(tags), &h.Tags)
			h.Score = -h.Score // bm25 is lower for better matches
			out.Hits = append(out.Hits, h)
		}
		return queryError(rows.Err())
	})
	return out, err
}

// queryError is FTS5's refusal of a query (SQLITE_ERROR: a syntax error,
// an unknown column) as errdefs.ErrInvalid, with FTS5's message.
func queryError(err error) error {
	var se *msqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_ERROR {
		msg := se.Error()
		if _, m, ok := strings.Cut(msg, "SQL logic error: "); ok {
			msg = m
		}
		return fmt.Errorf("%w: search query: %.200s (the syntax is SQLite FTS5's: quote words with \" to match them literally)", errdefs.ErrInvalid, msg)
	}
	return err
}

// Links returns the link graph of vault name's main branch: with a path,
// that note, its links and its backlinks; without, every broken link.
func (s *Service) Links(ctx context.Context, name, p string) (api.VaultLinks, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.VaultLinks{}, err
	}
	if p != "" {
		if err := CheckPath(p); err != nil {
			return api.VaultLinks{}, err
		}
	}
	var out api.VaultLinks
	out.Commit, err = s.query(ctx, v, func(db *sql.DB) error {
		if p == "" {
			var err error
			out.Broken, err = links(ctx, db, `SELECT src, target, '' FROM links WHERE dst IS NULL ORDER BY src, target`)
			return err
		}
		var n api.VaultNote
		var tags string
		err := db.QueryRowContext(ctx, `SELECT path, title, type, tags, updated FROM notes WHERE path = ?`, p).
			Scan(&n.Path, &n.Title, &n.Type, &tags, &n.Updated)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: no note %.200s in vault %s", errdefs.ErrNotFound, p, v.Name)
		}
		if err != nil {
			return err
		}
		json.Unmarshal([]byte(tags), &n.Tags)
		out.Note = &n
		if out.Links, err = links(ctx, db, `SELECT src, target, coalesce(dst, '') FROM links WHERE src = ? ORDER BY rowid`, p); err != nil {
			return err
		}
		out.Backlinks, err = links(ctx, db, `SELECT src, target, dst FROM links WHERE dst = ? ORDER BY src, target`, p)
		return err
	})
	if err == nil && p != "" && out.Commit == "" {
		err = fmt.Errorf("%w: no note %.200s in vault %s (it has no commits)", errdefs.ErrNotFound, p, v.Name)
	}
	return out, err
}

func links(ctx context.Context, db *sql.DB, q string, args ...any) ([]api.VaultLink, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.VaultLink
	for rows.Next() {
		var l api.VaultLink
		if err := rows.Scan(&l.From, &l.Target, &l.To); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}
