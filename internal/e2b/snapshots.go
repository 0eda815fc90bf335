package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Snapshots: E2B names a snapshot like a template, and creates sandboxes
// from it with POST /v2/sandboxes {"templateID": snapshotID}. The atoll
// snapshot ID is the E2B snapshotID; its name, if any, is its one name.

func snapshotInfoOf(sn api.Snapshot) snapshotInfo {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return snapshotInfo{SnapshotID: sn.ID, Names: names}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	id, body, ok := sandboxBody[snapshotRequest](s, w, r, true)
	if !ok {
		return
	}
	if _, err := s.visible(r.Context(), id); err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	sn, err := s.cfg.Sandboxes.CreateSnapshot(r.Context(), id, api.CreateSnapshotRequest{Name: body.Name})
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotInfoOf(sn))
}

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=,
// newest first.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandbox, name := q.Get("sandboxID"), q.Get("name")
	if sandbox != "" && !api.ValidSandboxID(sandbox) {
		writeJSON(w, http.StatusOK, []snapshotInfo{})
		return
	}
	limit, cur, err := pageOf(q)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	snaps, err := s.cfg.Sandboxes.ListSnapshots(r.Context(), sandbox)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	key := func(sn api.Snapshot) cursor { return cursor{sn.CreatedAt.UTC(), sn.ID} }
	newer := func(a, b cursor) bool {
		if !a.t.Equal(b.t) {
			return a.t.After(b.t)
		}
		return a.id > b.id
	}
	var items []api.Snapshot
	for _, sn := range snaps {
		if name != "" && name != sn.Name && name != sn.ID {
			continue
		}
		if cur != nil && !newer(*cur, key(sn)) {
			continue
		}
		items = append(items, sn)
	}
	sort.Slice(items, func(i, j int) bool { return newer(key(items[i]), key(items[j])) })
	if len(items) > limit {
		items = items[:limit]
		w.Header().Set("X-Next-Token", key(items[limit-1]).String())
	}
	out := make([]snapshotInfo, 0, len(items))
	for _, sn := range items {
		out = append(out, snapshotInfoOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot answers DELETE /templates/{templateID}, which E2B SDKs
// use to delete snapshots. Templates are not deleted through this API.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("templateID")
	_, snap, _, err := s.source(r.Context(), ref)
	if err == nil && snap == "" {
		err = fmt.Errorf("snapshot '%s': %w", truncate(ref), errdefs.ErrNotFound)
	}
	if err == nil {
		err = s.cfg.Sandboxes.DeleteSnapshot(r.Context(), snap)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot '%s' not found", truncate(ref)))
		return
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
