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
	Code       string // invalid, not_found, conflict, unavailable, unauthorized, forbidden, quota_exceeded, too_large, internal
	Message    string
	// RetryAfter is the server's Retry-After, if it sent one: it was busy
	// (503) or the caller over a rate (429), and the same request may
	// succeed after that long.
	RetryAfter time.Duration
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
		k = kindOfStatus[e.StatusCode]
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

var kinds = map[string]error{
	"invalid":        ErrInvalid,
	"not_found":      ErrNotFound,
	"conflict":       ErrConflict,
	"unavailable":    ErrUnavailable,
	"unauthorized":   ErrUnauthorized,
	"forbidden":      ErrForbidden,
	"quota_exceeded": ErrQuota,
	"too_large":      ErrTooLarge,
}

// kindOfStatus classifies answers without a JSON body, e.g. from a proxy.
var kindOfStatus = map[int]error{
	http.StatusBadRequest:                  ErrInvalid,
	http.StatusUnauthorized:                ErrUnauthorized,
	http.StatusForbidden:                   ErrForbidden,
	http.StatusNotFound:                    ErrNotFound,
	http.StatusConflict:                    ErrConflict,
	http.StatusRequestEntityTooLarge:       ErrTooLarge,
	http.StatusRequestHeaderFieldsTooLarge: ErrTooLarge,
	http.StatusTooManyRequests:             ErrQuota,
	http.StatusBadGateway:                  ErrUnavailable,
	http.StatusServiceUnavailable:          ErrUnavailable,
	http.StatusGatewayTimeout:              ErrUnavailable,
}

// statusOfCode is the status the server answers each code with, for errors
// that arrive inside a stream that had already started with 200.
var statusOfCode = map[string]int{
	"invalid":        http.StatusBadRequest,
	"unauthorized":   http.StatusUnauthorized,
	"not_found":      http.StatusNotFound,
	"conflict":       http.StatusConflict,
	"too_large":      http.StatusRequestEntityTooLarge,
	"quota_exceeded": http.StatusTooManyRequests,
	"unavailable":    http.StatusServiceUnavailable,
	"internal":       http.StatusInternalServerError,
}

// errorOfCode is the Error a status answer with code and message would have been.
func errorOfCode(code, message string) *Error {
	status, ok := statusOfCode[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	return &Error{StatusCode: status, Code: code, Message: message}
}

func errorFrom(resp *http.Response) error {
	e := &Error{StatusCode: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body api.Error
	if json.Unmarshal(b, &body) == nil && body.Code != "" {
		e.Code, e.Message = body.Code, body.Message
	}
	return e
}
