package server

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// admin lets only admin keys (the default tenant's) through to h.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if t, ok := tenant.FromContext(r.Context()); !ok || !tenant.IsAdmin(t) {
			_, path, _ := strings.Cut(r.Pattern, " ")
			s.writeError(w, r, fmt.Errorf("%w: %s %s needs an admin key", errdefs.ErrForbidden, r.Method, path))
			return
		}
		h(w, r)
	}
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) (Keys, bool) {
	return part(s, w, r, s.cfg.Keys, fmt.Errorf("%w: this server does not issue keys", errdefs.ErrUnavailable))
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeBody[api.CreateKeyRequest](s, w, r, false, nil)
	if !ok {
		return
	}
	keys, ok := s.keys(w, r)
	if !ok {
		return
	}
	k, err := keys.Create(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	audit.SetTarget(r.Context(), k.ID)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, k)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, ok := s.keys(w, r)
	if !ok {
		return
	}
	ks, err := keys.List(r.Context())
	s.respond(w, r, http.StatusOK, api.APIKeyList{Keys: ks}, err)
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request) {
	keys, ok := s.keys(w, r)
	if !ok {
		return
	}
	if err := keys.Delete(r.Context(), r.PathValue("key")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
