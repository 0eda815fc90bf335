// Package sqlite is the store (package store) of one machine: an embedded
// SQLite database (modernc.org/sqlite, no cgo) in WAL mode with
// synchronous=FULL, so a committed change survives a crash of the process or
// the machine. Its sandbox writes share commits (group.go).
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	msqlite "modernc.org/sqlite" // and registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Store is the database.
type Store struct {
	// db is the one writing connection; rdb serves reads on connections of
	// their own, which in WAL mode never wait for a write's commit.
	db, rdb *sql.DB

	// writes feed the group commit (group.go), which ends when closing is
	// closed and then closes stopped.
	writes           chan write
	closing, stopped chan struct{}
	// commits counts the group commit's transactions, gathered those that
	// waited for more writes, for its tests.
	commits, gathered atomic.Int64
}

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	state TEXT NOT NULL,
	template TEXT NOT NULL,
	runtime TEXT NOT NULL,
	cpu REAL NOT NULL,
	memory_mib INTEGER NOT NULL,
	disk_gib INTEGER NOT NULL,
	pids INTEGER NOT NULL,
	env TEXT NOT NULL,
	labels TEXT NOT NULL,
	error TEXT NOT NULL DEFAULT '',
	slot INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	started_at INTEGER,
	stopped_at INTEGER,
	pid INTEGER NOT NULL DEFAULT 0,
	start_time INTEGER NOT NULL DEFAULT 0,
	socket TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS transitions (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL,
	from_state TEXT NOT NULL,
	to_state TEXT NOT NULL,
	reason TEXT NOT NULL DEFAULT '',
	at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_sandbox ON transitions(sandbox_id);
CREATE TABLE IF NOT EXISTS template_versions (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	number INTEGER NOT NULL,
	source TEXT NOT NULL,
	digest TEXT NOT NULL,
	layers TEXT NOT NULL,
	size INTEGER NOT NULL,
	config TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (name, number)
);
CREATE TABLE IF NOT EXISTS template_names (
	name TEXT PRIMARY KEY,
	version TEXT NOT NULL REFERENCES template_versions(id)
);
CREATE TABLE IF NOT EXISTS snapshots (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	template TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
	hash TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL
);
`

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	// The database holds sandboxes' environments: readable by root only.
	// SQLite gives its -wal and -shm files the database file's mode.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating database: %w", err)
	}
	f.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, err
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	dsn := "file:" + path + "?" + q.Encode()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	// One connection: SQLite has one writer anyway, and this keeps
	// read-modify-write transactions free of SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating schema: %w", err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrating schema: %w", err)
	}
	q.Add("_pragma", "query_only(1)")
	rdb, err := sql.Open(driverName, "file:"+path+"?"+q.Encode())
	if err != nil {
		db.Close()
		return nil, err
	}
	rdb.SetMaxOpenConns(readConns)
	s := &Store{db: db, rdb: rdb, writes: make(chan write), closing: make(chan struct{}), stopped: make(chan struct{})}
	go s.commitLoop()
	return s, nil
}

// readConns is how many reads may run at once.
const readConns = 4

// Close closes the database, once the writes under way are committed.
func (s *Store) Close() error {
	close(s.closing)
	<-s.stopped
	return errors.Join(s.rdb.Close(), s.db.Close())
}

// added are columns later versions added to tables, with their definitions.
var added = []struct{ table, column, def string }{
	{"sandboxes", "timeout_sec", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "expires_at", "INTEGER"},
	{"sandboxes", "ephemeral", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "auto_delete_sec", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "auto_stop_sec", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "from_snapshot", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "auto_archive_sec", "INTEGER NOT NULL DEFAULT 0"},
	{"snapshots", "state", "TEXT NOT NULL DEFAULT 'ready'"},
	{"sandboxes", "egress", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "public_ports", "INTEGER NOT NULL DEFAULT 0"},
	// Tenants: what older versions made is the first key's, the default
	// tenant's (tenant.Default).
	{"sandboxes", "tenant", "TEXT NOT NULL DEFAULT 'default'"},
	{"snapshots", "tenant", "TEXT NOT NULL DEFAULT 'default'"},
	{"api_keys", "name", "TEXT NOT NULL DEFAULT ''"},
	{"api_keys", "tenant", "TEXT NOT NULL DEFAULT 'default'"},
	// Template versions (see templates.go): '' is the built-in template,
	// which has none; migrateTemplates fills them in for older rows.
	{"sandboxes", "template_version", "TEXT NOT NULL DEFAULT ''"},
	{"snapshots", "template_version", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "auto_resume", "INTEGER NOT NULL DEFAULT 0"},
	// Cluster mode: the node that runs it ('' on one machine), and the
	// state a lost sandbox was in.
	{"sandboxes", "node", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "lost_from", "TEXT NOT NULL DEFAULT ''"},
	// The placement record (store.Sandbox.Placement), JSON; '' for none,
	// as every sandbox of one machine.
	{"sandboxes", "placement", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "checkpoint_every_sec", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "checkpointed_at", "INTEGER"},
	// The vaults cloned into it (api.Sandbox.Vaults), JSON; '' for none.
	{"sandboxes", "vaults", "TEXT NOT NULL DEFAULT ''"},
}

// migrate adds the columns a database made by an older version lacks, and
// turns its templates into versions.
func migrate(db *sql.DB) error {
	if err := addColumns(db); err != nil {
		return err
	}
	if err := slotPerNode(db); err != nil {
		return err
	}
	// Collection asks, per version, whether a sandbox or snapshot holds it.
	// A slot is unique among its node's sandboxes; ListNode reads a node's.
	if _, err := db.Exec(`CREATE INDEX IF NOT EXISTS sandboxes_template_version ON sandboxes(template_version);
		CREATE INDEX IF NOT EXISTS snapshots_template_version ON snapshots(template_version);
		CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_node_slot ON sandboxes(node, slot);
		CREATE INDEX IF NOT EXISTS sandboxes_node ON sandboxes(node, created_at, id)`); err != nil {
		return err
	}
	if err := migrateTemplates(db); err != nil {
		return err
	}
	if _, err := db.Exec(tenantsSchema); err != nil {
		return err
	}
	// Memory vaults (vaults.go).
	if _, err := db.Exec(vaultSchema); err != nil {
		return err
	}
	// Usage metering (usage.go).
	if _, err := db.Exec(usageSchema); err != nil {
		return err
	}
	// The journal (journal.go), last.
	_, err := db.Exec(journalSchema)
	return err
}

// slotPerNode rebuilds a sandboxes table made before cluster mode, whose
// slot column is unique across the table, without that constraint (the
// unique index on node and slot replaces it): SQLite cannot drop a
// column's UNIQUE, so the table is made again under its own definition
// less that word, its rows copied over, in one transaction (SQLite's own
// recipe for a changed table).
func slotPerNode(db *sql.DB) error {
	var def string
	if err := db.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'`).Scan(&def); err != nil {
		return err
	}
	const old = "slot INTEGER NOT NULL UNIQUE"
	if !strings.Contains(def, old) {
		return nil
	}
	def = strings.Replace(def, old, "slot INTEGER NOT NULL", 1)
	def = strings.Replace(def, "CREATE TABLE sandboxes", "CREATE TABLE sandboxes_new", 1)
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, q := range []string{def, `INSERT INTO sandboxes_new SELECT * FROM sandboxes`, `DROP TABLE sandboxes`,
		`ALTER TABLE sandboxes_new RENAME TO sandboxes`} {
		if _, err := tx.Exec(q); err != nil {
			return fmt.Errorf("rebuilding sandboxes: %w", err)
		}
	}
	return tx.Commit()
}

func addColumns(db *sql.DB) error {
	for _, a := range added {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, a.table, a.column).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := db.Exec(`ALTER TABLE ` + a.table + ` ADD COLUMN ` + a.column + ` ` + a.def); err != nil {
				return err
			}
		}
	}
	return nil
}

const columns = `id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, error,
	slot, created_at, started_at, stopped_at, pid, start_time, socket,
	timeout_sec, expires_at, ephemeral, auto_delete_sec, auto_stop_sec, from_snapshot,
	auto_archive_sec, egress, public_ports, tenant, template_version, auto_resume, node, lost_from, checkpoint_every_sec, checkpointed_at, vaults`

// Create inserts a new sandbox, choosing its slot (the lowest one free), and
// records its first state.
func (s *Store) Create(ctx context.Context, sb *store.Sandbox) error {
	slot, tenant := sb.Slot, sb.Tenant
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return create(ctx, tx, sb) })
	if err != nil {
		// Undone: sb is as it came.
		sb.Slot, sb.Tenant = slot, tenant
	}
	return err
}

func create(ctx context.Context, tx *sql.Tx, sb *store.Sandbox) error {
	slot, err := freeSlot(ctx, tx, sb.Node)
	if err != nil {
		return err
	}
	if err := checkText(sb); err != nil {
		return err
	}
	sb.Slot = slot
	sb.Tenant = tenantOf(sb.Tenant)
	// In the transaction that holds the version: a collection of it
	// cannot slip in between.
	if err := versionExists(ctx, tx, sb.TemplateVersion); err != nil {
		return err
	}
	if err := admit(ctx, tx, sb, store.Resources{}); err != nil {
		return err
	}
	env, _ := json.Marshal(orEmpty(sb.Env))
	labels, _ := json.Marshal(orEmpty(sb.Labels))
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes (`+columns+`, placement) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sb.ID, sb.State, sb.Template, sb.Runtime, sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.PIDs,
		string(env), string(labels), sb.Error, sb.Slot, unixNano(sb.CreatedAt),
		nanos(sb.StartedAt), nanos(sb.StoppedAt), sb.PID, int64(sb.StartTime), sb.Socket,
		sb.TimeoutSec, nanos(sb.ExpiresAt), sb.Ephemeral, sb.AutoDeleteSec, sb.AutoStopSec, sb.FromSnapshot,
		sb.AutoArchiveSec, policyJSON(sb.Policy), sb.Ports.Public, tenantOf(sb.Tenant), sb.TemplateVersion, sb.AutoResume,
		sb.Node, sb.LostFrom, sb.CheckpointEverySec, nanos(sb.CheckpointedAt), store.VaultsJSON(sb.Vaults), string(sb.Placement))
	if err != nil {
		return fmt.Errorf("inserting sandbox: %w", uniqueConflict(err, "sandbox "+sb.ID))
	}
	return transition(ctx, tx, sb.ID, "", sb.State, "")
}

// freeSlot is the lowest slot no sandbox of node holds.
func freeSlot(ctx context.Context, tx *sql.Tx, node string) (int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT slot FROM sandboxes WHERE node = ? ORDER BY slot`, node)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	slot := 0
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
		if n != slot {
			break
		}
		slot++
	}
	return slot, rows.Err()
}

// Update writes sb if its stored state is one of from, and records the
// transition; otherwise it changes nothing and returns errdefs.ErrConflict.
func (s *Store) Update(ctx context.Context, sb *store.Sandbox, from ...string) error {
	return s.UpdateAll(ctx, []*store.Sandbox{sb}, from...)
}

// UpdateAll is Update of every sandbox of sbs, in one transaction: all are
// written, or none.
func (s *Store) UpdateAll(ctx context.Context, sbs []*store.Sandbox, from ...string) error {
	return s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, sb := range sbs {
			if err := update(ctx, tx, sb, from); err != nil {
				return err
			}
		}
		return nil
	})
}

func update(ctx context.Context, tx *sql.Tx, sb *store.Sandbox, from []string) error {
	var cur, node, owner string
	var had store.Resources
	if err := tx.QueryRowContext(ctx, `SELECT state, node, tenant, cpu, memory_mib, disk_gib FROM sandboxes WHERE id = ?`, sb.ID).Scan(
		&cur, &node, &owner, &had.CPU, &had.MemoryMiB, &had.DiskGiB); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
		}
		return err
	}
	if !contains(from, cur) {
		return fmt.Errorf("sandbox %s is %s: %w", sb.ID, cur, errdefs.ErrConflict)
	}
	if err := checkText(sb); err != nil {
		return err
	}
	if err := versionExists(ctx, tx, sb.TemplateVersion); err != nil {
		return err
	}
	// What it held counts against its tenant only if it stays that
	// tenant's (a warm pool's sandbox handed out was nobody's).
	had = store.Charge(cur, had.CPU, had.MemoryMiB, had.DiskGiB)
	if owner != tenantOf(sb.Tenant) {
		had = store.Resources{}
	}
	if err := admit(ctx, tx, sb, had); err != nil {
		return err
	}
	// The slot stays as Create chose it, unless the sandbox moves to
	// another node: then it takes that node's lowest free one.
	if node != sb.Node {
		slot, err := freeSlot(ctx, tx, sb.Node)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET node = ?, slot = ? WHERE id = ?`, sb.Node, slot, sb.ID); err != nil {
			return err
		}
		sb.Slot = slot
	}
	env, _ := json.Marshal(orEmpty(sb.Env))
	labels, _ := json.Marshal(orEmpty(sb.Labels))
	_, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state=?, error=?, template=?, runtime=?, cpu=?, memory_mib=?,
		disk_gib=?, pids=?, env=?, labels=?, created_at=?, started_at=?, stopped_at=?, pid=?, start_time=?, socket=?,
		timeout_sec=?, expires_at=?, ephemeral=?, auto_delete_sec=?, auto_stop_sec=?,
		auto_archive_sec=?, from_snapshot=?, egress=?, public_ports=?, tenant=?, template_version=?, auto_resume=?, lost_from=?, checkpoint_every_sec=?, checkpointed_at=?, vaults=? WHERE id=?`,
		sb.State, sb.Error, sb.Template, sb.Runtime, sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.PIDs,
		string(env), string(labels), unixNano(sb.CreatedAt), nanos(sb.StartedAt), nanos(sb.StoppedAt),
		sb.PID, int64(sb.StartTime), sb.Socket, sb.TimeoutSec, nanos(sb.ExpiresAt), sb.Ephemeral, sb.AutoDeleteSec, sb.AutoStopSec,
		sb.AutoArchiveSec, sb.FromSnapshot, policyJSON(sb.Policy), sb.Ports.Public, tenantOf(sb.Tenant), sb.TemplateVersion, sb.AutoResume, sb.LostFrom, sb.CheckpointEverySec, nanos(sb.CheckpointedAt), store.VaultsJSON(sb.Vaults), sb.ID)
	if err != nil {
		return err
	}
	if cur != sb.State {
		return transition(ctx, tx, sb.ID, cur, sb.State, sb.Error)
	}
	return nil
}

// Delete removes a sandbox's row if its state is one of from (any, if
// none) and returns it.
func (s *Store) Delete(ctx context.Context, id string, from ...string) (store.Sandbox, error) {
	var sb store.Sandbox
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		sb, err = deleteSandbox(ctx, tx, id, from)
		return err
	})
	return sb, err
}

// deleteSandbox removes sandbox id's row and returns it; a state not in
// from returns errdefs.ErrConflict, and the write's savepoint is rolled
// back (commit), the row with it.
func deleteSandbox(ctx context.Context, tx *sql.Tx, id string, from []string) (store.Sandbox, error) {
	rows, err := tx.QueryContext(ctx, `DELETE FROM sandboxes WHERE id = ? RETURNING `+columns, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	sbs, err := scan(rows)
	sb, err := store.Only(sbs, err, "sandbox "+id)
	if err != nil {
		return sb, err
	}
	if len(from) > 0 && !contains(from, sb.State) {
		return sb, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
	}
	return sb, transition(ctx, tx, id, sb.State, "deleted", "")
}

// Get returns one sandbox.
func (s *Store) Get(ctx context.Context, id string) (store.Sandbox, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+columns+` FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	sbs, err := scan(rows)
	return store.Only(sbs, err, "sandbox "+id)
}

// List returns all sandboxes, oldest first.
func (s *Store) List(ctx context.Context) ([]store.Sandbox, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+columns+` FROM sandboxes ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	return scan(rows)
}

// Transitions returns a sandbox's recorded state changes, oldest first.
func (s *Store) Transitions(ctx context.Context, id string) ([]store.Transition, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT from_state, to_state, reason, at FROM transitions WHERE sandbox_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Transition
	for rows.Next() {
		var t store.Transition
		var at int64
		if err := rows.Scan(&t.From, &t.To, &t.Reason, &at); err != nil {
			return nil, err
		}
		t.At = time.Unix(0, at).UTC()
		out = append(out, t)
	}
	return out, rows.Err()
}

// AddKey stores the hash of an API key, its name and its tenant.
func (s *Store) AddKey(ctx context.Context, hash, name, tenant string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (hash, created_at, name, tenant) VALUES (?, ?, ?, ?)`,
		hash, time.Now().UnixNano(), name, tenantOf(tenant))
	return uniqueConflict(err, "key "+store.KeyID(hash))
}

// LookupKey returns the key whose hash is hash; errdefs.ErrNotFound if
// there is none.
func (s *Store) LookupKey(ctx context.Context, hash string) (store.Key, error) {
	ks, err := s.keys(ctx, `WHERE hash = ?`, hash)
	return store.Only(ks, err, "key")
}

// ListKeys returns every key, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]store.Key, error) {
	return s.keys(ctx, `ORDER BY created_at, hash`)
}

// DeleteKey removes the key with ID id, unless it is the last key of the
// default tenant (the admin's), which would leave nobody to issue keys.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	adminTenant := tenant.Default
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var hash, tenant string
	err = tx.QueryRowContext(ctx, `SELECT hash, tenant FROM api_keys WHERE substr(hash, 1, 20) = ?`, id).Scan(&hash, &tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("key %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if tenant == adminTenant {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys WHERE tenant = ?`, adminTenant).Scan(&n); err != nil {
			return err
		}
		if n <= 1 {
			return fmt.Errorf("%w: key %s is the last admin key; create another first", errdefs.ErrConflict, id)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM api_keys WHERE hash = ?`, hash); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *Store) keys(ctx context.Context, where string, args ...any) ([]store.Key, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT hash, name, tenant, created_at FROM api_keys `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Key
	for rows.Next() {
		var k store.Key
		var created int64
		if err := rows.Scan(&k.Hash, &k.Name, &k.Tenant, &created); err != nil {
			return nil, err
		}
		k.ID = store.KeyID(k.Hash)
		k.CreatedAt = fromUnixNano(created)
		out = append(out, k)
	}
	return out, rows.Err()
}

// TenantInUse reports whether tenant t has keys, sandboxes, snapshots or
// vaults.
func (s *Store) TenantInUse(ctx context.Context, t string) (bool, error) {
	var n int
	err := s.rdb.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM api_keys WHERE tenant = ?)
		+ (SELECT COUNT(*) FROM sandboxes WHERE tenant = ?) + (SELECT COUNT(*) FROM snapshots WHERE tenant = ?)
		+ (SELECT COUNT(*) FROM vaults WHERE tenant = ?)`, t, t, t, t).Scan(&n)
	return n > 0, err
}

// KeyCount is the number of stored keys.
func (s *Store) KeyCount(ctx context.Context) (int, error) {
	var n int
	err := s.rdb.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys`).Scan(&n)
	return n, err
}

// tenantOf is the tenant column of a row: "" (a caller that predates
// tenants) is the default tenant.
func tenantOf(t string) string {
	if t == "" {
		return tenant.Default
	}
	return t
}

// uniqueConflict is err as the contract's kind for a second row of a unique
// key, ErrConflict, if that is what it is, and as it came otherwise.
func uniqueConflict(err error, what string) error {
	var e *msqlite.Error
	if errors.As(err, &e) && (e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE) {
		return fmt.Errorf("%s exists already: %w", what, errdefs.ErrConflict)
	}
	return err
}

// checkText returns ErrInvalid if sb holds text that is not UTF-8, which
// the JSON of its columns would change (the contract stores values exactly
// or refuses them).
func checkText(sb *store.Sandbox) error {
	for _, m := range []map[string]string{sb.Env, sb.Labels} {
		for k, v := range m {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return fmt.Errorf("%w: sandbox %s: labels and environment must be UTF-8", errdefs.ErrInvalid, sb.ID)
			}
		}
	}
	if len(sb.Placement) > 0 && !json.Valid(sb.Placement) {
		return fmt.Errorf("%w: sandbox %.40q: placement record is not JSON", errdefs.ErrInvalid, sb.ID)
	}
	return nil
}

func transition(ctx context.Context, tx *sql.Tx, id, from, to, reason string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO transitions (sandbox_id, from_state, to_state, reason, at) VALUES (?,?,?,?,?)`,
		id, from, to, reason, time.Now().UnixNano())
	return err
}

func scan(rows *sql.Rows) ([]store.Sandbox, error) {
	defer rows.Close()
	var out []store.Sandbox
	for rows.Next() {
		var sb store.Sandbox
		var env, labels string
		var created int64
		var started, stopped, expires, checkpointed sql.NullInt64
		var startTime int64
		var policy, vaults string
		if err := rows.Scan(&sb.ID, &sb.State, &sb.Template, &sb.Runtime, &sb.CPU, &sb.MemoryMiB, &sb.DiskGiB,
			&sb.PIDs, &env, &labels, &sb.Error, &sb.Slot, &created, &started, &stopped, &sb.PID, &startTime, &sb.Socket,
			&sb.TimeoutSec, &expires, &sb.Ephemeral, &sb.AutoDeleteSec, &sb.AutoStopSec, &sb.FromSnapshot,
			&sb.AutoArchiveSec, &policy, &sb.Ports.Public, &sb.Tenant, &sb.TemplateVersion, &sb.AutoResume,
			&sb.Node, &sb.LostFrom, &sb.CheckpointEverySec, &checkpointed, &vaults); err != nil {
			return nil, err
		}
		if err := store.ParseVaults(vaults, &sb.Vaults); err != nil {
			return nil, err
		}
		if err := sb.SetJSON(env, labels, policy); err != nil {
			return nil, err
		}
		sb.ExpiresAt = fromNanos(expires)
		sb.CheckpointedAt = fromNanos(checkpointed)
		sb.StartTime = uint64(startTime)
		sb.CreatedAt = fromUnixNano(created)
		sb.StartedAt = fromNanos(started)
		sb.StoppedAt = fromNanos(stopped)
		out = append(out, sb)
	}
	return out, rows.Err()
}

// policyJSON is the egress column: empty for allow-all.
func policyJSON(p api.NetworkPolicy) string {
	if p.Egress == "" && len(p.Allow) == 0 && len(p.Deny) == 0 && p.Bandwidth == nil {
		return ""
	}
	b, _ := json.Marshal(p)
	return string(b)
}

// unixNano is the column of a time that is always set. The zero time,
// before the range of nanoseconds since 1970 in an int64, is 0.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromUnixNano is the inverse of unixNano.
func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nanos(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}

func fromNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := time.Unix(0, n.Int64).UTC()
	return &t
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// PutSnapshot records a snapshot.
func (s *Store) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots (id, name, sandbox_id, template, created_at, state, tenant, template_version)
		VALUES (?,?,?,?,?,?,?,?)`,
		sn.ID, sn.Name, sn.SandboxID, sn.Template, unixNano(sn.CreatedAt), sn.State, tenantOf(sn.Tenant), sn.TemplateVersion)
	return uniqueConflict(err, "snapshot "+sn.ID)
}

// SetSnapshotState moves snapshot id from state from to state to; if it is
// not in state from it changes nothing and returns errdefs.ErrConflict.
func (s *Store) SetSnapshotState(ctx context.Context, id, from, to string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE snapshots SET state = ? WHERE id = ? AND state = ?`, to, id, from)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := s.GetSnapshot(ctx, id); err != nil {
			return err
		}
		return fmt.Errorf("snapshot %s is not %s: %w", id, from, errdefs.ErrConflict)
	}
	return nil
}

// GetSnapshot returns one snapshot.
func (s *Store) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	sns, err := s.snapshots(ctx, `WHERE id = ?`, id)
	return store.Only(sns, err, "snapshot "+id)
}

// ListSnapshots returns the snapshots of sandboxID, or all if it is empty.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID string) ([]store.Snapshot, error) {
	if sandboxID == "" {
		return s.snapshots(ctx, `ORDER BY created_at, id`)
	}
	return s.snapshots(ctx, `WHERE sandbox_id = ? ORDER BY created_at, id`, sandboxID)
}

// DeleteSnapshot removes a snapshot's row.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

func (s *Store) snapshots(ctx context.Context, where string, args ...any) ([]store.Snapshot, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, name, sandbox_id, template, created_at, state, tenant, template_version FROM snapshots `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Snapshot
	for rows.Next() {
		var sn store.Snapshot
		var created int64
		if err := rows.Scan(&sn.ID, &sn.Name, &sn.SandboxID, &sn.Template, &created, &sn.State, &sn.Tenant, &sn.TemplateVersion); err != nil {
			return nil, err
		}
		sn.CreatedAt = fromUnixNano(created)
		out = append(out, sn)
	}
	return out, rows.Err()
}

// Placement returns sandbox id's placement record: not read by Get and
// List (see store.Sandbox.Placement).
func (s *Store) Placement(ctx context.Context, id string) (json.RawMessage, error) {
	var rec string
	err := s.rdb.QueryRowContext(ctx, `SELECT placement FROM sandboxes WHERE id = ?`, id).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil || rec == "" {
		return nil, err
	}
	return json.RawMessage(rec), nil
}

// SnapshotUsers counts the sandboxes created from each snapshot.
func (s *Store) SnapshotUsers(ctx context.Context) (map[string]int, error) {
	return s.counts(ctx, `SELECT from_snapshot, COUNT(*) FROM sandboxes WHERE from_snapshot != '' GROUP BY from_snapshot`)
}

// counts runs query, whose rows are a key and a count, into a map.
func (s *Store) counts(ctx context.Context, query string, args ...any) (map[string]int, error) {
	rows, err := s.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}

var _ store.Store = (*Store)(nil)

// ListNode returns the sandboxes of node, in List's order.
func (s *Store) ListNode(ctx context.Context, node string) ([]store.Sandbox, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+columns+` FROM sandboxes WHERE node = ? ORDER BY created_at, id`, node)
	if err != nil {
		return nil, err
	}
	return scan(rows)
}
