package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Audit is the audit log (audit.Recorder).
type Audit interface {
	// List returns the entries q selects, newest first, and the before=
	// of the next page (0: none).
	List(ctx context.Context, q api.AuditQuery) ([]api.AuditEntry, int64, error)
}

// Events streams lifecycle events (events.Bus).
type Events interface {
	// Subscribe sends the events that ctx's tenant sees (admins: every
	// tenant's) whose Seq is above after, in order, as they come, until
	// ctx ends, then closes the channel. A stream too slow to keep up is
	// ended, the channel closed early: its client resumes from the last
	// event it had.
	Subscribe(ctx context.Context, after int64) (<-chan api.Event, error)
}

// Webhooks are the tenants' webhooks (webhooks.Service); every call acts
// for the tenant of ctx, to which another tenant's webhooks are not found.
type Webhooks interface {
	Create(ctx context.Context, req api.CreateWebhookRequest) (api.Webhook, error)
	List(ctx context.Context) ([]api.Webhook, error)
	Delete(ctx context.Context, id string) error
	// Deliveries returns a webhook's latest deliveries, newest first.
	Deliveries(ctx context.Context, id string, limit int) ([]api.Delivery, error)
}

// maxAuditPage is the most entries one GET /v1/audit answers.
const maxAuditPage = 1000

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	a, ok := part(s, w, r, s.cfg.Audit, fmt.Errorf("%w: this server keeps no audit log", errdefs.ErrUnavailable))
	if !ok {
		return
	}
	qs := r.URL.Query()
	q := api.AuditQuery{Tenant: qs.Get("tenant"), Sandbox: qs.Get("sandbox"), Action: qs.Get("action")}
	var err error
	if q.From, err = timeParam(r, "from"); err == nil {
		q.To, err = timeParam(r, "to")
	}
	if err == nil {
		q.Limit, err = queryLimit(r, maxAuditPage)
	}
	if b := qs.Get("before"); err == nil && b != "" {
		if q.Before, err = strconv.ParseInt(b, 10, 64); err != nil || q.Before < 1 {
			err = fmt.Errorf("%w: before: want a seq from 1 up", errdefs.ErrInvalid)
		}
	}
	for _, v := range []string{q.Tenant, q.Sandbox, q.Action} {
		if err == nil && len(v) > 200 {
			err = fmt.Errorf("%w: filters are at most 200 bytes", errdefs.ErrInvalid)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	entries, next, err := a.List(r.Context(), q)
	s.respond(w, r, http.StatusOK, api.AuditList{Entries: entries, Next: next}, err)
}

// keepAlive is how often an idle event stream gets a comment, so that
// proxies between it and its client do not time it out.
const keepAlive = 15 * time.Second

// streamEvents is GET /v1/events: Server-Sent Events, one per lifecycle
// event, "id" its seq, so that a client reconnecting with Last-Event-ID
// (or ?after=) misses none; ?types= and ?sandbox= filter.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	ev, ok := part(s, w, r, s.cfg.Events, fmt.Errorf("%w: this server keeps no events", errdefs.ErrUnavailable))
	if !ok {
		return
	}
	qs := r.URL.Query()
	after := qs.Get("after")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		after = id
	}
	var from int64
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil || n < 0 {
			s.writeError(w, r, fmt.Errorf("%w: after (Last-Event-ID): want a seq from 0 up", errdefs.ErrInvalid))
			return
		}
		from = n
	} else {
		from = -1 // from now on
	}
	var types []string
	if t := qs.Get("types"); t != "" {
		types = strings.Split(t, ",")
		for _, ty := range types {
			if !slices.Contains(api.EventTypes, ty) {
				s.writeError(w, r, fmt.Errorf("%w: types: %.40q is not an event type (%s)", errdefs.ErrInvalid, ty, strings.Join(api.EventTypes, ", ")))
				return
			}
		}
	}
	sandbox := qs.Get("sandbox")
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := ev.Subscribe(ctx, from)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, ": atoll events\n\n"); err != nil || rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return
			}
			if len(types) > 0 && !slices.Contains(types, e.Type) || sandbox != "" && e.Sandbox != sandbox {
				continue
			}
			b, _ := json.Marshal(e)
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, b); err != nil {
				return
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}

func (s *Server) webhooks(w http.ResponseWriter, r *http.Request) (Webhooks, bool) {
	return part(s, w, r, s.cfg.Webhooks, fmt.Errorf("%w: this server sends no webhooks", errdefs.ErrUnavailable))
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeBody[api.CreateWebhookRequest](s, w, r, false, nil)
	if !ok {
		return
	}
	wh, ok := s.webhooks(w, r)
	if !ok {
		return
	}
	hook, err := wh.Create(r.Context(), req)
	if err == nil {
		audit.SetTarget(r.Context(), hook.ID)
		// The answer holds the secret, shown only here.
		w.Header().Set("Cache-Control", "no-store")
	}
	s.respond(w, r, http.StatusCreated, hook, err)
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	wh, ok := s.webhooks(w, r)
	if !ok {
		return
	}
	list, err := wh.List(r.Context())
	s.respond(w, r, http.StatusOK, api.WebhookList{Webhooks: list}, err)
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	wh, ok := s.webhooks(w, r)
	if !ok {
		return
	}
	remove(s, w, r, webhookID, wh.Delete)
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	id, ok := webhookID(w, r)
	if !ok {
		return
	}
	limit, err := queryLimit(r, 1000)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	wh, ok := s.webhooks(w, r)
	if !ok {
		return
	}
	ds, err := wh.Deliveries(r.Context(), id, limit)
	s.respond(w, r, http.StatusOK, api.DeliveryList{Deliveries: ds}, err)
}

// webhookID returns the {webhook} of r, or writes 400 and returns false.
func webhookID(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathID(w, r, "webhook", "webhook")
}
