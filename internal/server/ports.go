package server

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/portproxy"
)

// getPortURL answers where the port proxy serves a port of a sandbox;
// ?ttl_sec=N adds a URL signed for N seconds.
func (s *Server) getPortURL(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	port, err := portproxy.ParsePort(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err))
		return
	}
	var ttl time.Duration
	if v := r.URL.Query().Get("ttl_sec"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > MaxLifetimeSec {
			s.writeError(w, r, fmt.Errorf("%w: ttl_sec %q: want 1 to %d", errdefs.ErrInvalid, truncate(v), MaxLifetimeSec))
			return
		}
		ttl = time.Duration(n) * time.Second
	}
	sb, err := s.cfg.Sandboxes.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Ports == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server has no port proxy", errdefs.ErrUnavailable))
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.Ports.URL(id, port, sb.Ports.Public, ttl))
}

func (s *Server) setPorts(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, false, nil, s.cfg.Sandboxes.SetPorts, http.StatusOK)
}
