package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// writeError answers err with the status of its kind (api.ErrorCodes).
// Errors of no kind are internal: the client sees only "internal error" and
// the log gets the rest.
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
	if kind := errdefs.Kind(err); kind != nil {
		body := api.Error{Code: errdefs.Code(err), Message: clientMessage(err, kind)}
		var qe *errdefs.QuotaError
		if errors.As(err, &qe) {
			body.Quota = &api.QuotaExceeded{Name: qe.Quota, Limit: qe.Limit, Used: qe.Used, Requested: qe.Requested}
		}
		return errdefs.Status(err), body
	}
	s.log.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	return http.StatusInternalServerError, api.Error{Code: "internal", Message: "internal error"}
}

// clientMessage is err's message unless it carries an OS error, whose text
// names host paths; then it is the kind's text alone.
func clientMessage(err, kind error) string { return httpkit.ClientMessage(err, kind) }

// writeJSONError and writeJSON answer in atoll's shape (httpkit.Atoll).
func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	httpkit.Atoll.Error(w, status, code, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpkit.Atoll.JSON(w, status, v) }
