package atoll

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// Error is an error answer of the server.
type Error struct {
	StatusCode int    // HTTP status
	Code       string // one of api.ErrorCodes: invalid, not_found, conflict, unavailable, unauthorized, forbidden, quota_exceeded, too_large, internal
	Message    string
	// RetryAfter is the server's Retry-After, if it sent one: it was busy
	// (503) or the caller over a rate (429), and the same request may
	// succeed after that long.
	RetryAfter time.Duration
	// Quota, on quota_exceeded, names the quota, its limit and the
	// tenant's use.
	Quota *api.QuotaExceeded
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("%d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// Is reports whether e is of the kind of target, one of the sentinels below.
func (e *Error) Is(target error) bool {
	k, ok := kinds[e.Code]
	if !ok {
		// An answer without a JSON body, e.g. from a proxy.
		k = kinds[api.CodeOf(e.StatusCode)]
	}
	return k != nil && k == target
}

// Kinds of Error, for errors.Is.
var (
	ErrInvalid      = errors.New("invalid argument")
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrUnavailable  = errors.New("unavailable")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrQuota        = errors.New("quota exceeded")
	ErrTooLarge     = errors.New("too large")
)

// kinds are the sentinels of the codes of api.ErrorCodes, whose statuses
// the server answers with.
var kinds = map[string]error{
	api.CodeInvalid:      ErrInvalid,
	api.CodeNotFound:     ErrNotFound,
	api.CodeConflict:     ErrConflict,
	api.CodeUnavailable:  ErrUnavailable,
	api.CodeUnauthorized: ErrUnauthorized,
	api.CodeForbidden:    ErrForbidden,
	api.CodeQuota:        ErrQuota,
	api.CodeTooLarge:     ErrTooLarge,
}

// errorOfCode is the Error a status answer with code and message would have
// been, for errors that arrive inside a stream that had already started
// with 200.
func errorOfCode(code, message string) *Error {
	return &Error{StatusCode: api.StatusOf(code), Code: code, Message: message}
}

func errorFrom(resp *http.Response) error {
	e := &Error{StatusCode: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body api.Error
	if json.Unmarshal(b, &body) == nil && body.Code != "" {
		e.Code, e.Message, e.Quota = body.Code, body.Message, body.Quota
	}
	return e
}
