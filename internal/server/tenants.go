package server

import (
	"fmt"
	"net/http"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/tenant"
)

func (s *Server) tenants(w http.ResponseWriter, r *http.Request) (Tenants, bool) {
	if s.cfg.Tenants == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server keeps no quotas", errdefs.ErrUnavailable))
		return nil, false
	}
	return s.cfg.Tenants, true
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) {
	ts, ok := s.tenants(w, r)
	if !ok {
		return
	}
	list, err := ts.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.TenantList{Tenants: list})
}

// getTenant shows a tenant its own quota and use; admins see every
// tenant's.
func (s *Server) getTenant(w http.ResponseWriter, r *http.Request) {
	ts, ok := s.tenants(w, r)
	if !ok {
		return
	}
	name := r.PathValue("tenant")
	if me, ok := tenant.FromContext(r.Context()); ok && !tenant.IsAdmin(me) && me != name {
		s.writeError(w, r, fmt.Errorf("%w: a key of tenant %s sees only its own tenant; another's needs an admin key", errdefs.ErrForbidden, me))
		return
	}
	if !tenant.Valid(name) {
		s.writeError(w, r, fmt.Errorf("%w: %.64q is not a tenant name (1-63 of [a-z0-9-])", errdefs.ErrInvalid, name))
		return
	}
	t, err := ts.Get(r.Context(), name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) {
	var q api.TenantQuota
	if err := decodeJSON(w, r, &q, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	ts, ok := s.tenants(w, r)
	if !ok {
		return
	}
	t, err := ts.SetQuota(r.Context(), r.PathValue("tenant"), q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}
