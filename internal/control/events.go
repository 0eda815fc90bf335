package control

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Events takes the lifecycle events the service publishes (events.Bus):
// every write of a sandbox's record goes through states.go, which
// publishes the events of the states it wrote, so that a change made by a
// policy, a sweep or recovery is announced as one an API call made.
type Events interface {
	// Publish records e; it must not block for long (the bus queues).
	Publish(e store.Event)
}

// eventOf is the event a sandbox's move into a state is; states not
// listed (the steps between: starting, stopping, archiving...) are none.
// Every way of pausing (frozen, to disk, without memory) is a pause, and
// the way back from each a resume (resumedFrom).
var eventOf = map[string]string{
	api.StateCreating:  api.LifecycleCreated,
	api.StateRunning:   api.LifecycleStarted,
	api.StateStopped:   api.LifecycleStopped,
	api.StatePaused:    api.LifecyclePaused,
	api.StateSuspended: api.LifecyclePaused,
	api.StateShelved:   api.LifecyclePaused,
	api.StateArchived:  api.LifecycleArchived,
	api.StateDeleted:   api.LifecycleDeleted,
	api.StateError:     api.LifecycleError,
	api.StateLost:      api.LifecycleLost,
}

// resumedFrom are the states from which running is a resume, not a start.
var resumedFrom = []string{api.StatePaused, api.StateSuspended, api.StateSuspending, api.StateShelved}

// announce publishes the events of sbs' move from one of from to the
// state each carries (to, if not ""), once the store has recorded it.
// What the API does not show has none: a pooled or prestarted sandbox
// made or discarded; its hand-out to a tenant is its creation. Nor does a
// write that leaves the state as it was (from is that state alone): a
// port published, a policy or timeout changed, a checkpoint recorded.
func (s *Service) announce(sbs []*store.Sandbox, to string, from ...string) {
	if s.events == nil {
		return
	}
	fromHidden := len(from) > 0 && !slices.ContainsFunc(from, lifecycle.Visible)
	for _, sb := range sbs {
		state := cmpOr(to, sb.State)
		typ, ok := eventOf[state]
		if !ok || state != api.StateDeleted && !lifecycle.Visible(state) || fromHidden && state == api.StateDeleted ||
			len(from) > 0 && allIn(from, []string{state}) {
			continue
		}
		if fromHidden {
			s.publish(api.LifecycleCreated, sb, api.StateCreating, "")
		} else if state == api.StateRunning && len(from) > 0 && allIn(from, resumedFrom) {
			typ = api.LifecycleResumed
		}
		reason := ""
		if state == api.StateError {
			reason = sb.Error
		}
		s.publish(typ, sb, state, reason)
	}
}

func (s *Service) publish(typ string, sb *store.Sandbox, state, reason string) {
	s.events.Publish(store.Event{Type: typ, At: time.Now().UTC(), Tenant: sb.Tenant, Sandbox: sb.ID, State: state, Reason: reason})
}

// quotaHit publishes a quota_exceeded event of the tenant of ctx if err
// is a refusal for a quota or a rate, and returns err.
func (s *Service) quotaHit(ctx context.Context, err error) error {
	var qe *errdefs.QuotaError
	if s.events == nil || err == nil || !errors.As(err, &qe) {
		return err
	}
	t := qe.Tenant
	if t == "" {
		t = tenant.Of(ctx)
	}
	s.events.Publish(store.Event{Type: api.LifecycleQuotaExceeded, At: time.Now().UTC(), Tenant: t, Reason: qe.Error()})
	return err
}

func allIn(xs, set []string) bool {
	for _, x := range xs {
		if !slices.Contains(set, x) {
			return false
		}
	}
	return true
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
