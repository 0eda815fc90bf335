package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// The cluster (store.Cluster): nodes with leases and epochs, placements,
// fenced writes, shared secrets.
//
// Locks. A node's row is the lock of its capacity and its slots: Place
// holds it FOR UPDATE while it sums what the node's sandboxes hold and adds
// its own, so concurrent placements on one node take turns and each sees
// the others' sandboxes. Placements run at read committed, where every
// statement sees what committed before it began: after the lock, the sum
// is exact, and no serialization failure ever throws a whole batch away.
// (Serializable would add nothing here but retries: the lock already
// orders every writer of a node's capacity.) A view's write (As) holds the
// row FOR SHARE, so Join and Expire, which update it, wait for the writes
// under way and fence those that come after.

var _ store.Cluster = (*Store)(nil)

// writer is the node and epoch a view (As) writes under.
type writer struct {
	node  string
	epoch int64
}

// check returns ErrFenced unless w's epoch is its node's current one and
// the node is live, and holds the node's row so until the commit.
func (w *writer) check(ctx context.Context, tx pgx.Tx) error {
	if w == nil {
		return nil
	}
	if !storable(w.node) {
		return fmt.Errorf("node %.40q has not joined: %w", w.node, store.ErrFenced)
	}
	var epoch int64
	var state string
	err := tx.QueryRow(ctx, `SELECT epoch, state FROM nodes WHERE name = $1 FOR SHARE`, w.node).Scan(&epoch, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("node %q has not joined: %w", w.node, store.ErrFenced)
	}
	if err != nil {
		return err
	}
	return w.live(epoch, state)
}

// live returns ErrFenced unless epoch and state are w's node's under w.
func (w *writer) live(epoch int64, state string) error {
	if epoch != w.epoch || state != store.NodeLive {
		return fmt.Errorf("node %q epoch %d (now %d, %s): %w", w.node, w.epoch, epoch, state, store.ErrFenced)
	}
	return nil
}

// owns returns ErrFenced if a sandbox recorded on node stored, written as
// on node written, is not w's node's (nil w owns everything).
func (w *writer) owns(id, stored, written string) error {
	if w == nil || stored == w.node && written == w.node {
		return nil
	}
	return fmt.Errorf("sandbox %s is node %q's, not %q's: %w", id, stored, w.node, store.ErrFenced)
}

// ownsSandbox returns ErrFenced if sandbox id is recorded on a node other
// than w's (a snapshot's sandbox; one no longer recorded is nobody's).
func (w *writer) ownsSandbox(ctx context.Context, tx pgx.Tx, id string) error {
	if w == nil || !storable(id) {
		return nil
	}
	var node string
	err := tx.QueryRow(ctx, `SELECT node FROM sandboxes WHERE id = $1`, id).Scan(&node)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return w.owns(id, node, node)
}

// ownsSnapshot is ownsSandbox of snapshot id's sandbox.
func (w *writer) ownsSnapshot(ctx context.Context, tx pgx.Tx, id string) error {
	if w == nil {
		return nil
	}
	var sandbox string
	err := tx.QueryRow(ctx, `SELECT sandbox_id FROM snapshots WHERE id = $1`, id).Scan(&sandbox)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // and the write finds no snapshot
	}
	if err != nil {
		return err
	}
	return w.ownsSandbox(ctx, tx, sandbox)
}

// As is node name's view under epoch.
func (s *Store) As(name string, epoch int64) store.Store {
	return &Store{pool: s.pool, as: &writer{node: name, epoch: epoch}}
}

// createAs is Create through a view: a placement on the view's node,
// schedulable or not, within its capacity (forks and warm pools on a full
// node are refused as the scheduler's placements are).
func (s *Store) createAs(ctx context.Context, sb *store.Sandbox) error {
	node := sb.Node
	switch node {
	case "":
		sb.Node = s.as.node
	case s.as.node:
	default:
		return s.as.owns(sb.ID, node, node)
	}
	err := s.place(ctx, []*store.Sandbox{sb}, s.as)[0]
	if err != nil {
		sb.Node = node
	}
	return err
}

// Join records n as live under a new epoch.
func (s *Store) Join(ctx context.Context, n store.Node, ttl time.Duration) (int64, error) {
	if err := checkNode(n); err != nil {
		return 0, err
	}
	if ttl <= 0 {
		return 0, fmt.Errorf("%w: lease of %v", errdefs.ErrInvalid, ttl)
	}
	runtimes, _ := json.Marshal(orEmptyList(n.Runtimes))
	labels, _ := json.Marshal(orEmpty(n.Labels))
	now := time.Now()
	var epoch int64
	err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		// One statement: a concurrent Join of the same name waits for
		// this one's row, then adds one to its epoch.
		return tx.QueryRow(ctx, `INSERT INTO nodes (name, address, version, runtimes, labels, cpu, memory_mib, disk_gib,
				sandboxes, epoch, state, schedule, joined_at, heartbeat, lease_expires, status)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, 'live', '', $10, $10, $11, '{}')
			ON CONFLICT (name) DO UPDATE SET address = excluded.address, version = excluded.version,
				runtimes = excluded.runtimes, labels = excluded.labels, cpu = excluded.cpu,
				memory_mib = excluded.memory_mib, disk_gib = excluded.disk_gib, sandboxes = excluded.sandboxes,
				epoch = nodes.epoch + 1, state = 'live', joined_at = excluded.joined_at,
				heartbeat = excluded.heartbeat, lease_expires = excluded.lease_expires, status = '{}'
			RETURNING epoch`,
			n.Name, n.Address, n.Version, string(runtimes), string(labels), n.Capacity.CPU, n.Capacity.MemoryMiB,
			n.Capacity.DiskGiB, n.Capacity.Sandboxes, now, now.Add(ttl)).Scan(&epoch)
	})
	if err != nil {
		return 0, fmt.Errorf("joining node %.40q: %w", n.Name, err)
	}
	return epoch, nil
}

// checkNode returns ErrInvalid for a node the table cannot hold exactly or
// that makes no sense: no name, text with a NUL or not UTF-8, a capacity
// below zero or not a number.
func checkNode(n store.Node) error {
	texts := append([]string{n.Name, n.Address, n.Version}, n.Runtimes...)
	for k, v := range n.Labels {
		texts = append(texts, k, v)
	}
	for _, v := range texts {
		if !storable(v) {
			return fmt.Errorf("%w: node %.40q: text with a NUL or not UTF-8", errdefs.ErrInvalid, n.Name)
		}
	}
	c := n.Capacity
	switch {
	case n.Name == "":
		return fmt.Errorf("%w: a node needs a name", errdefs.ErrInvalid)
	case !resourcesValid(c):
		return fmt.Errorf("%w: node %.40q: capacity %+v", errdefs.ErrInvalid, n.Name, c)
	}
	return nil
}

// resourcesValid reports whether r is a number of each, none below zero.
func resourcesValid(r store.Resources) bool {
	return r.CPU >= 0 && !math.IsInf(r.CPU, 0) && r.MemoryMiB >= 0 && r.DiskGiB >= 0 && r.Sandboxes >= 0
}

// Renew extends node name's lease, if epoch is its live one.
func (s *Store) Renew(ctx context.Context, name string, epoch int64, ttl time.Duration, st store.NodeStatus) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: lease of %v", errdefs.ErrInvalid, ttl)
	}
	for _, v := range st.Templates {
		if !utf8.ValidString(v) {
			return fmt.Errorf("%w: node status: template IDs must be UTF-8", errdefs.ErrInvalid)
		}
	}
	for k := range st.Pooled {
		if !utf8.ValidString(k) {
			return fmt.Errorf("%w: node status: template IDs must be UTF-8", errdefs.ErrInvalid)
		}
	}
	for k, r := range st.Demand {
		if !utf8.ValidString(k) || math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
			return fmt.Errorf("%w: node status: demand must be finite rates by UTF-8 template IDs", errdefs.ErrInvalid)
		}
	}
	if !storable(name) {
		return fmt.Errorf("node %.40q: %w", name, store.ErrFenced)
	}
	status, _ := json.Marshal(st)
	now := time.Now()
	return s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET heartbeat = $3, lease_expires = $4, status = $5
			WHERE name = $1 AND epoch = $2 AND state = 'live'`, name, epoch, now, now.Add(ttl), string(status))
		if err == nil && tag.RowsAffected() == 0 {
			return fmt.Errorf("renewing node %.40q epoch %d: %w", name, epoch, store.ErrFenced)
		}
		return err
	})
}

// Demand sums the live nodes' reported demand. It reads only the nodes'
// rows (a few, each a small JSON document), not their sandboxes: every
// node asks every few seconds.
func (s *Store) Demand(ctx context.Context) (store.Demand, error) {
	var d store.Demand
	err := s.read(ctx, func(q querier) error {
		d = store.Demand{Rates: map[string]float64{}} // a retry starts over
		rows, err := q.Query(ctx, `SELECT schedule, status FROM nodes WHERE state = 'live'`)
		if err != nil {
			return err
		}
		var schedule, status string
		_, err = pgx.ForEachRow(rows, []any{&schedule, &status}, func() error {
			var st store.NodeStatus
			if err := json.Unmarshal([]byte(status), &st); err != nil {
				return err
			}
			for v, r := range st.Demand {
				d.Rates[v] += r
			}
			if schedule == "" {
				d.Nodes++
			}
			return nil
		})
		return err
	})
	d.Nodes = max(d.Nodes, 1)
	return d, err
}

// nodeColumns are a node row's, in scanNode's order.
const nodeColumns = `name, address, version, runtimes, labels, cpu, memory_mib, disk_gib, sandboxes,
	epoch, state, schedule, joined_at, heartbeat, lease_expires, status`

func scanNode(row pgx.CollectableRow) (store.Node, error) {
	var n store.Node
	var runtimes, labels, status string
	if err := row.Scan(&n.Name, &n.Address, &n.Version, &runtimes, &labels, &n.Capacity.CPU, &n.Capacity.MemoryMiB,
		&n.Capacity.DiskGiB, &n.Capacity.Sandboxes, &n.Epoch, &n.State, &n.Schedule, &n.JoinedAt, &n.Heartbeat,
		&n.LeaseExpires, &status); err != nil {
		return n, err
	}
	n.JoinedAt, n.Heartbeat, n.LeaseExpires = n.JoinedAt.UTC(), n.Heartbeat.UTC(), n.LeaseExpires.UTC()
	for _, j := range []struct {
		text string
		v    any
	}{{runtimes, &n.Runtimes}, {labels, &n.Labels}, {status, &n.Status}} {
		if err := json.Unmarshal([]byte(j.text), j.v); err != nil {
			return n, err
		}
	}
	if len(n.Runtimes) == 0 {
		n.Runtimes = nil
	}
	if len(n.Labels) == 0 {
		n.Labels = nil
	}
	return n, nil
}

// Nodes returns every node, by name, with what its sandboxes hold.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	var out []store.Node
	err := s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY name`)
		if err != nil {
			return err
		}
		if out, err = pgx.CollectRows(rows, scanNode); err != nil {
			return err
		}
		committed := map[string]*store.Resources{}
		for i := range out {
			committed[out[i].Name] = &out[i].Committed
		}
		// The sums the triggers keep (committed.go): one row a node.
		rows, err = q.Query(ctx, `SELECT node, cpu::float8, memory_mib, disk_gib, sandboxes FROM node_committed`)
		if err != nil {
			return err
		}
		var node string
		var sum store.Resources
		_, err = pgx.ForEachRow(rows, []any{&node, &sum.CPU, &sum.MemoryMiB, &sum.DiskGiB, &sum.Sandboxes}, func() error {
			if c := committed[node]; c != nil {
				*c = sum
			}
			return nil
		})
		if err != nil {
			return err
		}
		// The warm sandboxes as the rows have them, not as the last
		// heartbeat did: pooled ones, less those that warm placements
		// still creating have reserved (Place). The partial index
		// sandboxes_warm keeps this to the few rows in those states.
		pooled := map[string]map[string]int{}
		holds := map[string]store.Resources{}
		for i := range out {
			out[i].Status.Pooled = nil
			pooled[out[i].Name] = map[string]int{}
		}
		// A reserved one is counted in Committed once, as Place counts
		// it: it becomes the sandbox that reserved it.
		rows, err = q.Query(ctx, warmQuery)
		if err != nil {
			return err
		}
		var version, rt string
		var free, reserved int
		runtimes := map[string]string{}
		_, err = pgx.ForEachRow(rows, []any{&node, &version, &free, &reserved, &sum.CPU, &sum.MemoryMiB, &sum.DiskGiB, &rt}, func() error {
			p := pooled[node]
			if p == nil || free == 0 {
				return nil
			}
			if free > reserved {
				p[version] = free - reserved
			}
			n := min(free, reserved)
			runtimes[node] = rt
			holds[node] = store.Resources{CPU: sum.CPU / float64(free), MemoryMiB: sum.MemoryMiB / int64(free),
				DiskGiB: sum.DiskGiB / int64(free), Sandboxes: 1}
			c := committed[node]
			c.CPU -= sum.CPU * float64(n) / float64(free)
			c.MemoryMiB -= sum.MemoryMiB * int64(n) / int64(free)
			c.DiskGiB -= sum.DiskGiB * int64(n) / int64(free)
			c.Sandboxes -= n
			return nil
		})
		for i := range out {
			if p := pooled[out[i].Name]; len(p) > 0 {
				out[i].Status.Pooled = p
			}
			out[i].PooledHolds, out[i].PooledRuntime = holds[out[i].Name], runtimes[out[i].Name]
		}
		return err
	})
	return out, err
}

// warmQuery counts each node's pooled sandboxes by template version, and
// the warm placements creating there. The states are written out, not
// parameters, so that the planner matches the partial index
// sandboxes_warm (creating ones only if warm: a burst's other placements
// are not read).
var warmQuery = fmt.Sprintf(`SELECT node, template_version, COUNT(*) FILTER (WHERE state = '%[1]s'),
	COUNT(*) FILTER (WHERE state = '%[2]s' AND warm), COALESCE(SUM(cpu) FILTER (WHERE state = '%[1]s'), 0),
	COALESCE(SUM(memory_mib) FILTER (WHERE state = '%[1]s'), 0), COALESCE(SUM(disk_gib) FILTER (WHERE state = '%[1]s'), 0),
	COALESCE(MIN(runtime) FILTER (WHERE state = '%[1]s'), '')
	FROM sandboxes WHERE state = '%[1]s' OR (state = '%[2]s' AND warm) GROUP BY node, template_version`, store.StatePooled, api.StateCreating)

// SetSchedule sets node name's schedule.
func (s *Store) SetSchedule(ctx context.Context, name, schedule string) error {
	switch schedule {
	case "", store.NodeCordoned, store.NodeDraining:
	default:
		return fmt.Errorf("%w: schedule %.40q", errdefs.ErrInvalid, schedule)
	}
	if !storable(name) {
		return fmt.Errorf("node %.40q: %w", name, errdefs.ErrNotFound)
	}
	return s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET schedule = $2 WHERE name = $1`, name, schedule)
		if err == nil && tag.RowsAffected() == 0 {
			return fmt.Errorf("node %.40q: %w", name, errdefs.ErrNotFound)
		}
		return err
	})
}

// Expire fences the live nodes whose lease ran out before now, and marks
// their sandboxes lost.
func (s *Store) Expire(ctx context.Context, now time.Time, cause string) ([]store.Node, error) {
	if !storable(cause) {
		return nil, fmt.Errorf("%w: cause: text with a NUL or not UTF-8", errdefs.ErrInvalid)
	}
	// The sessions of the nodes about to be fenced end first: a node cut
	// off mid-transaction holds its locks (its node's row, its
	// sandboxes', their kept sums) until PostgreSQL notices it is gone,
	// which can be long after its lease, and the fence below would wait
	// for them. Its writes would be refused once it is fenced anyway. (A
	// role that may not end them, one not shared by the nodes, leaves
	// them be: the fence then waits, as before.)
	s.pool.Exec(ctx, `SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a
		JOIN nodes n ON a.application_name = $2 || n.name || ' ' || `+clusterTag+`
		WHERE n.state = 'live' AND n.lease_expires < $1 AND a.pid <> pg_backend_pid()`, now, NodeSession)
	var fenced []store.Node
	err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		// In name order, as Place locks them. At read committed a node
		// another Expire fenced while this one waited for its row is
		// checked again, found fenced, and left out: each is fenced once.
		rows, err := tx.Query(ctx, `SELECT name FROM nodes WHERE state = 'live' AND lease_expires < $1
			ORDER BY name FOR UPDATE`, now)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(names) == 0 {
			fenced = nil
			return err
		}
		rows, err = tx.Query(ctx, `UPDATE nodes SET state = 'fenced' WHERE name = ANY($1) RETURNING `+nodeColumns, names)
		if err != nil {
			return err
		}
		if fenced, err = pgx.CollectRows(rows, scanNode); err != nil {
			return err
		}
		slices.SortFunc(fenced, func(a, b store.Node) int { return cmpString(a.Name, b.Name) })
		// The API shows a lost sandbox's cause as its error and the time
		// as its stopped_at (api.Sandbox).
		at := time.Now()
		rows, err = tx.Query(ctx, `WITH lost AS (
				UPDATE sandboxes SET lost_from = state, state = $2, stopped_at = $5,
					error = 'node ' || node || ' was fenced: ' || $4
				WHERE node = ANY($1) AND state NOT IN ($2, $3)
				RETURNING id, lost_from, tenant, error),
			t AS (INSERT INTO transitions (sandbox_id, from_state, to_state, reason, at)
				SELECT id, lost_from, $2, $4, $5 FROM lost)
			SELECT id, lost_from, tenant, error FROM lost ORDER BY id`, names, api.StateLost, api.StateDeleting, cause, at)
		if err != nil {
			return err
		}
		// Their lost events, in the same transaction (the journal's): a
		// sandbox started ahead of demand was nobody's, and has none.
		var evs []store.Event
		for rows.Next() {
			var id, from, t, reason string
			if err := rows.Scan(&id, &from, &t, &reason); err != nil {
				return err
			}
			if from == store.StatePooled || from == store.StatePrestarted {
				continue
			}
			evs = append(evs, store.Event{ID: newEventID(), At: at.UTC(), Type: api.LifecycleLost, Tenant: t, Sandbox: id, State: api.StateLost, Reason: reason})
		}
		if err := rows.Err(); err != nil || len(evs) == 0 {
			return err
		}
		return appendEvents(ctx, tx, evs)
	})
	return fenced, err
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Secret returns the value kept under name, storing make()'s first if
// there is none.
func (s *Store) Secret(ctx context.Context, name string, make func() ([]byte, error)) ([]byte, error) {
	if !storable(name) {
		return nil, fmt.Errorf("%w: secret name: text with a NUL or not UTF-8", errdefs.ErrInvalid)
	}
	get := func(q querier, v *[]byte) (bool, error) {
		err := q.QueryRow(ctx, `SELECT value FROM secrets WHERE name = $1`, name).Scan(v)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	var v []byte
	var found bool
	if err := s.read(ctx, func(q querier) (err error) { found, err = get(q, &v); return err }); err != nil || found {
		return v, err
	}
	mine, err := make()
	if err != nil {
		return nil, err
	}
	if mine == nil {
		mine = []byte{}
	}
	err = s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		// A concurrent first call's insert makes this one wait for its
		// commit, then do nothing; the next statement sees its value.
		if _, err := tx.Exec(ctx, `INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, mine); err != nil {
			return err
		}
		_, err := get(tx, &v)
		return err
	})
	return v, err
}

func orEmptyList(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}
