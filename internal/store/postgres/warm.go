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
// delete of that row, in one transaction. Place counts a node's pooled
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
	return s.write(ctx, func(tx pgx.Tx) error {
		if err := update(ctx, tx, s.as, sb, from); err != nil {
			return err
		}
		var cur, node string
		err := tx.QueryRow(ctx, `DELETE FROM sandboxes WHERE id = $1 RETURNING state, node`, placed).Scan(&cur, &node)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.as.owns(placed, node, node); err != nil {
			return err
		}
		return transition(ctx, tx, placed, cur, "deleted", "")
	})
}
