// Package errdefs holds the few kinds of error that cross package and process
// boundaries. Code wraps them with context (fmt.Errorf("...: %w", errdefs.ErrNotFound))
// and checks them with errors.Is; each kind has one code of api.ErrorCodes, and
// through it one HTTP status.
package errdefs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
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

// kinds is the one table from kinds to codes, and through api.ErrorCodes to
// HTTP statuses. An error of several kinds takes the first row's.
var kinds = []struct {
	kind error
	code string
}{
	{ErrInvalid, api.CodeInvalid},
	{ErrUnauthorized, api.CodeUnauthorized},
	{ErrForbidden, api.CodeForbidden},
	{ErrNotFound, api.CodeNotFound},
	{ErrConflict, api.CodeConflict},
	{ErrTooLarge, api.CodeTooLarge},
	{ErrQuota, api.CodeQuota},
	{ErrUnavailable, api.CodeUnavailable},
}

// Kind is the kind err is of, or nil for an error of no kind (a bug, or an
// error nobody classified: internal).
func Kind(err error) error {
	kind, _ := classify(err)
	return kind
}

// Code is the stable machine-readable name of err's kind, as used in the JSON
// error body {"code","message"}: "internal" for an error of no kind.
func Code(err error) string {
	_, code := classify(err)
	return code
}

func classify(err error) (kind error, code string) {
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return k.kind, k.code
		}
	}
	return nil, api.CodeInternal
}

// FromCode is the inverse of Code, for clients that turn a JSON error back into a kind.
func FromCode(code string) error {
	for _, k := range kinds {
		if k.code == code {
			return k.kind
		}
	}
	return nil
}

// Status is the HTTP status of err's kind in api.ErrorCodes; 500 for an
// error of no kind.
func Status(err error) int { return api.StatusOf(Code(err)) }

// Message is err's message without its kind's name in front, for surfaces
// whose body carries the kind apart (E2B's API, the agent).
func Message(err error) string {
	msg := err.Error()
	if k := Kind(err); k != nil {
		msg = strings.TrimPrefix(msg, k.Error()+": ")
	}
	return msg
}

// Busy is an error of a server that cannot take an operation now but could
// soon: the HTTP layer answers it with its kind's status (503 for
// ErrUnavailable, 429 for ErrQuota) and a Retry-After header of After,
// rounded up to whole seconds.
type Busy struct {
	Kind  error // ErrUnavailable or ErrQuota, or an error of either (a *QuotaError)
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

// QuotaError is a request refused because it would take a tenant over one
// of its quotas (ErrQuota): the HTTP layer answers it with 429 and these
// fields in the body, besides the message.
type QuotaError struct {
	Tenant string
	Quota  string  // the quota's name in the API: max_sandboxes, max_cpu, ...
	Limit  float64 // in the quota's unit (sandboxes, CPUs, MiB, GiB, creates a second)
	// Used is what the tenant holds now, Requested what the request would
	// add; for a rate, neither.
	Used, Requested float64
}

func (e *QuotaError) Error() string {
	if e.Used == 0 && e.Requested == 0 {
		return fmt.Sprintf("%v: tenant %s is over its %s of %g", ErrQuota, e.Tenant, e.Quota, e.Limit)
	}
	return fmt.Sprintf("%v: tenant %s's %s is %g; it uses %g, and this needs %g more", ErrQuota, e.Tenant, e.Quota, e.Limit, e.Used, e.Requested)
}

func (e *QuotaError) Unwrap() error { return ErrQuota }
