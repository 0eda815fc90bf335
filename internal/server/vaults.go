package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/tenant"
	"github.com/atoll-dev/atoll/internal/vault"
)

// Vaults are memory vaults (vault.Service), each the context's tenant's.
type Vaults interface {
	Create(ctx context.Context, req api.CreateVaultRequest) (api.Vault, error)
	Get(ctx context.Context, name string) (api.Vault, error)
	List(ctx context.Context) ([]api.Vault, error)
	// Delete removes a vault; errdefs.ErrConflict while sandboxes mount
	// it, unless force.
	Delete(ctx context.Context, name string, force bool) error
	Log(ctx context.Context, name, rev string, limit int) ([]api.VaultCommit, error)
	// Show returns a file's bytes at rev ("" for the main branch).
	Show(ctx context.Context, name, path, rev string) ([]byte, error)
	// Search finds the notes of the main branch matching q (SQLite FTS5
	// syntax; errdefs.ErrInvalid if it does not parse), at most limit (0:
	// the default).
	Search(ctx context.Context, name, q string, limit int) (api.VaultSearch, error)
	// Links returns a note's links and backlinks, or with path "" every
	// broken link.
	Links(ctx context.Context, name, path string) (api.VaultLinks, error)
	// Credentials mints object-storage credentials limited to a vault's
	// objects; errdefs.ErrConflict if the server mints none.
	Credentials(ctx context.Context, name string, req api.VaultCredentialsRequest) (api.VaultCredentials, error)
	// Compact rolls a vault's old daily timeline files into week files;
	// errdefs.ErrInvalid for a bad date.
	Compact(ctx context.Context, name string, req api.VaultCompactRequest) (api.VaultCompaction, error)
	// Update changes a vault's compaction schedule and summarizer.
	Update(ctx context.Context, name string, u api.VaultUpdate) (api.Vault, error)
	// Events returns a vault's newest events (compactions made or
	// failed), at most limit (0: the default), newest first.
	Events(ctx context.Context, name string, limit int) ([]api.VaultEvent, error)
	// ServeGit serves git's smart HTTP protocol for vault name: rest is
	// what follows /git/<name>.git/.
	ServeGit(w http.ResponseWriter, r *http.Request, name, rest string)
}

const vaultPath = "/v1/vaults/{name}"

// gitPattern is the vaults' git URLs: /git/<name>.git/<rest>, outside
// /v1 and its route table: git's protocol, not a REST operation.
const gitPattern = GitPrefix + "{repo}/{rest...}"

// GitPrefix begins every vault's git URL.
const GitPrefix = "/git/"

func (s *Server) vaults(w http.ResponseWriter, r *http.Request) (Vaults, bool) {
	if s.cfg.Vaults == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server keeps no vaults", errdefs.ErrUnavailable))
		return nil, false
	}
	return s.cfg.Vaults, true
}

func (s *Server) createVault(w http.ResponseWriter, r *http.Request) {
	var req api.CreateVaultRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	v, err := vs.Create(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) listVaults(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	list, err := vs.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.VaultList{Vaults: list})
}

func (s *Server) getVault(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	v, err := vs.Get(r.Context(), r.PathValue("name"))
	s.respond(w, r, http.StatusOK, v, err)
}

func (s *Server) deleteVault(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	force, err := boolParam(r, "force")
	if err == nil {
		err = vs.Delete(r.Context(), r.PathValue("name"), force)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) vaultCredentials(w http.ResponseWriter, r *http.Request) {
	var req api.VaultCredentialsRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	c, err := vs.Credentials(r.Context(), r.PathValue("name"), req)
	s.respond(w, r, http.StatusOK, c, err)
}

func (s *Server) vaultLog(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	limit, err := queryLimit(r, 1000)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	log, err := vs.Log(r.Context(), r.PathValue("name"), r.URL.Query().Get("rev"), limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.VaultLog{Commits: log})
}

func (s *Server) vaultFile(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	b, err := vs.Show(r.Context(), r.PathValue("name"), r.PathValue("path"), r.URL.Query().Get("rev"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The bytes as pushed, never rendered by a browser as this origin's.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: %s must be true or false", errdefs.ErrInvalid, name)
	}
	return b, nil
}

// serveGit authenticates a git client, which sends the API key as the
// password of HTTP basic auth (a git credential; any user name), or as
// the API's own headers, and hands the request to the vaults.
func (s *Server) serveGit(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	key := r.Header.Get("X-API-Key")
	if h := r.Header.Get("Authorization"); key == "" && len(h) > 7 && equalFold(h[:7], "bearer ") {
		key = h[7:]
	}
	if _, pw, ok := r.BasicAuth(); key == "" && ok {
		key = pw
	}
	challenge := func(msg string) {
		// Basic: git asks its credential helpers, or the user, for a key.
		w.Header().Set("WWW-Authenticate", `Basic realm="atoll"`)
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", msg)
	}
	if key == "" {
		challenge("missing API key: give it as the password (git credential) or as Authorization: Bearer KEY")
		return
	}
	name, ok := strings.CutSuffix(r.PathValue("repo"), ".git")
	if !ok {
		s.writeError(w, r, fmt.Errorf("%w: a vault's git URL is /git/NAME.git", errdefs.ErrNotFound))
		return
	}
	if vault.IsToken(key) {
		s.serveGitToken(w, r, vs, key, name, challenge)
		return
	}
	t, err := s.cfg.Auth.Authenticate(r.Context(), key)
	if errors.Is(err, errdefs.ErrUnauthorized) {
		challenge("invalid API key")
		return
	}
	if err != nil {
		s.writeError(w, r, fmt.Errorf("authenticating: %w", err))
		return
	}
	vs.ServeGit(w, r.WithContext(tenant.NewContext(r.Context(), t)), name, r.PathValue("rest"))
}

// serveGitToken serves a git request whose password is a sandbox's vault
// token (docs/vault.md, "In a sandbox"): good for one vault, while its
// sandbox runs; a read-only one fetches but never pushes.
func (s *Server) serveGitToken(w http.ResponseWriter, r *http.Request, vs Vaults, token, name string, challenge func(string)) {
	if s.cfg.VaultMounts == nil {
		challenge("vault tokens are not taken by this server")
		return
	}
	t, readOnly, err := s.cfg.VaultMounts.CheckToken(r.Context(), token, name)
	if errors.Is(err, errdefs.ErrUnauthorized) {
		challenge(httpkit.ClientMessage(err, errdefs.Kind(err)))
		return
	}
	if err != nil {
		s.writeError(w, r, fmt.Errorf("checking a vault token: %w", err))
		return
	}
	rest := r.PathValue("rest")
	if readOnly && (rest == "git-receive-pack" || r.URL.Query().Get("service") == "git-receive-pack") {
		s.writeError(w, r, fmt.Errorf("%w: vault %s is mounted read-only in this sandbox", errdefs.ErrForbidden, name))
		return
	}
	vs.ServeGit(w, r.WithContext(tenant.NewContext(r.Context(), t)), name, rest)
}

func (s *Server) vaultCompact(w http.ResponseWriter, r *http.Request) {
	var req api.VaultCompactRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	res, err := vs.Compact(r.Context(), r.PathValue("name"), req)
	s.respond(w, r, http.StatusOK, res, err)
}

func (s *Server) updateVault(w http.ResponseWriter, r *http.Request) {
	var u api.VaultUpdate
	if err := decodeJSON(w, r, &u, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	v, err := vs.Update(r.Context(), r.PathValue("name"), u)
	s.respond(w, r, http.StatusOK, v, err)
}

func (s *Server) vaultEvents(w http.ResponseWriter, r *http.Request) {
	vs, ok := s.vaults(w, r)
	if !ok {
		return
	}
	limit, err := queryLimit(r, 200)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	evs, err := vs.Events(r.Context(), r.PathValue("name"), limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.VaultEvents{Events: evs})
}
