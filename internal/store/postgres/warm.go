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
	return s.write(ctx, func(tx pgx.Tx) error {
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
		return update(ctx, tx, s.as, sb, from, true)
	})
}
