package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Move hands an archived or lost sandbox to another node, archived.
//
// One read-committed transaction, locking as Place does: the target
// node's row first (its capacity and slots), then the sandbox's row. The
// sandbox is counted as running on the target, so that a node chosen for
// it can start it; archived, it holds nothing there until it starts.
func (s *Store) Move(ctx context.Context, id, from, to, reason string) (store.Sandbox, error) {
	if !storable(id) || !storable(from) {
		return store.Sandbox{}, fmt.Errorf("sandbox %.40q: %w", id, errdefs.ErrNotFound)
	}
	if !storable(to) || !storable(reason) {
		return store.Sandbox{}, fmt.Errorf("%w: move to node %.40q (%.40q)", errdefs.ErrInvalid, to, reason)
	}
	var out store.Sandbox
	err := s.writeAt(ctx, pgx.ReadCommitted, nil, func(tx pgx.Tx) error {
		var err error
		out, err = moveTx(ctx, tx, id, from, to, reason)
		return err
	})
	return out, err
}

func moveTx(ctx context.Context, tx pgx.Tx, id, from, to, reason string) (store.Sandbox, error) {
	var t target
	var runtimes string
	err := tx.QueryRow(ctx, `SELECT runtimes, cpu, memory_mib, disk_gib, sandboxes, epoch, state, schedule
		FROM nodes WHERE name = $1 FOR UPDATE`, to).Scan(&runtimes, &t.capacity.CPU, &t.capacity.MemoryMiB,
		&t.capacity.DiskGiB, &t.capacity.Sandboxes, &t.epoch, &t.state, &t.schedule)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Sandbox{}, fmt.Errorf("node %.40q has not joined: %w", to, store.ErrNoRoom)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := json.Unmarshal([]byte(runtimes), &t.runtimes); err != nil {
		return store.Sandbox{}, err
	}
	t.used, t.warm = map[int]bool{}, map[string]*warmSet{}
	var b pgx.Batch
	queueHeld(&b, []string{to}, func(string) *target { return &t })
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return store.Sandbox{}, err
	}

	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM sandboxes WHERE id = $1 FOR UPDATE`, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	sbs, err := pgx.CollectRows(rows, scanSandbox)
	if err != nil {
		return store.Sandbox{}, err
	}
	if len(sbs) == 0 {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sb := sbs[0]
	switch {
	case sb.Node != from:
		return store.Sandbox{}, fmt.Errorf("sandbox %s is on node %q, not %q: %w", id, sb.Node, from, errdefs.ErrConflict)
	case sb.State != api.StateArchived && sb.State != api.StateLost:
		return store.Sandbox{}, fmt.Errorf("sandbox %s is %s, not archived or lost: %w", id, sb.State, errdefs.ErrConflict)
	case to == from:
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is on node %q already", errdefs.ErrInvalid, id, to)
	case t.state != store.NodeLive:
		return store.Sandbox{}, fmt.Errorf("node %.40q is %s: %w", to, t.state, store.ErrNoRoom)
	case t.schedule != "":
		return store.Sandbox{}, fmt.Errorf("node %.40q is %s: %w", to, t.schedule, store.ErrNoRoom)
	case !slices.Contains(t.runtimes, sb.Runtime):
		return store.Sandbox{}, fmt.Errorf("node %.40q has no runtime %.40q: %w", to, sb.Runtime, store.ErrNoRoom)
	}
	running := sb
	running.State = api.StateRunning
	if !t.fits(&running) {
		return store.Sandbox{}, fmt.Errorf("node %.40q holds %+v of %+v: %w", to, t.committed, t.capacity, store.ErrNoRoom)
	}
	for t.used[t.next] {
		t.next++
	}
	was := sb.State
	sb.Node, sb.Slot, sb.State, sb.LostFrom, sb.Error = to, t.next, api.StateArchived, "", reason
	if _, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $2, slot = $3, state = $4, lost_from = '', error = $5
		WHERE id = $1`, id, to, sb.Slot, sb.State, reason); err != nil {
		return store.Sandbox{}, err
	}
	// Recorded even when the state stays archived: the move is the news.
	return sb, transition(ctx, tx, id, was, sb.State, reason)
}
