package server

import (
	"fmt"
	"net/http"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// nodes is the cluster's node list, or a 409 on a single machine.
func (s *Server) nodes(w http.ResponseWriter, r *http.Request) (Nodes, bool) {
	return part(s, w, r, s.cfg.Nodes, fmt.Errorf("%w: this server is one machine, not a cluster node (atoll serve --cluster)", errdefs.ErrConflict))
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	nodes, ok := s.nodes(w, r)
	if !ok {
		return
	}
	l, err := nodes.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if l == nil {
		l = []api.Node{}
	}
	for i := range l {
		if l[i].Runtimes == nil {
			l[i].Runtimes = []string{}
		}
	}
	writeJSON(w, http.StatusOK, api.NodeList{Nodes: l})
}

// setSchedule cordons, uncordons or drains the node the path names.
func (s *Server) setSchedule(schedule string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		nodes, ok := s.nodes(w, r)
		if !ok {
			return
		}
		name := r.PathValue("node")
		if !api.ValidNodeName(name) {
			s.writeError(w, r, fmt.Errorf("%w: node name %.80q: want 1-63 of [a-z0-9-], starting with a letter or digit", errdefs.ErrInvalid, name))
			return
		}
		if err := nodes.SetSchedule(r.Context(), name, schedule); err != nil {
			s.writeError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
