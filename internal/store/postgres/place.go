package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Place records each placement's sandbox on its node, if it has room.
//
// One read-committed transaction for the batch, in two round trips: the
// first locks the target nodes (in name order, as Expire does: no
// deadlock) and reads what their sandboxes hold, which IDs exist and which
// versions; the second inserts the placements that fit, each with its
// first transition. A retry (a lost connection, a deadlock) runs the whole
// batch again from the start, so nothing of an attempt survives into the
// next but the arguments as they came.
func (s *Store) Place(ctx context.Context, sbs []*store.Sandbox) []error {
	return s.place(ctx, sbs, nil)
}

// target is a node placements go to, as locked.
type target struct {
	runtimes  []string
	capacity  store.Resources
	committed store.Resources
	epoch     int64
	state     string
	schedule  string
	used      map[int]bool // slots held
	next      int          // no slot below is free
	// warm are the node's pooled sandboxes by warmKey: how many, how many
	// of them warm placements still creating there have reserved, and
	// what one holds.
	warm map[string]*warmSet
}

// warmSet is what a node's pooled sandboxes of one template version and
// runtime are to Place.
type warmSet struct {
	pooled, reserved int
	holds            store.Resources
}

// warmKey keys the pooled sandboxes a warm placement of version v and
// runtime rt may take.
func warmKey(v, rt string) string { return v + "\x00" + rt }

// reserve takes one of t's unreserved pooled sandboxes for warm placement
// sb, which then holds only what it needs beyond it, or returns
// ErrNoWarm.
func (t *target) reserve(sb *store.Sandbox) error {
	w := t.warm[warmKey(sb.TemplateVersion, sb.Runtime)]
	if w == nil || w.reserved >= w.pooled {
		return fmt.Errorf("node %.40q, template version %.40q: %w", sb.Node, sb.TemplateVersion, store.ErrNoWarm)
	}
	t.release(w, 1)
	w.reserved++
	return nil
}

// release takes n pooled sandboxes of w out of what t holds: they are
// reserved, and become the sandboxes reserving them.
func (t *target) release(w *warmSet, n int) {
	t.committed.CPU -= float64(n) * w.holds.CPU
	t.committed.MemoryMiB -= int64(n) * w.holds.MemoryMiB
	t.committed.DiskGiB -= int64(n) * w.holds.DiskGiB
	t.committed.Sandboxes -= n * w.holds.Sandboxes
}

// fits reports whether sb fits on t, beside what it holds.
func (t *target) fits(sb *store.Sandbox) bool {
	c := t.committed
	c.Add(sb.State, need(sb))
	const eps = 1e-9 // CPU sums are floats
	return c.CPU <= t.capacity.CPU+eps && c.MemoryMiB <= t.capacity.MemoryMiB &&
		c.DiskGiB <= t.capacity.DiskGiB && c.Sandboxes <= t.capacity.Sandboxes
}

// take records sb on t in its lowest free slot.
func (t *target) take(sb *store.Sandbox) {
	t.committed.Add(sb.State, need(sb))
	for t.used[t.next] {
		t.next++
	}
	sb.Slot = t.next
	t.used[t.next] = true
}

func need(sb *store.Sandbox) store.Resources {
	return store.Resources{CPU: sb.CPU, MemoryMiB: sb.MemoryMiB, DiskGiB: sb.DiskGiB, Sandboxes: 1}
}

// checkPlacement returns ErrInvalid for a placement no node could take.
func checkPlacement(sb *store.Sandbox) error {
	if err := checkText(sb); err != nil {
		return err
	}
	if sb.Node == "" || sb.CPU < 0 || math.IsNaN(sb.CPU) || math.IsInf(sb.CPU, 0) || sb.MemoryMiB < 0 || sb.DiskGiB < 0 {
		return fmt.Errorf("%w: placement of %.40q on %.40q: %v CPU, %d MiB, %d GiB", errdefs.ErrInvalid,
			sb.ID, sb.Node, sb.CPU, sb.MemoryMiB, sb.DiskGiB)
	}
	return nil
}

// insertPlaced is the statement that inserts n sandboxes, with their
// first transitions, in one go: rows of a sandbox whose ID exists already
// (a concurrent placement of the same ID: it waits for that one's commit
// rather than failing the batch) are left out, and it returns the IDs it
// inserted. Parameters: each sandbox's args, then the transitions' time.
func insertPlaced(n int) string {
	var b strings.Builder
	b.WriteString(`WITH ins AS (INSERT INTO sandboxes (` + insertColumns + `) VALUES `)
	per := insertCount
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(" + placeholders(i*per, per) + ")")
	}
	fmt.Fprintf(&b, ` ON CONFLICT (id) DO NOTHING RETURNING id, state)
INSERT INTO transitions (sandbox_id, from_state, to_state, reason, at) SELECT id, '', state, '', $%d FROM ins
RETURNING sandbox_id`, n*per+1)
	return b.String()
}

// maxInsert is the most sandboxes one statement inserts.
const maxInsert = 1000

// place is Place, or through a view (as not nil) Create: on as's node,
// which must be live under as's epoch, schedulable or not.
func (s *Store) place(ctx context.Context, sbs []*store.Sandbox, as *writer) []error {
	errs := make([]error, len(sbs))
	type arg struct {
		slot   int
		tenant string
	}
	came := make([]arg, len(sbs))
	var todo []int
	for i, sb := range sbs {
		came[i] = arg{sb.Slot, sb.Tenant}
		if errs[i] = checkPlacement(sb); errs[i] == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return errs
	}
	// First the placements whose nodes no other transaction holds
	// (SKIP LOCKED), then, in a transaction of their own, those on the
	// nodes that were held, waiting for them. A batch that waited for one
	// node while holding fifty others made every batch after it wait too:
	// at 50,000 placements a burst was mostly batches waiting in line.
	// A node's own create (as) is one placement: it waits.
	skips := 0
	if as == nil {
		skips = skipRounds
	}
	for round := 0; len(todo) > 0; round++ {
		skip := round < skips
		err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
			for _, i := range todo {
				errs[i] = nil
				sbs[i].Slot, sbs[i].Tenant = came[i].slot, came[i].tenant
			}
			return placeTx(ctx, tx, sbs, todo, errs, as, skip)
		})
		var held []int
		for _, i := range todo {
			if err != nil {
				errs[i] = err
			}
			if errs[i] == errHeld {
				held = append(held, i)
				continue
			}
			if errs[i] != nil {
				// Undone: sb is as it came.
				sbs[i].Slot, sbs[i].Tenant = came[i].slot, came[i].tenant
			}
		}
		todo = held
	}
	return errs
}

// skipRounds is how many rounds skip the nodes held before the last waits.
var skipRounds = 1

// errHeld marks a placement whose node another transaction held when
// Place skipped it: it is placed again, waiting for the node.
var errHeld = errors.New("node held by another placement")

func placeTx(ctx context.Context, tx pgx.Tx, sbs []*store.Sandbox, todo []int, errs []error, as *writer, skip bool) error {
	var names, ids, versions, tenants []string
	for _, i := range todo {
		sb := sbs[i]
		names = append(names, sb.Node)
		tenants = append(tenants, tenantOf(sb.Tenant))
		ids = append(ids, sb.ID)
		if sb.TemplateVersion != "" {
			versions = append(versions, sb.TemplateVersion)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)

	// The first round trip. The statements run in order, each seeing
	// what committed before it began: the sums after the locks.
	targets := map[string]*target{}
	exists := map[string]bool{}
	held := map[string]bool{}
	var b pgx.Batch
	// Before reading versions: CollectTemplates waits for this
	// transaction, or this one for it (see there).
	b.Queue(`LOCK TABLE sandboxes IN ROW EXCLUSIVE MODE`)
	b.Queue(`SELECT id FROM sandboxes WHERE id = ANY($1)`, ids).Query(func(rows pgx.Rows) error {
		var id string
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error { exists[id] = true; return nil })
		return err
	})
	b.Queue(`SELECT id FROM template_versions WHERE id = ANY($1)`, versions).Query(func(rows pgx.Rows) error {
		var id string
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error { held[id] = true; return nil })
		return err
	})
	// Last, so that the locks are held for as little as may be.
	lock := `SELECT name, runtimes, cpu, memory_mib, disk_gib, sandboxes, epoch, state, schedule
		FROM nodes WHERE name = ANY($1) ORDER BY name FOR UPDATE`
	if skip {
		lock += ` SKIP LOCKED`
	}
	b.Queue(lock, names).Query(func(rows pgx.Rows) error {
		var name, runtimes string
		var t target
		_, err := pgx.ForEachRow(rows, []any{&name, &runtimes, &t.capacity.CPU, &t.capacity.MemoryMiB, &t.capacity.DiskGiB,
			&t.capacity.Sandboxes, &t.epoch, &t.state, &t.schedule}, func() error {
			nt := t
			nt.used, nt.warm = map[int]bool{}, map[string]*warmSet{}
			if err := json.Unmarshal([]byte(runtimes), &nt.runtimes); err != nil {
				return err
			}
			targets[name] = &nt
			return nil
		})
		return err
	})
	queueHeld(&b, names, func(name string) *target { return targets[name] })
	// The quotas of the tenants that have limits, their rows locked (in
	// name order: no deadlock) and updated (tenants.go says why), then
	// what their sandboxes hold, read after the locks.
	quotas := map[string]store.Quota{}
	used := map[string]store.Resources{}
	b.Queue(`WITH l AS (SELECT name FROM tenants WHERE name = ANY($1) AND `+limited+` ORDER BY name FOR UPDATE)
		UPDATE tenants t SET charged = charged + 1 FROM l WHERE t.name = l.name
		RETURNING t.name, max_sandboxes, max_cpu, max_memory_mib, max_disk_gib`, tenants).Query(func(rows pgx.Rows) error {
		var name string
		var q store.Quota
		_, err := pgx.ForEachRow(rows, []any{&name, &q.Sandboxes, &q.CPU, &q.MemoryMiB, &q.DiskGiB}, func() error {
			quotas[name] = q
			return nil
		})
		return err
	})
	// Driven by the limited tenants' rows (a nested loop over the index
	// sandboxes_tenant): with none, no sandbox row is read. As a semi-join
	// the planner scanned every sandbox in each batch.
	b.Queue(`SELECT t.name, u.state, u.n, u.cpu, u.mem, u.disk FROM tenants t CROSS JOIN LATERAL (
			SELECT state, COUNT(*) AS n, COALESCE(SUM(cpu), 0) AS cpu, COALESCE(SUM(memory_mib), 0) AS mem, COALESCE(SUM(disk_gib), 0) AS disk
			FROM sandboxes s WHERE s.tenant = t.name GROUP BY state) u
		WHERE t.name = ANY($1) AND `+limited, tenants).Query(func(rows pgx.Rows) error {
		var tn, state string
		var n int
		var cpu float64
		var mem, disk int64
		_, err := pgx.ForEachRow(rows, []any{&tn, &state, &n, &cpu, &mem, &disk}, func() error {
			addUse(used, tn, state, n, cpu, mem, disk)
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return err
	}
	// A pooled sandbox reserved by a warm placement still creating is
	// counted twice until its node serves the placement from it: once.
	for _, t := range targets {
		for _, w := range t.warm {
			t.release(w, min(w.reserved, w.pooled))
		}
	}

	// Decide, in the batch's order; then the second round trip.
	var values []any
	var queued []int
	for _, i := range todo {
		sb := sbs[i]
		t := targets[sb.Node]
		switch {
		case t == nil && skip:
			errs[i] = errHeld // or not joined: the next round says which
			continue
		case t == nil:
			errs[i] = fmt.Errorf("node %.40q has not joined: %w", sb.Node, store.ErrNoRoom)
		case as != nil:
			errs[i] = as.live(t.epoch, t.state)
		case t.state != store.NodeLive:
			errs[i] = fmt.Errorf("node %.40q is %s: %w", sb.Node, t.state, store.ErrNoRoom)
		case t.schedule != "":
			errs[i] = fmt.Errorf("node %.40q is %s: %w", sb.Node, t.schedule, store.ErrNoRoom)
		}
		// Before the node's room: a tenant over a quota is refused on
		// every node, and the scheduler does not try the next.
		over := quotaOver(quotas, used, sb)
		switch {
		case errs[i] != nil:
		case !slices.Contains(t.runtimes, sb.Runtime):
			errs[i] = fmt.Errorf("node %.40q has no runtime %.40q: %w", sb.Node, sb.Runtime, store.ErrNoRoom)
		case exists[sb.ID]:
			errs[i] = fmt.Errorf("sandbox %s exists already: %w", sb.ID, errdefs.ErrConflict)
		case sb.TemplateVersion != "" && !held[sb.TemplateVersion]:
			errs[i] = fmt.Errorf("template version %s: %w", sb.TemplateVersion, errdefs.ErrNotFound)
		case over != nil:
			errs[i] = over
		case sb.Warm && as == nil:
			// After the checks above, which a reservation must not
			// outlive: it is undone if the sandbox does not fit.
			if errs[i] = t.reserve(sb); errs[i] == nil && !t.fits(sb) {
				w := t.warm[warmKey(sb.TemplateVersion, sb.Runtime)]
				w.reserved--
				t.release(w, -1)
				errs[i] = fmt.Errorf("node %.40q holds %+v of %+v: %w", sb.Node, t.committed, t.capacity, store.ErrNoRoom)
			}
		case !t.fits(sb):
			errs[i] = fmt.Errorf("node %.40q holds %+v of %+v: %w", sb.Node, t.committed, t.capacity, store.ErrNoRoom)
		}
		if errs[i] != nil {
			continue
		}
		exists[sb.ID] = true // a second placement of it in this batch
		t.take(sb)
		sb.Tenant = tenantOf(sb.Tenant)
		used[sb.Tenant] = used[sb.Tenant].Plus(store.ChargeOf(sb))
		values = append(values, insertArgs(sb)...)
		queued = append(queued, i)
	}
	if len(queued) == 0 {
		return nil
	}
	// In statements of at most maxInsert rows: PostgreSQL takes 65,535
	// parameters at most.
	per := insertCount
	var inserted []string
	now := time.Now()
	for len(values) > 0 {
		n := min(len(values)/per, maxInsert)
		rows, err := tx.Query(ctx, insertPlaced(n), append(values[:n*per:n*per], now)...)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		inserted = append(inserted, ids...)
		values = values[n*per:]
	}
	if len(inserted) < len(queued) {
		done := map[string]bool{}
		for _, id := range inserted {
			done[id] = true
		}
		for _, i := range queued {
			if !done[sbs[i].ID] {
				errs[i] = fmt.Errorf("sandbox %s exists already: %w", sbs[i].ID, errdefs.ErrConflict)
			}
		}
	}
	return nil
}

// quotaOver is the error of sb's placement if it would take its tenant
// over a quota of quotas (those with limits), beside what used counts.
func quotaOver(quotas map[string]store.Quota, used map[string]store.Resources, sb *store.Sandbox) error {
	t := tenantOf(sb.Tenant)
	q, ok := quotas[t]
	if !ok {
		return nil
	}
	return q.Admit(t, used[t], store.Resources{}, store.ChargeOf(sb))
}
