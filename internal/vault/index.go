package vault

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"

	_ "modernc.org/sqlite" // the "sqlite" driver, with FTS5
)

// The index. A vault's search index and link graph are derived data: a
// SQLite file (FTS5 for the text) built from the Markdown files of one
// commit of the main branch, read from the cache repository, and kept in
// that repository's directory (Dir/<id>.git/atoll-index.db), so it never
// has to be durable: a node that lacks it, or has one of an older commit,
// builds it again from the vault's durable truth, as every node of a
// cluster does for itself.
//
// After every push through this node a build of the new head starts in
// the background (the push's acknowledgement does not wait for it); a
// search or a links query reads the head from the store and waits, at
// most MaxIndexWait, for the index of that commit, starting its build if
// none is under way, so that a search right after a push sees the push.

// Limits of the index.
const (
	// MaxIndexedNote is how much of a note is indexed: its first bytes.
	MaxIndexedNote = 1 << 20
	// MaxIndexedNotes bounds the notes of one index; the rest (in git's
	// path order) are not searchable.
	MaxIndexedNotes = 200_000
	// MaxIndexWait bounds how long a query waits for the index of the
	// vault's head before it answers unavailable.
	MaxIndexWait = 30 * time.Second
	// indexBuildTimeout bounds one build.
	indexBuildTimeout = 10 * time.Minute
)

const indexFile = "atoll-index.db"

// indexSchema is the index's tables. notes and fts share their rowids.
// fts's rank is BM25 with a title match worth ten of the body's.
const indexSchema = `
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE notes (path TEXT NOT NULL UNIQUE, title TEXT NOT NULL, type TEXT NOT NULL,
	tags TEXT NOT NULL, updated TEXT NOT NULL, size INTEGER NOT NULL);
CREATE VIRTUAL TABLE fts USING fts5(title, body, tokenize='porter unicode61', prefix='2 3');
CREATE TABLE links (src TEXT NOT NULL, target TEXT NOT NULL, dst TEXT);
CREATE INDEX links_src ON links (src);
CREATE INDEX links_dst ON links (dst);
INSERT INTO fts (fts, rank) VALUES ('rank', 'bm25(10.0, 1.0)');
`

// indexes are the indexes this node keeps, by vault ID.
type indexes struct {
	ctx    context.Context // the builds'; cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the builds

	// mu guards byID and closed, which close sets before it waits for
	// wg: no build starts after.
	mu     sync.Mutex
	byID   map[string]*index
	closed bool
}

func newIndexes() *indexes {
	ctx, cancel := context.WithCancel(context.Background())
	return &indexes{ctx: ctx, cancel: cancel, byID: map[string]*index{}}
}

// index is one vault's.
type index struct {
	// use is held shared by queries on db, exclusively to replace it.
	use sync.RWMutex

	// mu guards the fields below.
	mu       sync.Mutex
	db       *sql.DB // nil until the first build or open
	commit   string  // what db was built from
	want     string  // the newest commit asked for
	building bool
	// failed is the commit whose last build failed: a query for it
	// answers unavailable once rather than wait for another build.
	failed string
	// changed is closed, and replaced, at the end of each build.
	changed chan struct{}
	dropped bool
}

func (x *indexes) get(id string) *index {
	x.mu.Lock()
	defer x.mu.Unlock()
	ix := x.byID[id]
	if ix == nil {
		ix = &index{changed: make(chan struct{})}
		x.byID[id] = ix
	}
	return ix
}

// drop forgets vault id's index (the vault is deleted).
func (x *indexes) drop(id string) {
	x.mu.Lock()
	ix := x.byID[id]
	delete(x.byID, id)
	x.mu.Unlock()
	if ix != nil {
		ix.mu.Lock()
		ix.dropped = true
		ix.use.Lock()
		if ix.db != nil {
			ix.db.Close()
			ix.db = nil
		}
		ix.use.Unlock()
		ix.mu.Unlock()
	}
}

// close stops the builds, waits for them and closes the indexes.
func (x *indexes) close() {
	x.mu.Lock()
	x.closed = true
	x.mu.Unlock()
	x.cancel()
	x.wg.Wait()
	x.mu.Lock()
	ids := make([]string, 0, len(x.byID))
	for id := range x.byID {
		ids = append(ids, id)
	}
	x.mu.Unlock()
	for _, id := range ids {
		x.drop(id)
	}
}

// head is the commit of v's main branch in the store; "" if it has none.
func (s *Service) head(ctx context.Context, v store.Vault) (string, error) {
	refs, _, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return "", err
	}
	return refs[mainRef], nil
}

// indexSoon starts building the index of v's head in the background,
// after a push: the push's answer waits for none of it, not even the
// store's read of the head.
func (s *Service) indexSoon(v store.Vault) {
	s.idx.mu.Lock()
	if s.idx.closed {
		s.idx.mu.Unlock()
		return
	}
	s.idx.wg.Add(1)
	s.idx.mu.Unlock()
	go func() {
		defer s.idx.wg.Done()
		s.indexHead(v)
	}()
}

// indexHead starts building the index of v's head unless it is built or
// being built.
func (s *Service) indexHead(v store.Vault) {
	ctx, cancel := context.WithTimeout(s.idx.ctx, 10*time.Second)
	defer cancel()
	head, err := s.head(ctx, v)
	if err != nil || head == "" {
		return
	}
	ix := s.idx.get(v.ID)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.commit != head {
		s.startBuild(v, ix, head)
	}
}

// startBuild asks for the index of commit; the caller holds ix.mu.
func (s *Service) startBuild(v store.Vault, ix *index, commit string) {
	ix.want = commit
	if ix.building || ix.dropped {
		return // the build under way goes on to ix.want when it ends
	}
	s.idx.mu.Lock()
	if s.idx.closed {
		s.idx.mu.Unlock()
		return
	}
	s.idx.wg.Add(1)
	s.idx.mu.Unlock()
	ix.building = true
	go func() {
		defer s.idx.wg.Done()
		s.buildLoop(v, ix)
	}()
}

// buildLoop builds ix for ix.want until it is built for the newest
// commit asked for.
func (s *Service) buildLoop(v store.Vault, ix *index) {
	for {
		ix.mu.Lock()
		commit := ix.want
		ix.mu.Unlock()
		ctx, cancel := context.WithTimeout(s.idx.ctx, indexBuildTimeout)
		start := time.Now()
		db, notes, err := s.openOrBuild(ctx, v, commit)
		cancel()
		ix.mu.Lock()
		if err == nil && !ix.dropped {
			ix.use.Lock()
			old := ix.db
			ix.db, ix.commit = db, commit
			ix.use.Unlock()
			if old != nil {
				old.Close()
			}
			ix.failed = ""
			s.log.Info("vault index ready", "vault", v.ID, "commit", commit, "notes", notes, "ms", time.Since(start).Milliseconds())
		} else if err == nil {
			db.Close()
		} else {
			ix.failed = commit
			s.log.Warn("building a vault's index", "vault", v.ID, "commit", commit, "err", err)
		}
		close(ix.changed)
		ix.changed = make(chan struct{})
		if ix.want == commit || ix.dropped || s.idx.ctx.Err() != nil {
			ix.building = false
			ix.mu.Unlock()
			return
		}
		ix.mu.Unlock()
	}
}

// query runs f on the index of v's head, waiting for it (MaxIndexWait at
// most); f is not run, and commit is "", while v has no commits.
func (s *Service) query(ctx context.Context, v store.Vault, f func(db *sql.DB) error) (commit string, err error) {
	deadline := time.NewTimer(MaxIndexWait)
	defer deadline.Stop()
	ix := s.idx.get(v.ID)
	for {
		head, err := s.head(ctx, v)
		if err != nil || head == "" {
			return "", err
		}
		ix.mu.Lock()
		if ix.commit == head && ix.db != nil {
			ix.use.RLock()
			db := ix.db
			ix.mu.Unlock()
			err := f(db)
			ix.use.RUnlock()
			return head, err
		}
		if ix.failed == head && !ix.building {
			// (logged by buildLoop: its error may name host paths)
			ix.failed = "" // the next query tries again
			ix.mu.Unlock()
			return "", fmt.Errorf("%w: vault %s's index could not be built", errdefs.ErrUnavailable, v.Name)
		}
		s.startBuild(v, ix, head)
		if !ix.building { // closed, or the vault deleted
			ix.mu.Unlock()
			return "", fmt.Errorf("%w: vault %s's index is not served now", errdefs.ErrUnavailable, v.Name)
		}
		changed := ix.changed
		ix.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return "", ctx.Err()
		case <-deadline.C:
			return "", fmt.Errorf("%w: vault %s's index is still being built; try again", errdefs.ErrUnavailable, v.Name)
		}
	}
}

// openOrBuild opens v's index file if it was built from commit, else
// makes the index of commit in a new file that then replaces the old
// one: from the old one, changed by the files that differ between the two
// commits (a push of one note changes one note's rows, whatever the
// vault's size), or, without an old one or if that fails, from every
// file of commit. Either way from the cache repository.
func (s *Service) openOrBuild(ctx context.Context, v store.Vault, commit string) (*sql.DB, int, error) {
	p := filepath.Join(s.repoDir(v.ID), indexFile)
	old := ""
	if db, err := openIndex(p); err == nil {
		var n int
		err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'commit'`).Scan(&old)
		if err == nil && old == commit {
			if err = db.QueryRowContext(ctx, `SELECT count(*) FROM notes`).Scan(&n); err == nil {
				return db, n, nil
			}
		}
		db.Close()
	}
	dir, err := s.ready(ctx, v)
	if err != nil {
		return nil, 0, err
	}
	// What a build that crashed left; builds of one vault never overlap
	// (buildLoop), so none is under way.
	if left, _ := filepath.Glob(p + ".tmp-*"); len(left) > 0 {
		for _, f := range left {
			os.Remove(f)
		}
	}
	tmp := p + ".tmp-" + newID()
	defer os.Remove(tmp)
	n := -1
	if old != "" {
		if n, err = s.updateIndex(ctx, dir, p, tmp, old, commit); err != nil {
			s.log.Warn("updating a vault's index; building it anew", "vault", v.ID, "from", old, "to", commit, "err", err)
			n = -1
		}
	}
	if n < 0 {
		os.Remove(tmp)
		if n, err = s.buildIndex(ctx, dir, tmp, commit); err != nil {
			return nil, 0, fmt.Errorf("indexing vault %s at %s: %w", v.ID, commit, err)
		}
	}
	if err := os.Rename(tmp, p); err != nil {
		return nil, 0, err
	}
	db, err := openIndex(p)
	return db, n, err
}

func openIndex(p string) (*sql.DB, error) {
	if _, err := os.Stat(p); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", "file:"+p+"?mode=ro&_pragma=query_only(1)")
	if err != nil {
		return nil, err
	}
	return db, db.Ping()
}

// openScratch opens the index file at p for writing: derived, so with no
// journal and no fsync.
func openScratch(p string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(OFF)&_pragma=synchronous(OFF)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// blobEntry is a Markdown file of a tree.
type blobEntry struct{ oid, path string }

// isNote reports whether a tree entry of mode and path is one the index
// reads: a regular file (never a symlink or a submodule) named *.md.
func isNote(mode, path string) bool {
	return (mode == "100644" || mode == "100755") && strings.HasSuffix(strings.ToLower(path), ".md")
}

// mdFiles lists the Markdown files of commit, in git's order.
func (s *Service) mdFiles(ctx context.Context, dir, commit string) ([]blobEntry, error) {
	out, err := s.run(ctx, dir, nil, nil, "ls-tree", "-r", "-z", "--end-of-options", commit)
	if err != nil {
		return nil, err
	}
	var files []blobEntry
	for _, rec := range strings.Split(string(out), "\x00") {
		meta, p, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 || f[1] != "blob" || !isNote(f[0], p) {
			continue
		}
		files = append(files, blobEntry{oid: f[2], path: p})
		if len(files) == MaxIndexedNotes {
			break
		}
	}
	return files, nil
}

// buildIndex writes the index of commit of the repository at dir into a
// new file at p, and returns the number of notes.
func (s *Service) buildIndex(ctx context.Context, dir, p, commit string) (int, error) {
	files, err := s.mdFiles(ctx, dir, commit)
	if err != nil {
		return 0, err
	}
	db, err := openScratch(p)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, indexSchema); err != nil {
		return 0, err
	}
	return s.writeIndex(ctx, db, dir, commit, nil, files)
}

// updateIndex writes the index of commit into a new file at p: a copy of
// the index of commit old at from, changed by the Markdown files that
// differ between the two.
func (s *Service) updateIndex(ctx context.Context, dir, from, p, old, commit string) (int, error) {
	out, err := s.run(ctx, dir, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--end-of-options", old, commit)
	if err != nil {
		return 0, err
	}
	// :oldmode newmode oldoid newoid status NUL path NUL, for each file.
	var gone []string
	var files []blobEntry
	recs := strings.Split(string(out), "\x00")
	for i := 0; i+1 < len(recs); i += 2 {
		f := strings.Fields(strings.TrimPrefix(recs[i], ":"))
		if len(f) != 5 {
			return 0, fmt.Errorf("git diff-tree answered %.100q", recs[i])
		}
		path := recs[i+1]
		if isNote(f[0], path) {
			gone = append(gone, path)
		}
		if isNote(f[1], path) {
			files = append(files, blobEntry{oid: f[3], path: path})
		}
	}
	if err := copyFile(from, p); err != nil {
		return 0, err
	}
	db, err := openScratch(p)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	return s.writeIndex(ctx, db, dir, commit, gone, files)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// writeIndex removes the notes at paths gone from the index db, adds
// files, resolves every link again (a note's title or path changed
// resolves other notes' links), and marks db as commit's, in one
// transaction. It returns the number of notes.
func (s *Service) writeIndex(ctx context.Context, db *sql.DB, dir, commit string, gone []string, files []blobEntry) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	for _, p := range gone {
		for _, q := range []string{
			`DELETE FROM fts WHERE rowid = (SELECT rowid FROM notes WHERE path = ?)`,
			`DELETE FROM notes WHERE path = ?`,
			`DELETE FROM links WHERE src = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, p); err != nil {
				return 0, err
			}
		}
	}
	insNote, err := tx.PrepareContext(ctx, `INSERT INTO notes (path, title, type, tags, updated, size) VALUES (?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return 0, err
	}
	insText, err := tx.PrepareContext(ctx, `INSERT INTO fts (rowid, title, body) VALUES (?, ?, ?)`)
	if err != nil {
		return 0, err
	}
	insLink, err := tx.PrepareContext(ctx, `INSERT INTO links (src, target) VALUES (?, ?)`)
	if err != nil {
		return 0, err
	}
	err = s.readBlobs(ctx, dir, files, func(i int, content string, size int64) error {
		n := parseNote(files[i].path, content)
		tags, _ := json.Marshal(n.Tags)
		res, err := insNote.ExecContext(ctx, n.Path, n.Title, n.Type, string(tags), n.Updated, size)
		if err != nil {
			return err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if _, err := insText.ExecContext(ctx, id, n.Title, n.Body); err != nil {
			return err
		}
		for _, t := range n.Links {
			if _, err := insLink.ExecContext(ctx, n.Path, t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var count int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM notes`).Scan(&count); err != nil {
		return 0, err
	}
	if count > MaxIndexedNotes {
		return 0, fmt.Errorf("%d notes, more than the %d an index holds", count, MaxIndexedNotes)
	}
	if err := resolveLinks(ctx, tx); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO meta (key, value) VALUES ('commit', ?)`, commit); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return count, db.Close()
}

// resolveLinks sets every link's dst to the note it resolves to now,
// writing only the links whose answer changed.
func resolveLinks(ctx context.Context, tx *sql.Tx) error {
	var notes []note
	rows, err := tx.QueryContext(ctx, `SELECT path, title FROM notes`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var n note
		if err := rows.Scan(&n.Path, &n.Title); err != nil {
			rows.Close()
			return err
		}
		notes = append(notes, n)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	r := newResolver(notes)
	type change struct {
		rowid int64
		dst   any
	}
	var changes []change
	rows, err = tx.QueryContext(ctx, `SELECT rowid, target, coalesce(dst, '') FROM links`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c change
		var target, dst string
		if err := rows.Scan(&c.rowid, &target, &dst); err != nil {
			rows.Close()
			return err
		}
		if now := r.resolve(target); now != dst {
			if c.dst = now; now == "" {
				c.dst = nil
			}
			changes = append(changes, c)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	for _, c := range changes {
		if _, err := tx.ExecContext(ctx, `UPDATE links SET dst = ? WHERE rowid = ?`, c.dst, c.rowid); err != nil {
			return err
		}
	}
	return nil
}

// readBlobs hands f the first MaxIndexedNote bytes of each of files, and
// its size, read with one git cat-file --batch, in order.
func (s *Service) readBlobs(ctx context.Context, dir string, files []blobEntry, f func(i int, content string, size int64) error) error {
	if len(files) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := s.command(ctx, dir, nil, "cat-file", "--batch")
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		w := bufio.NewWriter(in)
		for _, e := range files {
			w.WriteString(e.oid + "\n")
		}
		w.Flush()
		in.Close()
	}()
	br := bufio.NewReaderSize(out, 1<<16)
	buf := make([]byte, MaxIndexedNote)
	readErr := func() error {
		for i, e := range files {
			head, err := br.ReadString('\n')
			if err != nil {
				return fmt.Errorf("reading %s: %w", e.path, err)
			}
			h := strings.Fields(head)
			if len(h) != 3 || h[0] != e.oid || h[1] != "blob" {
				return fmt.Errorf("reading %s: git cat-file answered %.100q", e.path, head)
			}
			size, _ := strconv.ParseInt(h[2], 10, 64)
			n := min(size, MaxIndexedNote)
			if _, err := io.ReadFull(br, buf[:n]); err != nil {
				return fmt.Errorf("reading %s: %w", e.path, err)
			}
			// The rest of a big note, and the newline that ends each.
			if _, err := br.Discard(int(size-n) + 1); err != nil {
				return fmt.Errorf("reading %s: %w", e.path, err)
			}
			if err := f(i, strings.ToValidUTF8(string(buf[:n]), "\uFFFD"), size); err != nil {
				return err
			}
		}
		return nil
	}()
	if readErr != nil {
		cancel()
	}
	return errors.Join(readErr, ignoreKilled(readErr, cmd.Wait()))
}

// ignoreKilled drops the error of a git that was killed because reading
// its output had failed already.
func ignoreKilled(readErr, waitErr error) error {
	if readErr != nil {
		return nil
	}
	return waitErr
}
