// Package errdefs holds the few kinds of error that cross package and process
// boundaries. Code wraps them with context (fmt.Errorf("...: %w", errdefs.ErrNotFound))
// and checks them with errors.Is; the HTTP layer maps each kind to one status code.
package errdefs

import (
	"errors"
	"time"
)

var (
	ErrInvalid      = errors.New("invalid argument")
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrUnavailable  = errors.New("unavailable")
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden is a valid key asking for what only an admin key may do.
	ErrForbidden = errors.New("forbidden")
	ErrQuota     = errors.New("quota exceeded")
	ErrTooLarge  = errors.New("too large")
)

// Code is the stable machine-readable name of err's kind, as used in the JSON
// error body {"code","message"}.
func Code(err error) string {
	switch {
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	case errors.Is(err, ErrQuota):
		return "quota_exceeded"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	}
	return "internal"
}

// FromCode is the inverse of Code, for clients that turn a JSON error back into a kind.
func FromCode(code string) error {
	switch code {
	case "invalid":
		return ErrInvalid
	case "not_found":
		return ErrNotFound
	case "conflict":
		return ErrConflict
	case "unavailable":
		return ErrUnavailable
	case "unauthorized":
		return ErrUnauthorized
	case "forbidden":
		return ErrForbidden
	case "quota_exceeded":
		return ErrQuota
	case "too_large":
		return ErrTooLarge
	}
	return nil
}

// Busy is an error of a server that cannot take an operation now but could
// soon: the HTTP layer answers it with its kind's status (503 for
// ErrUnavailable, 429 for ErrQuota) and a Retry-After header of After,
// rounded up to whole seconds.
type Busy struct {
	Kind  error // ErrUnavailable or ErrQuota
	Msg   string
	After time.Duration
}

func (e *Busy) Error() string { return e.Msg }

func (e *Busy) Unwrap() error { return e.Kind }

// RetryAfter is how many whole seconds err asks its client to wait before
// trying again, or 0 if it does not ask.
func RetryAfter(err error) int {
	var b *Busy
	if !errors.As(err, &b) || b.After <= 0 {
		return 0
	}
	return int((b.After + time.Second - 1) / time.Second)
}
