package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// apiError is E2B's error body: the HTTP status again as code, and a message.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":500,"message":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// statusOf is the table from error kinds to E2B status codes.
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

// writeErr answers err with the status of its kind; errors of no kind are
// bugs: the client sees "internal error" and the log the rest.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	for _, e := range statusOf {
		if errors.Is(err, e.kind) {
			if after := errdefs.RetryAfter(err); after > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(after))
			}
			writeError(w, e.status, clientMessage(err, e.kind))
			return
		}
	}
	s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal error")
}

// clientMessage is err's message without errdefs' kind prefix, unless it
// carries an OS error, whose text names host paths.
func clientMessage(err, kind error) string {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	if errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) {
		return kind.Error()
	}
	return strings.TrimPrefix(err.Error(), kind.Error()+": ")
}

// decode reads a JSON body leniently, as E2B does: unknown fields are
// ignored (newer SDKs send fields older servers do not know). An empty
// body leaves v alone when emptyOK.
func decode(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	if r.ContentLength > MaxJSONBody {
		return fmt.Errorf("%w: request body is larger than %d bytes", errdefs.ErrTooLarge, MaxJSONBody)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	err := dec.Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &mbe):
		return fmt.Errorf("%w: request body is larger than %d bytes", errdefs.ErrTooLarge, MaxJSONBody)
	case errors.Is(err, io.EOF) && emptyOK:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%w: request body is empty", errdefs.ErrInvalid)
	}
	return fmt.Errorf("%w: Error when parsing request: %s", errdefs.ErrInvalid, strings.TrimPrefix(err.Error(), "json: "))
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalid}, args...)...)
}
