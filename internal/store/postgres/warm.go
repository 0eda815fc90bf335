package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// ServeWarm is Update of pooled sandbox sb (its stored state one of from),
// which now serves the warm placement recorded as row placed, and the
// delete of that row, in one transaction; a prestarted sandbox serving a
// cold placement is written the same way. Place counts a node's pooled
// sandboxes less the warm placements creating there: written apart, the
// pooled sandbox would be gone while its placement still counted, and a
// placement checked between the two writes would find the node's warm
// sandboxes all reserved. A placed row already gone (swept) is no error.
func (s *Store) ServeWarm(ctx context.Context, placed string, sb *store.Sandbox, from ...string) error {
	if !storable(sb.ID) || !storable(placed) {
		return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
	}
	if err := checkText(sb); err != nil {
		return err
	}
	// The placed row goes first: what it charged its tenant is then not
	// counted twice when sb's update checks the quota (a tenant the
	// placed row brought to its quota is served all the same).
	//
	// Read committed, as UpdateAll is and for its reason (both writes
	// change the node's kept sums); serializable again if the update
	// needs it (errStrict). Both sandboxes' rows are locked, in ID order,
	// before either write takes the sums' row.
	run := func(iso pgx.TxIsoLevel) error {
		return s.writeAt(ctx, iso, s.as, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM sandboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE`, []string{placed, sb.ID}); err != nil {
				return err
			}
			var cur, node string
			err := tx.QueryRow(ctx, `DELETE FROM sandboxes WHERE id = $1 RETURNING state, node`, placed).Scan(&cur, &node)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return err
			default:
				if err := s.as.owns(placed, node, node); err != nil {
					return err
				}
				if err := transition(ctx, tx, placed, cur, "deleted", ""); err != nil {
					return err
				}
			}
			return update(ctx, tx, s.as, sb, from, iso == pgx.Serializable)
		})
	}
	err := run(pgx.ReadCommitted)
	if errors.Is(err, errStrict) {
		err = run(pgx.Serializable)
	}
	return err
}
