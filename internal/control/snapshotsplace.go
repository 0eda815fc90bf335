package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// In a cluster a create from a snapshot is placed like any create
// (capacity, runtime, quotas), but where it may go depends on where the
// snapshot's files are:
//
//   - An archived snapshot's files are in object storage, which every node
//     reaches: the scheduler places the create on any node, and that node
//     fetches a copy of the files for the create (withSnapshot), leaving
//     the snapshot archived. The answer's snapshot_pull and the placement
//     record say so.
//   - A snapshot that is not archived is on the node it was taken on: the
//     create can only go there, and if that node cannot take it (gone,
//     lost, cordoned, draining, full) the answer names the node and says
//     to archive snapshots that must outlive their node.

// snapshotNode is the node a create from snapshot sn must be placed on: ""
// for an archived snapshot (any node), otherwise the node holding its
// files. That is this node if it holds them, else the node of the sandbox
// it was taken of: a snapshot is taken on its sandbox's node, and the
// store lets only that node change it.
func (s *Service) snapshotNode(ctx context.Context, sn store.Snapshot) (string, error) {
	switch sn.State {
	case api.SnapshotArchived:
		return "", nil
	case api.SnapshotReady:
	default:
		return "", fmt.Errorf("%w: snapshot %s is %s", errdefs.ErrConflict, sn.ID, sn.State)
	}
	if s.layers.SnapshotExists(sn.ID) {
		return s.name, nil
	}
	sb, err := s.store.Get(ctx, sn.SandboxID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("%w: snapshot %s is not archived, and its files are not on node %s; its sandbox %s, whose node holds them, is gone: "+
			"create from it through the node that took it, or archive it there (atoll snapshot archive %s) for any node to create from it",
			errdefs.ErrConflict, sn.ID, s.name, sn.SandboxID, sn.ID)
	}
	if err != nil {
		return "", err
	}
	return sb.Node, nil
}

// snapshotUnplaceable explains a placement refused for a create from a
// snapshot held on node (not archived): the node that holds it could not
// take it (err says why).
func snapshotUnplaceable(id, node string, err error) error {
	return fmt.Errorf("%w: snapshot %s is not archived, so its files are only on node %s, which cannot take the sandbox (%v); "+
		"a snapshot not archived is lost with its node: archive snapshots (atoll snapshot archive ID) for any node to create from them",
		errdefs.ErrUnavailable, id, node, err)
}

// pullSnapshot fetches archived snapshot id from the archive store into a
// local copy for a create or restore here to use (the caller holds its
// lock and removes the copy after); the snapshot stays archived. A copy
// left by a crash is removed by recoverSnapshots (archived, yet local).
func (s *Service) pullSnapshot(ctx context.Context, id string) (*api.SnapshotPull, error) {
	if s.archive == nil {
		return nil, fmt.Errorf("%w: this server has no archive store", errdefs.ErrUnavailable)
	}
	t0 := time.Now()
	r, err := s.archive.Get(ctx, snapshotKey(id))
	if err != nil {
		s.log.Error("fetching archived snapshot", "snapshot", id, "err", err)
		return nil, fmt.Errorf("%w: snapshot %s: reading it from the cluster's object store failed", errdefs.ErrUnavailable, id)
	}
	c := &counter{op: "pulling"}
	err = s.layers.UnpackSnapshot(id, io.TeeReader(r, c))
	r.Close()
	if err != nil {
		s.log.Error("unpacking archived snapshot", "snapshot", id, "err", err)
		_ = s.layers.RemoveSnapshot(id)
		return nil, fmt.Errorf("%w: snapshot %s: unpacking it from the cluster's object store failed", errdefs.ErrUnavailable, id)
	}
	pull := &api.SnapshotPull{Snapshot: id, Bytes: c.done.Load(), MS: float64(time.Since(t0).Microseconds()) / 1000}
	s.log.Info("pulled snapshot", "snapshot", id, "bytes", pull.Bytes, "ms", pull.MS)
	return pull, nil
}
