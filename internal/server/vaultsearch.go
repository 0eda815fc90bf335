package server

import (
	"net/http"
)

// The index of a vault (vault.Service.Search and Links): full-text search
// and the link graph of its main branch.

func (s *Server) vaultSearch(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	limit, err := queryLimit(r, 200)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := vs.Search(r.Context(), r.PathValue("name"), r.URL.Query().Get("q"), limit)
	s.respond(w, r, http.StatusOK, res, err)
}

func (s *Server) vaultLinks(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	res, err := vs.Links(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"))
	s.respond(w, r, http.StatusOK, res, err)
}
