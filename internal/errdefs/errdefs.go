// Package errdefs holds the few kinds of error that cross package and process
// boundaries. Code wraps them with context (fmt.Errorf("...: %w", errdefs.ErrNotFound))
// and checks them with errors.Is; the HTTP layer maps each kind to one status code.
package errdefs

import "errors"

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
