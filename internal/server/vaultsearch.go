package server

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// The index of a vault (vault.Service.Search and Links): full-text search
// and the link graph of its main branch.

func (s *Server) vaultSearch(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	limit := 0
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 200 {
			s.writeError(w, r, fmt.Errorf("%w: limit must be 1 to 200", errdefs.ErrInvalid))
			return
		}
		limit = n
	}
	res, err := vs.Search(r.Context(), r.PathValue("name"), r.URL.Query().Get("q"), limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) vaultLinks(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	res, err := vs.Links(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
