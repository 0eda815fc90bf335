package server

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Usage answers usage queries (package usage's Reporter).
type Usage interface {
	Report(ctx context.Context, q api.UsageQuery) (api.UsageReport, error)
}

// DefaultUsageRange is how far back GET /v1/usage looks without a from.
const DefaultUsageRange = 24 * time.Hour

// getUsage answers GET /v1/usage: from and to (unix seconds or RFC 3339;
// default the last day), step (1m, 1h or 1d; default 1h), group_by
// (sandbox, tenant, template or label:KEY; default sandbox) and tenant. A
// key sees its own tenant's usage; an admin key every tenant's, or one's.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request) {
	u, ok := part(s, w, r, s.cfg.Usage, fmt.Errorf("%w: this server does not meter usage", errdefs.ErrUnavailable))
	if !ok {
		return
	}
	qv := r.URL.Query()
	q := api.UsageQuery{Tenant: qv.Get("tenant"), Step: qv.Get("step"), GroupBy: qv.Get("group_by")}
	if q.Step == "" {
		q.Step = api.UsageByHour
	}
	if q.GroupBy == "" {
		q.GroupBy = api.UsageBySandbox
	}
	var err error
	if q.From, q.To, err = timeRangeOf(r, "from", "to"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if q.To.IsZero() {
		q.To = time.Now()
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-DefaultUsageRange)
	}
	if me, ok := tenant.FromContext(r.Context()); ok && !tenant.IsAdmin(me) {
		if q.Tenant != "" && q.Tenant != me {
			s.writeError(w, r, fmt.Errorf("%w: a key of tenant %s sees only its own usage; another's needs an admin key", errdefs.ErrForbidden, me))
			return
		}
		q.Tenant = me
	}
	if q.Tenant != "" && !tenant.Valid(q.Tenant) {
		s.writeError(w, r, fmt.Errorf("%w: %.64q is not a tenant name (1-63 of [a-z0-9-])", errdefs.ErrInvalid, q.Tenant))
		return
	}
	rep, err := u.Report(r.Context(), q)
	s.respond(w, r, http.StatusOK, rep, err)
}
