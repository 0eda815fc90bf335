package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Sandboxes move between the nodes of a cluster through object storage:
// a sandbox's files go to its archive key (Archive), the row is handed to
// another node (store.Cluster.Move, which takes only archived and lost
// sandboxes: their files are on no node), and the new node's start brings
// the files back (unarchiveLocked). The ID, labels, environment, network
// policy and files stay; the network address follows the new node's slot.
//
// Two operations use it. Drain: a node whose schedule is draining moves
// its own sandboxes away, running ones stopped, archived, moved and
// started again on their new node. Restore: a lost sandbox (its node was
// fenced) is moved from the dead node to a live one and started there
// from what of it reached object storage: its archive, or its latest
// checkpoint (checkpoint.go).

// Mover hands an archived or lost sandbox to another node.
type Mover interface {
	// Move hands sb, archived or lost on sb.Node, to another live,
	// schedulable node with room for it, chosen as a create's node is,
	// archived, recording reason (store.Cluster.Move), and returns it as
	// recorded. No node with room: an error wrapping store.ErrNoRoom.
	Move(ctx context.Context, sb store.Sandbox, reason string) (store.Sandbox, error)
	// Room returns nil if some other node has room for sb now, else an
	// error wrapping store.ErrNoRoom saying why: a drain asks before it
	// stops or archives a sandbox, so that one with nowhere to go is left
	// as it is.
	Room(ctx context.Context, sb store.Sandbox) error
	// DeleteLost deletes sb, lost with its node: it records it deleting
	// if it is still lost on sb.Node (else a conflict: a restore took
	// it), runs cleanup, then removes its record.
	DeleteLost(ctx context.Context, sb store.Sandbox, cleanup func() error) error
}

// DrainReport is what a round of Drain did.
type DrainReport struct {
	Moved int // sandboxes now on other nodes
	// Left are the sandboxes still on the node, by ID, each with why, and
	// the snapshots whose files are still only here, by "snapshot ID".
	Left map[string]string
}

// drainStates are the states Drain moves a sandbox from, and whether it
// runs again on its new node. Other states are in the middle of an
// operation (the next round sees how it ended) or hold nothing to move
// (pooled ones are the pool's, deleting and lost ones nobody's).
var drainStates = map[string]bool{
	api.StateRunning:   true,
	api.StatePaused:    true,
	api.StateSuspended: true,
	api.StateShelved:   true,
	api.StateStopped:   false,
	api.StateArchived:  false,
}

// Drain moves this node's sandboxes to other nodes, for a node whose
// schedule is draining (the cluster layer calls it while it is). A
// sandbox no node has room for stays here as it was, and the next round
// tries again; so does one that failed to move.
func (s *Service) Drain(ctx context.Context) (DrainReport, error) {
	rep := DrainReport{Left: map[string]string{}}
	if s.mover == nil || s.archive == nil || s.name == "" {
		return rep, fmt.Errorf("%w: this node cannot move sandboxes: it needs a cluster and an archive store", errdefs.ErrUnavailable)
	}
	if err := s.usable(); err != nil {
		return rep, err
	}
	ctx = context.WithoutCancel(ctx)
	// Warm sandboxes are not moved: they are discarded, and the pools
	// stay empty while the node drains.
	s.pools.Hold(ctx, true)
	sbs, err := s.store.ListNode(ctx, s.name)
	if err != nil {
		return rep, err
	}
	s.archiveSnapshotsHere(ctx, rep.Left)
	reason := fmt.Sprintf("node %s is draining", s.name)
	for _, sb := range sbs {
		if _, ok := drainStates[sb.State]; !ok {
			if sb.State != api.StateLost {
				rep.Left[sb.ID] = "is " + sb.State
			}
			continue
		}
		moved, err := s.moveAway(ctx, sb.ID, reason)
		if moved.Node == "" || moved.Node == s.name {
			s.log.Warn("drain: sandbox stays", "sandbox", sb.ID, "node", s.name, "err", err)
			rep.Left[sb.ID] = err.Error()
			continue
		}
		if err != nil {
			// Moved, but not running yet: a start on its node runs it.
			s.log.Error("drain: sandbox moved, not started", "sandbox", sb.ID, "to", moved.Node, "err", err)
		}
		s.log.Info("drain: sandbox moved", "sandbox", sb.ID, "from", s.name, "to", moved.Node, "state", moved.State)
		rep.Moved++
	}
	return rep, nil
}

// archiveSnapshotsHere archives the snapshots whose files are on this
// node, for a drain: a snapshot not archived is on its node only, and
// would go with it; archived, any node can create from it. It runs before
// the sandboxes move, while they are still this node's (the store lets
// only a snapshot's sandbox's node change it). Those that fail are noted
// in left, and the next round tries again.
func (s *Service) archiveSnapshotsHere(ctx context.Context, left map[string]string) {
	ids, err := s.layers.SnapshotIDs()
	if err != nil {
		s.log.Error("drain: listing snapshots", "err", err)
		return
	}
	for _, id := range ids {
		// Checkpoints' snapshots are no records' (their uploads are
		// the checkpoints), nor are copies of archived ones.
		sn, err := s.store.GetSnapshot(ctx, id)
		if err != nil || sn.State != api.SnapshotReady {
			continue
		}
		if _, err := s.ArchiveSnapshot(ctx, id); err != nil {
			s.log.Warn("drain: snapshot stays", "snapshot", id, "node", s.name, "err", err)
			left["snapshot "+id] = err.Error()
			continue
		}
		s.log.Info("drain: snapshot archived", "snapshot", id, "node", s.name)
	}
}

// Undrain ends this node's drain (its schedule is no longer draining):
// the pools fill again. What moved stays where it went.
func (s *Service) Undrain(ctx context.Context) { s.pools.Hold(ctx, false) }

// moveAway moves sandbox id of this node to another one, and runs it there
// if it ran here. It returns the sandbox as it is after a move, with an
// error if it did not start there; nothing and an error if it stays.
func (s *Service) moveAway(ctx context.Context, id, reason string) (api.Sandbox, error) {
	sb, unlock, err := s.acquire(ctx, id, "move")
	if err != nil {
		return api.Sandbox{}, err
	}
	run := drainStates[sb.State]
	if sb.State != api.StateArchived {
		if err := s.mover.Room(ctx, sb); err != nil {
			unlock()
			return api.Sandbox{}, err
		}
	}
	t0 := time.Now()
	if run {
		if sb.State == api.StateShelved {
			now := time.Now().UTC()
			sb.State, sb.StoppedAt, sb.Error = api.StateStopped, &now, reason
			err = s.setState(ctx, &sb, api.StateShelved)
		} else {
			err = s.haltLocked(ctx, &sb, reason)
		}
		if err != nil {
			unlock()
			return api.Sandbox{}, err
		}
	}
	if sb.State == api.StateStopped {
		if err := s.archiveLocked(ctx, &sb, reason); err != nil {
			s.startAgain(ctx, &sb, run)
			unlock()
			return api.Sandbox{}, err
		}
	}
	moved, err := s.mover.Move(ctx, sb, reason)
	if err != nil {
		// It stays, as it was.
		s.startAgain(ctx, &sb, run)
		unlock()
		return api.Sandbox{}, err
	}
	unlock()
	s.forget(id)
	s.log.Debug("moved", "sandbox", id, "to", moved.Node, "op", "move", "ms", ms(t0))
	if !run {
		return moved.Sandbox, nil
	}
	out, err := s.startOn(ctx, moved.Node, id)
	if err != nil {
		// Archived on its new node: a start there runs it.
		return moved.Sandbox, fmt.Errorf("moved to node %s, but starting it there failed: %w", moved.Node, err)
	}
	return out, nil
}

// startAgain brings back a sandbox a move stopped (run) or archived, for
// it to stay here as it was.
func (s *Service) startAgain(ctx context.Context, sb *store.Sandbox, run bool) {
	if sb.State == api.StateArchived && run {
		if err := s.unarchiveLocked(ctx, sb); err != nil {
			s.log.Error("bringing back a sandbox that could not move", "sandbox", sb.ID, "err", err)
			return
		}
	}
	if run && sb.State == api.StateStopped {
		if err := s.restartLocked(ctx, sb); err != nil {
			s.log.Error("starting again a sandbox that could not move", "sandbox", sb.ID, "err", err)
		}
	}
}

// startOn starts archived sandbox id on node, here or through its peer.
func (s *Service) startOn(ctx context.Context, node, id string) (api.Sandbox, error) {
	if node == s.name {
		return s.Start(ctx, id)
	}
	if s.peers == nil {
		return api.Sandbox{}, fmt.Errorf("%w: this node cannot reach node %s", errdefs.ErrUnavailable, node)
	}
	return s.peers.StartOn(ctx, node, id)
}

// forget drops what this Service keeps of a sandbox that is no longer its.
func (s *Service) forget(id string) {
	s.activityMu.Lock()
	delete(s.activity, id)
	delete(s.checkpointed, id)
	s.activityMu.Unlock()
	s.metrics.Forget(id)
}

// restoreLost moves lost sandbox sb (its node was fenced) to a node the
// scheduler picks and starts it there from what of it reached object
// storage: its archive if it was archived, else its latest checkpoint. The
// answer's RestoredFrom says which, and from when; so does the move's
// transition. Several nodes restoring it at once: one move wins, the
// others are a conflict.
func (s *Service) restoreLost(ctx context.Context, sb store.Sandbox) (api.Sandbox, error) {
	if s.mover == nil || s.archive == nil {
		return api.Sandbox{}, fmt.Errorf("%w: sandbox %s was lost with its node, and this node cannot restore it: it needs a cluster and an archive store", errdefs.ErrUnavailable, sb.ID)
	}
	if err := s.usable(); err != nil {
		return api.Sandbox{}, err
	}
	unlock := s.lock(sb.ID)
	from, err := s.lostFiles(ctx, sb)
	if err != nil {
		unlock()
		return api.Sandbox{}, err
	}
	reason := fmt.Sprintf("restored from %s after node %s was lost", from, sb.Node)
	moved, err := s.mover.Move(ctx, sb, reason)
	unlock()
	if err != nil {
		return api.Sandbox{}, err
	}
	s.log.Info("restoring lost sandbox", "sandbox", sb.ID, "from", sb.Node, "to", moved.Node, "source", from)
	out, err := s.startOn(ctx, moved.Node, sb.ID)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("sandbox %s, %s, moved to node %s, but starting it there failed (start it again): %w", sb.ID, reason, moved.Node, err)
	}
	out.RestoredFrom = from
	return out, nil
}

// lostFiles makes sure lost sandbox sb's files are under its archive key
// and says what they are: "archive" if it was archived, else "checkpoint
// TIME" of the latest checkpoint, copied there. A conflict if there is
// neither.
func (s *Service) lostFiles(ctx context.Context, sb store.Sandbox) (string, error) {
	if sb.LostFrom == api.StateArchived || sb.LostFrom == api.StateArchiving {
		// An object that is there is whole (blob.Store's Put).
		if keys, err := s.archive.List(ctx, archiveKey(sb.ID)); err != nil {
			return "", fmt.Errorf("%w: reading object storage failed", errdefs.ErrUnavailable)
		} else if slices.Contains(keys, archiveKey(sb.ID)) {
			return "archive", nil
		}
	}
	key, at, err := s.latestCheckpoint(ctx, sb.ID)
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", fmt.Errorf("%w: sandbox %s was lost with node %s, and %v: it cannot be restored, only deleted",
			errdefs.ErrConflict, sb.ID, sb.Node, errNothingStored)
	}
	err = s.archive.Put(ctx, archiveKey(sb.ID), func(w io.Writer) error {
		r, err := s.archive.Get(ctx, key)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(w, r)
		return err
	})
	if err != nil {
		s.log.Error("copying checkpoint to archive", "sandbox", sb.ID, "err", err)
		return "", fmt.Errorf("%w: reading the checkpoint failed", errdefs.ErrUnavailable)
	}
	return "checkpoint " + at.Format(time.RFC3339), nil
}

// deleteLost deletes lost sandbox sb, of a fenced node: what of it is in
// object storage, then its record.
func (s *Service) deleteLost(ctx context.Context, sb store.Sandbox) error {
	if s.mover == nil {
		// No node runs it and this one cannot move or delete it: refused
		// as any other operation on a lost sandbox is.
		return fmt.Errorf("%w: sandbox %s is lost: %s", errdefs.ErrConflict, sb.ID, sb.Error)
	}
	unlock := s.lock(sb.ID)
	defer unlock()
	err := s.mover.DeleteLost(ctx, sb, func() error {
		if s.archive == nil {
			return nil
		}
		if err := s.archive.Delete(ctx, archiveKey(sb.ID)); err != nil && !isNotExist(err) {
			return err
		}
		return s.removeCheckpoints(ctx, sb.ID)
	})
	if err != nil {
		return err
	}
	s.tmpls.Release(ctx, sb.TemplateVersion)
	return nil
}

// errNothingStored is a lost sandbox of which nothing reached object
// storage.
var errNothingStored = errors.New("nothing of it reached object storage (no archive, no checkpoint)")
