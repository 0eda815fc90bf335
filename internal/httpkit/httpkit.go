// Package httpkit is what atoll's HTTP surfaces (the REST server, the
// E2B-compatible API and its envd, the sandbox agent) do alike: JSON answers
// and error bodies with statuses derived from api.ErrorCodes, JSON request
// bodies read under a limit, the status a handler wrote, and a handler's
// panic answered with a logged 500.
package httpkit

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Surface is how one HTTP surface answers errors: the shape of its error
// bodies and the statuses in which it differs from api.ErrorCodes. Only the
// differences are stated, so a surface cannot drift from the table unseen.
type Surface struct {
	// Body is the JSON body of an error answer.
	Body func(status int, code, message string) any
	// Statuses are the surface's own statuses for codes where they are not
	// api.ErrorCodes'. 0 means the surface has no status for the code and
	// decides by other means (see envd).
	Statuses map[string]int
}

// Atoll is the shape of atoll's own APIs (the REST API, the agent's):
// api.Error, statuses as in api.ErrorCodes.
var Atoll = Surface{Body: func(_ int, code, msg string) any { return api.Error{Code: code, Message: msg} }}

// E2B is the shape of E2B's API and envd: the status again as the code.
var E2B = Surface{Body: func(status int, _, msg string) any { return E2BError{Code: status, Message: msg} }}

// E2BError is E2B's error body.
type E2BError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Status is the status the surface answers err with: its kind's, 500 for an
// error of no kind.
func (s Surface) Status(err error) int {
	code := errdefs.Code(err)
	if st, ok := s.Statuses[code]; ok {
		return st
	}
	return api.StatusOf(code)
}

// JSON answers v as JSON with status. A value that does not marshal (a bug,
// say a NaN) is answered with a 500 error body instead.
func (s Surface) JSON(w http.ResponseWriter, status int, v any) {
	if e, ok := v.(api.Error); ok {
		// An error names its request (RequestID) and its code for the
		// metrics (telemetry.Instrument), whoever wrote it.
		if e.RequestID == "" {
			e.RequestID = w.Header().Get(RequestIDHeader)
		}
		w.Header().Set(ErrorCodeHeader, e.Code)
		v = e
	}
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(s.Body(status, api.CodeInternal, "internal error"))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// Error answers an error body with status, code and message.
func (s Surface) Error(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set(ErrorCodeHeader, code)
	}
	s.JSON(w, status, s.Body(status, code, msg))
}

// ErrorCodeHeader carries an error answer's code (api.ErrorCodes), which
// E2B's bodies have no room for: the metrics count errors by it.
const ErrorCodeHeader = "X-Error-Code"

// ClientMessage is what a client may see of err, an error of kind: its
// message, or the kind's text alone when it carries an OS error, whose text
// names host paths.
func ClientMessage(err, kind error) string {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	if errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) {
		return kind.Error()
	}
	return err.Error()
}
