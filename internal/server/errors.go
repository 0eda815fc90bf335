package server

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"strconv"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// statusOf is the one table from error kinds to HTTP status codes.
// Quota is 429 rather than 507: the limit is the tenant's, not the server's
// storage, and clients already treat 429 as "wait or free something up".
var statusOf = []struct {
	kind   error
	status int
}{
	{errdefs.ErrInvalid, http.StatusBadRequest},
	{errdefs.ErrUnauthorized, http.StatusUnauthorized},
	{errdefs.ErrForbidden, http.StatusForbidden},
	{errdefs.ErrNotFound, http.StatusNotFound},
	{errdefs.ErrConflict, http.StatusConflict},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge},
	{errdefs.ErrQuota, http.StatusTooManyRequests},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable},
}

// writeError answers err with the status of its kind. Errors of no kind are
// internal: the client sees only "internal error" and the log gets the rest.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, body := s.errorBody(r, err)
	if after := errdefs.RetryAfter(err); after > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(after))
	}
	writeJSON(w, status, body)
}

// errorBody is the status and body that answer err; it logs internal errors.
// Streams that have already sent 200 report the body in their last event.
func (s *Server) errorBody(r *http.Request, err error) (int, api.Error) {
	for _, e := range statusOf {
		if errors.Is(err, e.kind) {
			return e.status, api.Error{Code: errdefs.Code(err), Message: clientMessage(err, e.kind)}
		}
	}
	s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	return http.StatusInternalServerError, api.Error{Code: "internal", Message: "internal error"}
}

// clientMessage is err's message unless it carries an OS error, whose text
// names host paths; then it is the kind's text alone.
func clientMessage(err, kind error) string {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	if errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) {
		return kind.Error()
	}
	return err.Error()
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":"internal","message":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
