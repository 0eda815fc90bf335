package server

import (
	"context"
	"fmt"
	"net/http"
	"regexp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// MaxForks is the most sandboxes one fork creates.
const MaxForks = 100

// snapshotNamePattern is the shape of snapshot names, which are optional.
var snapshotNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{0,63}$`)

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, true, func(req *api.ForkRequest) error {
		switch {
		case req.Count < 0 || req.Count > MaxForks:
			return fmt.Errorf("%w: count %d: want 1 to %d (0 means 1)", errdefs.ErrInvalid, req.Count, MaxForks)
		case req.Count == 0:
			req.Count = 1
		}
		return validateLabels(req.Labels)
	}, func(ctx context.Context, id string, req api.ForkRequest) (api.SandboxList, error) {
		sbs, err := s.cfg.Sandboxes.Fork(ctx, id, req)
		if sbs == nil {
			sbs = []api.Sandbox{}
		}
		// The children's clones came with the files, with the parent's
		// tokens: each gets its own.
		for _, sb := range sbs {
			if len(sb.Vaults) > 0 && sb.State == api.StateRunning && s.cfg.VaultMounts != nil {
				if rerr := s.cfg.VaultMounts.Renew(ctx, sb); rerr != nil {
					s.log.Warn("writing a fork's vault tokens", "sandbox", sb.ID, "err", rerr)
				}
			}
		}
		return api.SandboxList{Sandboxes: sbs}, err
	}, http.StatusCreated)
}

func (s *Server) restoreSandbox(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, false, func(req *api.RestoreRequest) error {
		if !idPattern.MatchString(req.Snapshot) {
			return fmt.Errorf("%w: malformed snapshot ID %q: want 20 characters of [a-z0-9]", errdefs.ErrInvalid, truncate(req.Snapshot))
		}
		return nil
	}, s.cfg.Sandboxes.Restore, http.StatusOK)
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, true, func(req *api.CreateSnapshotRequest) error {
		if !snapshotNamePattern.MatchString(req.Name) {
			return fmt.Errorf("%w: malformed snapshot name %q: want at most 63 characters of [A-Za-z0-9._-]", errdefs.ErrInvalid, truncate(req.Name))
		}
		return nil
	}, func(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
		snap, err := s.cfg.Sandboxes.CreateSnapshot(ctx, id, req)
		if err == nil {
			w.Header().Set("Location", "/v1/snapshots/"+snap.ID)
		}
		return snap, err
	}, http.StatusCreated)
}

func (s *Server) listSandboxSnapshots(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	s.writeSnapshots(w, r, id)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("sandbox")
	if id != "" && !idPattern.MatchString(id) {
		s.writeError(w, r, fmt.Errorf("%w: malformed sandbox ID %q: want 20 characters of [a-z0-9]", errdefs.ErrInvalid, truncate(id)))
		return
	}
	s.writeSnapshots(w, r, id)
}

func (s *Server) writeSnapshots(w http.ResponseWriter, r *http.Request, sandboxID string) {
	snaps, err := s.cfg.Sandboxes.ListSnapshots(r.Context(), sandboxID)
	if snaps == nil {
		snaps = []api.Snapshot{}
	}
	s.respond(w, r, http.StatusOK, api.SnapshotList{Snapshots: snaps}, err)
}
