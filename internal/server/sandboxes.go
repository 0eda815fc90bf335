package server

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			httpkit.Atoll.Error(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version})
}

// mcp hands an authenticated request to the MCP handler, whose sessions
// act with the request's key. The audit log records what its tools do,
// as the REST requests they make, not the MCP request too.
func (s *Server) mcp(w http.ResponseWriter, r *http.Request) {
	if s.cfg.MCP == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server does not serve MCP", errdefs.ErrUnavailable))
		return
	}
	audit.NotAnAction(r.Context())
	s.cfg.MCP.ServeHTTP(w, r)
}

func (s *Server) listRuntimes(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Runtimes == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server does not list its runtimes", errdefs.ErrUnavailable))
		return
	}
	writeJSON(w, http.StatusOK, api.RuntimeList{Runtimes: s.cfg.Runtimes.Runtimes()})
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := validateCreate(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	switch r.URL.Query().Get("explain") {
	case "", "0", "false":
	case "1", "true":
		req.Explain = true
	default:
		s.writeError(w, r, fmt.Errorf("%w: explain: want 1 or 0", errdefs.ErrInvalid))
		return
	}
	if err := s.checkVaults(r.Context(), req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.cfg.Sandboxes.Create(r.Context(), req)
	if err == nil {
		audit.SetTarget(r.Context(), sb.ID)
		err = s.mountVaults(r.Context(), sb)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, http.StatusCreated, sb)
}

func validateCreate(req api.CreateSandboxRequest) error {
	switch {
	case req.CPU < 0:
		return fmt.Errorf("%w: cpu must not be negative", errdefs.ErrInvalid)
	case req.MemoryMiB < 0:
		return fmt.Errorf("%w: memory_mib must not be negative", errdefs.ErrInvalid)
	case req.DiskGiB < 0:
		return fmt.Errorf("%w: disk_gib must not be negative", errdefs.ErrInvalid)
	case req.PIDs < 0:
		return fmt.Errorf("%w: pids must not be negative", errdefs.ErrInvalid)
	}
	if err := validateSeconds("timeout_sec", req.TimeoutSec); err != nil {
		return err
	}
	if err := validateSeconds("auto_delete_sec", req.AutoDeleteSec); err != nil {
		return err
	}
	if err := validateSeconds("auto_stop_sec", req.AutoStopSec); err != nil {
		return err
	}
	if err := validateSeconds("auto_archive_sec", req.AutoArchiveSec); err != nil {
		return err
	}
	if err := validateSeconds("checkpoint_every_sec", req.CheckpointEverySec); err != nil {
		return err
	}
	if req.Network != nil {
		if _, err := egress.Parse(req.Network); err != nil {
			return err
		}
	}
	if req.Snapshot != "" && !idPattern.MatchString(req.Snapshot) {
		return fmt.Errorf("%w: malformed snapshot ID %q: want 20 characters of [a-z0-9]", errdefs.ErrInvalid, truncate(req.Snapshot))
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: env: malformed variable %q", errdefs.ErrInvalid, truncate(k))
		}
	}
	return validateLabels(req.Labels)
}

// MaxLifetimeSec bounds timeout_sec and the auto_* delays: one year.
const MaxLifetimeSec = 365 * 24 * 60 * 60

func validateSeconds(field string, sec int64) error {
	if sec < 0 || sec > MaxLifetimeSec {
		return fmt.Errorf("%w: %s %d: want 0 to %d", errdefs.ErrInvalid, field, sec, MaxLifetimeSec)
	}
	return nil
}

func validateLabels(labels map[string]string) error {
	for k, v := range labels {
		if k == "" || strings.ContainsAny(k, "=,\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: labels: malformed label %q", errdefs.ErrInvalid, truncate(k))
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

var states = map[string]bool{
	api.StateCreating: true, api.StateStarting: true, api.StateRunning: true, api.StateStopping: true, api.StatePaused: true,
	api.StateStopped: true, api.StateArchiving: true, api.StateArchived: true, api.StateDeleting: true, api.StateError: true,
	api.StateSuspending: true, api.StateSuspended: true, api.StateShelved: true,
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state := q.Get("state")
	if state != "" && !states[state] {
		s.writeError(w, r, fmt.Errorf("%w: unknown state %q", errdefs.ErrInvalid, truncate(state)))
		return
	}
	var labels map[string]string
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			s.writeError(w, r, fmt.Errorf("%w: label filter %q: want key=value", errdefs.ErrInvalid, truncate(l)))
			return
		}
		if labels == nil {
			labels = make(map[string]string)
		}
		labels[k] = v
	}
	sbs, err := s.cfg.Sandboxes.List(r.Context(), state, labels)
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	s.respond(w, r, http.StatusOK, api.SandboxList{Sandboxes: sbs}, err)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	switch memory := req.Memory == nil || *req.Memory; {
	case req.ToDisk && !memory:
		s.writeError(w, r, fmt.Errorf("%w: to_disk saves memory; with memory false there is none to save", errdefs.ErrInvalid))
		return
	case req.ToDisk:
		sandboxOp(s, w, r, s.cfg.Sandboxes.Suspend)
		return
	case !memory:
		sandboxOp(s, w, r, s.cfg.Sandboxes.Shelve)
		return
	}
	sandboxOp(s, w, r, s.cfg.Sandboxes.Pause)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, false, func(req *api.TimeoutRequest) error {
		return validateSeconds("timeout_sec", req.TimeoutSec)
	}, s.cfg.Sandboxes.SetTimeout, http.StatusOK)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	sandboxCall(s, w, r, false, func(req *api.NetworkPolicy) error {
		_, err := egress.Parse(req)
		return err
	}, s.cfg.Sandboxes.SetNetwork, http.StatusOK)
}

// decodeJSON decodes one JSON value of at most MaxJSONBody bytes into v,
// rejecting unknown fields and trailing data. An empty body leaves v as it is
// when emptyOK.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	return httpkit.DecodeJSON(w, r, v, httpkit.Body{Limit: MaxJSONBody, EmptyOK: emptyOK})
}
