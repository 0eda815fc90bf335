package server

import (
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
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	var req api.ForkRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	switch {
	case req.Count < 0 || req.Count > MaxForks:
		s.writeError(w, r, fmt.Errorf("%w: count %d: want 1 to %d (0 means 1)", errdefs.ErrInvalid, req.Count, MaxForks))
		return
	case req.Count == 0:
		req.Count = 1
	}
	if err := validateLabels(req.Labels); err != nil {
		s.writeError(w, r, err)
		return
	}
	sbs, err := s.cfg.Sandboxes.Fork(r.Context(), id, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	// The children's clones came with the files, with the parent's
	// tokens: each gets its own.
	for _, sb := range sbs {
		if len(sb.Vaults) > 0 && sb.State == api.StateRunning && s.cfg.VaultMounts != nil {
			if err := s.cfg.VaultMounts.Renew(r.Context(), sb); err != nil {
				s.log.Warn("writing a fork's vault tokens", "sandbox", sb.ID, "err", err)
			}
		}
	}
	writeJSON(w, http.StatusCreated, api.SandboxList{Sandboxes: sbs})
}

func (s *Server) restoreSandbox(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	var req api.RestoreRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !idPattern.MatchString(req.Snapshot) {
		s.writeError(w, r, fmt.Errorf("%w: malformed snapshot ID %q: want 20 characters of [a-z0-9]", errdefs.ErrInvalid, truncate(req.Snapshot)))
		return
	}
	sb, err := s.cfg.Sandboxes.Restore(r.Context(), id, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	var req api.CreateSnapshotRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !snapshotNamePattern.MatchString(req.Name) {
		s.writeError(w, r, fmt.Errorf("%w: malformed snapshot name %q: want at most 63 characters of [A-Za-z0-9._-]", errdefs.ErrInvalid, truncate(req.Name)))
		return
	}
	snap, err := s.cfg.Sandboxes.CreateSnapshot(r.Context(), id, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+snap.ID)
	writeJSON(w, http.StatusCreated, snap)
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
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if snaps == nil {
		snaps = []api.Snapshot{}
	}
	writeJSON(w, http.StatusOK, api.SnapshotList{Snapshots: snaps})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := snapshotID(w, r)
	if !ok {
		return
	}
	snap, err := s.cfg.Sandboxes.GetSnapshot(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := snapshotID(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Sandboxes.DeleteSnapshot(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) archiveSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := snapshotID(w, r)
	if !ok {
		return
	}
	snap, err := s.cfg.Sandboxes.ArchiveSnapshot(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}
