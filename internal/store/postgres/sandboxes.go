package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// columns are a sandbox row's, in the order of scanSandbox and args.
const columns = `id, state, template, template_version, runtime, cpu, memory_mib, disk_gib, pids, env, labels, error,
	slot, created_at, started_at, stopped_at, pid, start_time, socket,
	timeout_sec, expires_at, ephemeral, auto_delete_sec, auto_stop_sec, auto_archive_sec, auto_resume,
	from_snapshot, egress, public_ports, tenant, node, lost_from, checkpoint_every_sec, checkpointed_at, vaults`

// args are sb's values for columns.
func args(sb *store.Sandbox) []any {
	env, _ := json.Marshal(orEmpty(sb.Env))
	labels, _ := json.Marshal(orEmpty(sb.Labels))
	return []any{sb.ID, sb.State, sb.Template, sb.TemplateVersion, sb.Runtime, sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.PIDs,
		string(env), string(labels), sb.Error,
		sb.Slot, sb.CreatedAt, sb.StartedAt, sb.StoppedAt, sb.PID, int64(sb.StartTime), sb.Socket,
		sb.TimeoutSec, sb.ExpiresAt, sb.Ephemeral, sb.AutoDeleteSec, sb.AutoStopSec, sb.AutoArchiveSec, sb.AutoResume,
		sb.FromSnapshot, policyJSON(sb.Policy), sb.Ports.Public, tenantOf(sb.Tenant), sb.Node, sb.LostFrom, sb.CheckpointEverySec, sb.CheckpointedAt,
		store.VaultsJSON(sb.Vaults)}
}

// Create records a new sandbox in the lowest slot free on its node, and
// its first state. Through a node's view (As) it is a placement on that
// node (cluster.go).
func (s *Store) Create(ctx context.Context, sb *store.Sandbox) error {
	if s.as != nil {
		return s.createAs(ctx, sb)
	}
	if err := checkText(sb); err != nil {
		return err
	}
	slot, tn := sb.Slot, sb.Tenant
	err := s.write(ctx, func(tx pgx.Tx) error {
		// Placements choose slots under their node's row lock (Place);
		// so does this, if the node is a member. Two creates choosing at
		// once otherwise collide on the unique (node, slot), and the
		// loser runs again.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE name = $1 FOR UPDATE`, sb.Node); err != nil {
			return err
		}
		var err error
		if sb.Slot, err = freeSlot(ctx, tx, sb.Node); err != nil {
			return err
		}
		sb.Tenant = tenantOf(sb.Tenant)
		// In the transaction that records the sandbox: a collection of
		// its version cannot slip in between (serializable).
		if err := versionExists(ctx, tx, sb.TemplateVersion); err != nil {
			return err
		}
		if err := admit(ctx, tx, sb, store.Resources{}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertSandbox, insertArgs(sb)...); err != nil {
			return fmt.Errorf("inserting sandbox: %w", err)
		}
		return transition(ctx, tx, sb.ID, "", sb.State, "")
	})
	if err != nil {
		// Undone: sb is as it came.
		sb.Slot, sb.Tenant = slot, tn
		if errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("sandbox %s exists already: %w", sb.ID, errdefs.ErrConflict)
		}
	}
	return err
}

var insertSandbox = `INSERT INTO sandboxes (` + insertColumns + `) VALUES (` + placeholders(0, insertCount) + `)`

// insertCount is the number of insertColumns, and of insertArgs.
var insertCount = strings.Count(insertColumns, ",") + 1

// placeholders are $from+1 ... $from+n, comma-separated.
func placeholders(from, n int) string {
	var b strings.Builder
	for j := range n {
		if j > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "$%d", from+j+1)
	}
	return b.String()
}

// insertColumns are what an insert writes: columns, and the placement
// record, written once and read only by Placement, and whether the
// placement is warm (store.Sandbox.Warm), read only by Place.
const insertColumns = columns + `, placement, warm`

// insertArgs are sb's values for insertColumns.
func insertArgs(sb *store.Sandbox) []any {
	return append(args(sb), string(sb.Placement), sb.Warm)
}

// Placement returns sandbox id's placement record.
func (s *Store) Placement(ctx context.Context, id string) (json.RawMessage, error) {
	if !storable(id) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	var rec string
	err := s.read(ctx, func(q querier) error {
		return q.QueryRow(ctx, `SELECT placement FROM sandboxes WHERE id = $1`, id).Scan(&rec)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil || rec == "" {
		return nil, err
	}
	return json.RawMessage(rec), nil
}

// freeSlot is the lowest slot no sandbox of node holds.
func freeSlot(ctx context.Context, tx pgx.Tx, node string) (int, error) {
	var slot int
	err := tx.QueryRow(ctx, `SELECT COALESCE(MIN(n), 0) FROM (
			SELECT 0 AS n WHERE NOT EXISTS (SELECT 1 FROM sandboxes WHERE node = $1 AND slot = 0)
			UNION ALL
			SELECT slot + 1 FROM sandboxes s WHERE node = $1
				AND NOT EXISTS (SELECT 1 FROM sandboxes t WHERE t.node = $1 AND t.slot = s.slot + 1)
		) free`, node).Scan(&slot)
	return slot, err
}

// Update writes sb if its stored state is one of from, and records the
// transition.
func (s *Store) Update(ctx context.Context, sb *store.Sandbox, from ...string) error {
	return s.UpdateAll(ctx, []*store.Sandbox{sb}, from...)
}

// UpdateAll is Update of every sandbox of sbs, in one transaction.
//
// Read committed, ordered by row locks, as the cluster's own writes are:
// each write of a sandbox's state or resources changes its node's kept
// sums (node_committed, migration 0013), one row a node, and two
// serializable writes on one node, or one beside a placement there
// (which holds the row until it commits), would refuse each other ("could
// not serialize access"). Read committed, the second waits for the row
// and adds to what the first committed. What serializable isolation kept
// here holds under the locks instead:
//   - the compare-and-set of the state: the sandbox's row is read FOR
//     UPDATE, the newest version, and stays locked until the commit;
//   - a tenant's quota: admit updates the tenant's row first, which orders
//     every write that grows what the tenant holds (tenants.go), and its
//     sum, a later statement, sees what the one before committed;
//   - the template version a sandbox holds, against CollectTemplates: an
//     update that keeps the sandbox's version cannot make a collection
//     wrong (the row held it already, committed).
//
// An update that changes a sandbox's version, or moves it to another node
// (which serializable node views' checks of whose a sandbox is, such as
// PutSnapshot's, read), is refused read committed (errStrict) and runs
// again serializable, as every update did before.
//
// The sandboxes are written in the order of their nodes, then IDs, and
// the nodes a sandbox moves to are locked before any row is written: two
// transactions then take the sandboxes', nodes' and sums' locks in the
// same order (as Place takes the nodes', then the sums'), and neither
// waits for the other while holding what it needs.
func (s *Store) UpdateAll(ctx context.Context, sbs []*store.Sandbox, from ...string) error {
	for _, sb := range sbs {
		if !storable(sb.ID) {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
		}
		if err := checkText(sb); err != nil {
			return err
		}
	}
	sorted := slices.Clone(sbs)
	slices.SortFunc(sorted, func(a, b *store.Sandbox) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.ID, b.ID))
	})
	run := func(iso pgx.TxIsoLevel) error {
		return s.writeAt(ctx, iso, s.as, func(tx pgx.Tx) error {
			if err := lockMoves(ctx, tx, sorted); err != nil {
				return err
			}
			for _, sb := range sorted {
				if err := update(ctx, tx, s.as, sb, from, iso == pgx.Serializable); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err := run(pgx.ReadCommitted)
	if errors.Is(err, errStrict) {
		err = run(pgx.Serializable)
	}
	return err
}

// errStrict is update's answer, read committed, to a write that needs a
// serializable transaction (UpdateAll says which).
var errStrict = errors.New("a serializable transaction is needed")

// lockMoves locks, in name order, the rows of the nodes sandboxes of sbs
// move to (a node other than the one they are recorded on), and the
// sandboxes' rows, in ID order.
func lockMoves(ctx context.Context, tx pgx.Tx, sbs []*store.Sandbox) error {
	if len(sbs) < 2 {
		return nil // update locks one sandbox, then its node, alone
	}
	ids := make([]string, len(sbs))
	to := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i], to[i] = sb.ID, sb.Node
	}
	_, err := tx.Exec(ctx, `WITH s AS (SELECT id, node FROM sandboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE)
		SELECT 1 FROM nodes WHERE name IN (SELECT w.node FROM unnest($1::text[], $2::text[]) w(id, node)
			JOIN s ON s.id = w.id AND s.node <> w.node)
		ORDER BY name FOR UPDATE`, ids, to)
	return err
}

func update(ctx context.Context, tx pgx.Tx, as *writer, sb *store.Sandbox, from []string, serializable bool) error {
	var cur, node, owner, version string
	var had store.Resources
	if err := tx.QueryRow(ctx, `SELECT state, node, tenant, template_version, cpu, memory_mib, disk_gib FROM sandboxes WHERE id = $1 FOR UPDATE`, sb.ID).Scan(
		&cur, &node, &owner, &version, &had.CPU, &had.MemoryMiB, &had.DiskGiB); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
		}
		return err
	}
	if err := as.owns(sb.ID, node, sb.Node); err != nil {
		return err
	}
	if !slices.Contains(from, cur) {
		return fmt.Errorf("sandbox %s is %s: %w", sb.ID, cur, errdefs.ErrConflict)
	}
	if !serializable && (sb.TemplateVersion != version || sb.Node != node) {
		return errStrict
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
	// Every column but the slot, which stays as Create chose it, unless
	// the sandbox moves to another node: then it takes that node's lowest
	// free one.
	if node != sb.Node {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE name = $1 FOR UPDATE`, sb.Node); err != nil {
			return err
		}
		slot, err := freeSlot(ctx, tx, sb.Node)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $2, slot = $3 WHERE id = $1`, sb.ID, sb.Node, slot); err != nil {
			return err
		}
		sb.Slot = slot
	}
	a := slices.Delete(args(sb), 12, 13)
	if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state=$2, template=$3, template_version=$4, runtime=$5, cpu=$6,
		memory_mib=$7, disk_gib=$8, pids=$9, env=$10, labels=$11, error=$12, created_at=$13, started_at=$14,
		stopped_at=$15, pid=$16, start_time=$17, socket=$18, timeout_sec=$19, expires_at=$20, ephemeral=$21,
		auto_delete_sec=$22, auto_stop_sec=$23, auto_archive_sec=$24, auto_resume=$25, from_snapshot=$26, egress=$27,
		public_ports=$28, tenant=$29, node=$30, lost_from=$31, checkpoint_every_sec=$32, checkpointed_at=$33, vaults=$34 WHERE id=$1`, a...); err != nil {
		return err
	}
	if len(sb.Placement) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET placement = $2 WHERE id = $1`, sb.ID, string(sb.Placement)); err != nil {
			return err
		}
	}
	if cur != sb.State {
		return transition(ctx, tx, sb.ID, cur, sb.State, sb.Error)
	}
	return nil
}

// Delete removes a sandbox's row and records its transition to deleted.
// Read committed, as UpdateAll is and for its reason (the node's kept
// sums): the delete locks the row it removes, and nothing it could make
// wrong counts on its absence (a quota's use and a version's users only
// shrink).
func (s *Store) Delete(ctx context.Context, id string, from ...string) (store.Sandbox, error) {
	var sb store.Sandbox
	if !storable(id) {
		return sb, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	err := s.writeAt(ctx, pgx.ReadCommitted, s.as, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM sandboxes WHERE id = $1 RETURNING `+columns, id)
		if err != nil {
			return err
		}
		if sb, err = pgx.CollectExactlyOneRow(rows, scanSandbox); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
			}
			return err
		}
		if err := s.as.owns(id, sb.Node, sb.Node); err != nil {
			return err // and the transaction's rollback undoes the delete
		}
		if len(from) > 0 && !slices.Contains(from, sb.State) {
			return fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrConflict)
		}
		return transition(ctx, tx, id, sb.State, "deleted", "")
	})
	return sb, err
}

// Get returns one sandbox.
func (s *Store) Get(ctx context.Context, id string) (store.Sandbox, error) {
	if !storable(id) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sbs, err := s.sandboxes(ctx, `WHERE id = $1`, id)
	return store.Only(sbs, err, "sandbox "+id)
}

// List returns every sandbox, by creation, then ID.
func (s *Store) List(ctx context.Context) ([]store.Sandbox, error) {
	return s.sandboxes(ctx, `ORDER BY created_at, id`)
}

func (s *Store) sandboxes(ctx context.Context, where string, a ...any) ([]store.Sandbox, error) {
	var out []store.Sandbox
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT `+columns+` FROM sandboxes `+where, a...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanSandbox)
		return err
	})
	return out, err
}

func scanSandbox(row pgx.CollectableRow) (store.Sandbox, error) {
	var sb store.Sandbox
	var env, labels, policy, vaults string
	var startTime int64
	if err := row.Scan(&sb.ID, &sb.State, &sb.Template, &sb.TemplateVersion, &sb.Runtime, &sb.CPU, &sb.MemoryMiB,
		&sb.DiskGiB, &sb.PIDs, &env, &labels, &sb.Error,
		&sb.Slot, &sb.CreatedAt, &sb.StartedAt, &sb.StoppedAt, &sb.PID, &startTime, &sb.Socket,
		&sb.TimeoutSec, &sb.ExpiresAt, &sb.Ephemeral, &sb.AutoDeleteSec, &sb.AutoStopSec, &sb.AutoArchiveSec, &sb.AutoResume,
		&sb.FromSnapshot, &policy, &sb.Ports.Public, &sb.Tenant, &sb.Node, &sb.LostFrom, &sb.CheckpointEverySec, &sb.CheckpointedAt, &vaults); err != nil {
		return sb, err
	}
	if err := store.ParseVaults(vaults, &sb.Vaults); err != nil {
		return sb, err
	}
	sb.StartTime = uint64(startTime)
	sb.CreatedAt = sb.CreatedAt.UTC()
	sb.StartedAt, sb.StoppedAt, sb.ExpiresAt = utc(sb.StartedAt), utc(sb.StoppedAt), utc(sb.ExpiresAt)
	sb.CheckpointedAt = utc(sb.CheckpointedAt)
	return sb, sb.SetJSON(env, labels, policy)
}

// Transitions returns a sandbox's recorded state changes, oldest first.
func (s *Store) Transitions(ctx context.Context, id string) ([]store.Transition, error) {
	if !storable(id) {
		return nil, nil
	}
	var out []store.Transition
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT from_state, to_state, reason, at FROM transitions WHERE sandbox_id = $1 ORDER BY seq`, id)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Transition, error) {
			var t store.Transition
			err := row.Scan(&t.From, &t.To, &t.Reason, &t.At)
			t.At = t.At.UTC()
			return t, err
		})
		return err
	})
	return out, err
}

func transition(ctx context.Context, tx pgx.Tx, id, from, to, reason string) error {
	_, err := tx.Exec(ctx, `INSERT INTO transitions (sandbox_id, from_state, to_state, reason, at) VALUES ($1, $2, $3, $4, $5)`,
		id, from, to, reason, time.Now())
	return err
}

// SnapshotUsers counts the sandboxes created from each snapshot.
func (s *Store) SnapshotUsers(ctx context.Context) (map[string]int, error) {
	return s.counts(ctx, `SELECT from_snapshot, COUNT(*) FROM sandboxes WHERE from_snapshot <> '' GROUP BY from_snapshot`)
}

// counts runs query, whose rows are a key and a count, into a map.
func (s *Store) counts(ctx context.Context, query string, a ...any) (map[string]int, error) {
	out := map[string]int{}
	err := s.read(ctx, func(q querier) error {
		clear(out)
		rows, err := q.Query(ctx, query, a...)
		if err != nil {
			return err
		}
		var key string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error { out[key] = n; return nil })
		return err
	})
	return out, err
}

// checkText returns ErrInvalid if sb holds what PostgreSQL's text cannot
// (the contract stores values exactly or refuses them): its JSON columns
// escape a NUL, but not UTF-8 that is not valid, and its other columns can
// hold neither.
func checkText(sb *store.Sandbox) error {
	for _, m := range []map[string]string{sb.Env, sb.Labels} {
		for k, v := range m {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return fmt.Errorf("%w: sandbox %s: labels and environment must be UTF-8", errdefs.ErrInvalid, sb.ID)
			}
		}
	}
	for _, v := range []string{sb.ID, sb.State, sb.Template, sb.TemplateVersion, sb.Runtime, sb.Error, sb.Socket, sb.FromSnapshot, sb.Tenant, sb.Node, sb.LostFrom, string(sb.Placement)} {
		if !storable(v) {
			return fmt.Errorf("%w: sandbox %.40q: text with a NUL or not UTF-8", errdefs.ErrInvalid, sb.ID)
		}
	}
	// Nor resources that are not a number of each, none below zero: the
	// triggers add them to their node's sums (node_committed), where a
	// NaN would stay after the sandbox is gone.
	if math.IsNaN(sb.CPU) || math.IsInf(sb.CPU, 0) || sb.CPU < 0 || sb.MemoryMiB < 0 || sb.DiskGiB < 0 {
		return fmt.Errorf("%w: sandbox %.40q: %v CPU, %d MiB, %d GiB", errdefs.ErrInvalid, sb.ID, sb.CPU, sb.MemoryMiB, sb.DiskGiB)
	}
	if len(sb.Placement) > 0 && !json.Valid(sb.Placement) {
		return fmt.Errorf("%w: sandbox %.40q: placement record is not JSON", errdefs.ErrInvalid, sb.ID)
	}
	return nil
}

// policyJSON is the egress column: empty for allow-all.
func policyJSON(p api.NetworkPolicy) string {
	if p.Egress == "" && len(p.Allow) == 0 && len(p.Deny) == 0 && p.Bandwidth == nil {
		return ""
	}
	b, _ := json.Marshal(p)
	return string(b)
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// ListNode returns the sandboxes of node, in List's order.
func (s *Store) ListNode(ctx context.Context, node string) ([]store.Sandbox, error) {
	if !storable(node) {
		return nil, nil
	}
	return s.sandboxes(ctx, `WHERE node = $1 ORDER BY created_at, id`, node)
}
