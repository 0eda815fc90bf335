package e2b

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// apiError is E2B's error body: the HTTP status again as code, and a message.
type apiError = httpkit.E2BError

// writeError and writeJSON answer in E2B's shape (httpkit.E2B).
func writeError(w http.ResponseWriter, status int, msg string) {
	httpkit.E2B.Error(w, status, "", msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpkit.E2B.JSON(w, status, v) }

// writeErr answers err with the status of its kind (api.ErrorCodes, the
// same as atoll's API); errors of no kind are bugs: the client sees
// "internal error" and the log the rest.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	if kind := errdefs.Kind(err); kind != nil {
		if after := errdefs.RetryAfter(err); after > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(after))
		}
		writeError(w, errdefs.Status(err), clientMessage(err, kind))
		return
	}
	s.log.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal error")
}

// clientMessage is err's message without errdefs' kind prefix, unless it
// carries an OS error, whose text names host paths.
func clientMessage(err, kind error) string {
	return strings.TrimPrefix(httpkit.ClientMessage(err, kind), kind.Error()+": ")
}

// decode reads a JSON body leniently, as E2B does: unknown fields are
// ignored (newer SDKs send fields older servers do not know). An empty
// body leaves v alone when emptyOK.
func decode(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	return httpkit.DecodeJSON(w, r, v, httpkit.Body{Limit: MaxJSONBody, EmptyOK: emptyOK, Lenient: true,
		Malformed: "Error when parsing request"}) // E2B's words
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalid}, args...)...)
}
