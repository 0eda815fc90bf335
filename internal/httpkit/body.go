package httpkit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Body says how DecodeJSON reads a request body.
type Body struct {
	Limit   int64 // bytes at most; a larger body is errdefs.ErrTooLarge
	EmptyOK bool  // an empty body leaves v as it is instead of being invalid
	// Lenient ignores unknown fields and whatever follows the first value,
	// as E2B's API does: newer SDKs send fields older servers do not know.
	Lenient bool
	// Malformed starts the message for a body that is not JSON or not of
	// v's shape; "malformed JSON body" if empty.
	Malformed string
}

// DecodeJSON reads r's body into v as b says. Its errors are of errdefs'
// kinds, ErrTooLarge or ErrInvalid, with messages a client may see; the
// surface's error table turns them into 413 and 400.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any, b Body) error {
	tooLarge := fmt.Errorf("%w: request body is larger than %d bytes", errdefs.ErrTooLarge, b.Limit)
	if r.ContentLength > b.Limit {
		return tooLarge
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, b.Limit))
	if !b.Lenient {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(v)
	if err == nil && !b.Lenient {
		if _, err = dec.Token(); err == io.EOF {
			return nil
		} else if err == nil {
			return fmt.Errorf("%w: request body holds more than one JSON value", errdefs.ErrInvalid)
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &mbe):
		return tooLarge
	case err == io.EOF && b.EmptyOK:
		return nil
	case err == io.EOF:
		return fmt.Errorf("%w: request body is empty", errdefs.ErrInvalid)
	}
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalid, cmp.Or(b.Malformed, "malformed JSON body"),
		strings.TrimPrefix(err.Error(), "json: "))
}
