package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Most handlers are one shape: the resource the path names, maybe a JSON
// body checked before anything runs, one call of the service, its result
// as JSON or its error. These run that shape; a handler names its parts.

// idOf reads the ID of the resource a path names, or writes 400 and
// returns false: sandboxID, snapshotID.
type idOf func(w http.ResponseWriter, r *http.Request) (string, bool)

// pathID returns path parameter param of r, the ID of a what, or writes
// 400 and returns false.
func pathID(w http.ResponseWriter, r *http.Request, param, what string) (string, bool) {
	id := r.PathValue(param)
	if !idPattern.MatchString(id) {
		writeJSONError(w, http.StatusBadRequest, "invalid", "malformed "+what+" ID: want 20 characters of [a-z0-9]")
		return "", false
	}
	return id, true
}

// sandboxID returns the {id} of r, or writes 400 and returns false.
func sandboxID(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathID(w, r, "id", "sandbox")
}

// snapshotID returns the {snap} of r, or writes 400 and returns false.
func snapshotID(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathID(w, r, "snap", "snapshot")
}

// call answers a request on the resource id names with do's result, as
// JSON with 200.
func call[T any](s *Server, w http.ResponseWriter, r *http.Request, id idOf, do func(ctx context.Context, id string) (T, error)) {
	key, ok := id(w, r)
	if !ok {
		return
	}
	v, err := do(r.Context(), key)
	s.respond(w, r, http.StatusOK, v, err)
}

// sandboxOp answers a request on sandbox {id} with op's result.
func sandboxOp[T any](s *Server, w http.ResponseWriter, r *http.Request, op func(ctx context.Context, id string) (T, error)) {
	call(s, w, r, sandboxID, op)
}

// handle is the handler that answers with do's result for the resource
// id names (call), for the routes table.
func handle[T any](s *Server, id idOf, do func(ctx context.Context, id string) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { call(s, w, r, id, do) }
}

// handleDelete is the handler that deletes the resource id names (remove).
func handleDelete(s *Server, id idOf, del func(ctx context.Context, id string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { remove(s, w, r, id, del) }
}

// remove answers a request that deletes the resource id names: 204.
func remove(s *Server, w http.ResponseWriter, r *http.Request, id idOf, del func(ctx context.Context, id string) error) {
	key, ok := id(w, r)
	if !ok {
		return
	}
	if err := del(r.Context(), key); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sandboxCall answers a request on sandbox {id} whose body is a JSON Req
// (an empty body leaves it zero if optional): check, if not nil, refuses
// a bad one (and may fill in defaults) before do answers it, as JSON with
// status.
func sandboxCall[Req, Resp any](s *Server, w http.ResponseWriter, r *http.Request, optional bool, check func(*Req) error,
	do func(ctx context.Context, id string, req Req) (Resp, error), status int) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	if req, ok := decodeBody(s, w, r, optional, check); ok {
		v, err := do(r.Context(), id, req)
		s.respond(w, r, status, v, err)
	}
}

// decodeBody decodes r's JSON body, a Req (an empty one leaves it zero if
// optional), and has check, if not nil, refuse a bad one; it answers a
// bad body itself, and ok is false.
func decodeBody[Req any](s *Server, w http.ResponseWriter, r *http.Request, optional bool, check func(*Req) error) (req Req, ok bool) {
	err := decodeJSON(w, r, &req, optional)
	if err == nil && check != nil {
		err = check(&req)
	}
	if err != nil {
		s.writeError(w, r, err)
		return req, false
	}
	return req, true
}

// part returns v, an optional part of the server's Config, or answers
// missing and returns false if the server has none.
func part[T any](s *Server, w http.ResponseWriter, r *http.Request, v T, missing error) (T, bool) {
	if any(v) == nil {
		s.writeError(w, r, missing)
		return v, false
	}
	return v, true
}

// respond writes v as JSON with status, or err if there is one.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, v)
}

// queryLimit reads the optional ?limit= of r, 1 to most; 0 when absent
// (the service's default).
func queryLimit(r *http.Request, most int) (int, error) {
	l := r.URL.Query().Get("limit")
	if l == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > most {
		return 0, fmt.Errorf("%w: limit must be 1 to %d", errdefs.ErrInvalid, most)
	}
	return n, nil
}
