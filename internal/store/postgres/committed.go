package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
)

// What the nodes' sandboxes hold. Triggers on sandboxes keep each node's
// sums in node_committed (migration 0013 says how and why there): Place,
// Move and Nodes read one row a node, not one a sandbox. What is not in
// the sums is read from the few rows it needs: a warm placement's
// reservations (the partial index sandboxes_warm), and a node's taken
// slots only when they are not 0 .. n-1 (after a delete or a move away).

// committedQuery reads the kept sums of nodes $1: what their sandboxes
// hold, how many are recorded on each, and the slot above all they took.
const committedQuery = `SELECT node, cpu::float8, memory_mib, disk_gib, sandboxes, recorded, slot_top
	FROM node_committed WHERE node = ANY($1)`

// sparseSlotsQuery reads the taken slots of the nodes of $1 whose slots
// have holes, the only ones whose lowest free slot is not slot_top.
const sparseSlotsQuery = `SELECT s.node, s.slot FROM node_committed c JOIN sandboxes s ON s.node = c.node
	WHERE c.node = ANY($1) AND c.recorded <> c.slot_top`

// warmRowsQuery reads the pooled sandboxes of nodes $1, and the warm
// placements creating there. The states are written out, not parameters,
// so that the planner matches the partial index sandboxes_warm.
var warmRowsQuery = fmt.Sprintf(`SELECT node, state, cpu, memory_mib, disk_gib, template_version, runtime FROM sandboxes
	WHERE node = ANY($1) AND (state = '%[1]s' OR (state = '%[2]s' AND warm))`, store.StatePooled, api.StateCreating)

// queueHeld queues on b the reads of what the sandboxes of nodes names
// hold, into the targets that of returns (nil: a node not locked, left
// out). Queued after the nodes' locks, they see what committed before:
// every placement on those nodes since has waited for the locks.
func queueHeld(b *pgx.Batch, names []string, of func(string) *target) {
	b.Queue(committedQuery, names).Query(func(rows pgx.Rows) error {
		var node string
		var c store.Resources
		var recorded, top int
		_, err := pgx.ForEachRow(rows, []any{&node, &c.CPU, &c.MemoryMiB, &c.DiskGiB, &c.Sandboxes, &recorded, &top}, func() error {
			if t := of(node); t != nil {
				t.committed = c
				// Dense: slots 0 .. top-1 are all taken.
				if recorded == top {
					t.next = top
				}
			}
			return nil
		})
		return err
	})
	b.Queue(sparseSlotsQuery, names).Query(func(rows pgx.Rows) error {
		var node string
		var slot int
		_, err := pgx.ForEachRow(rows, []any{&node, &slot}, func() error {
			if t := of(node); t != nil {
				t.used[slot] = true
			}
			return nil
		})
		return err
	})
	b.Queue(warmRowsQuery, names).Query(func(rows pgx.Rows) error {
		var node, state, version, rt string
		var r store.Resources
		_, err := pgx.ForEachRow(rows, []any{&node, &state, &r.CPU, &r.MemoryMiB, &r.DiskGiB, &version, &rt}, func() error {
			t := of(node)
			if t == nil {
				return nil
			}
			k := warmKey(version, rt)
			w := t.warm[k]
			if w == nil {
				w = &warmSet{}
				t.warm[k] = w
			}
			if state == store.StatePooled {
				w.pooled++
				r.Sandboxes = 1
				w.holds = store.Resources{}
				w.holds.Add(state, r)
			} else {
				w.reserved++
			}
			return nil
		})
		return err
	})
}
