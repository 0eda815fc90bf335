// Package audit writes the audit log: every API request that asks for a
// change (any method but GET, HEAD and OPTIONS, on atoll's REST API and on
// the E2B-compatible one), with its time, tenant, key, source address,
// action (the route), target and the status it was answered, whether it
// succeeded or not. Recorder.Wrap records around the whole API handler,
// so that no route is left out (TestEveryChangeIsAudited walks the route
// tables); Recorder.Auth tells it which key asked. Entries are written to
// the store's journal in batches by a goroutine of the Recorder's, off the
// request's path, and kept for Config.Retention.
package audit

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/store"
)

// Journal is where entries go: the store's.
type Journal interface {
	AddAudit(ctx context.Context, entries []store.AuditEntry) error
	Audit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error)
	PruneJournal(ctx context.Context, before time.Time) error
}

// Config configures a Recorder. Journal is required.
type Config struct {
	Journal Journal
	// Retention is how long entries, events and settled deliveries are
	// kept; 0 is DefaultRetention, a negative one forever.
	Retention time.Duration
	// PruneInterval is how often what is older than Retention is
	// deleted; default an hour. The first prune comes a minute after
	// New, or sooner if PruneInterval is.
	PruneInterval time.Duration
	// Now is the clock entries are stamped and aged by; default time.Now.
	Now func() time.Time
	// Skip, if set, leaves requests out that are not API actions (the
	// sandboxes' own traffic, git fetches).
	Skip   func(r *http.Request) bool
	Logger *slog.Logger // default slog.Default()
}

// DefaultRetention is how long the journal is kept by default.
const DefaultRetention = 90 * 24 * time.Hour

// Recorder records the API's changes.
type Recorder struct {
	cfg Config
	log *slog.Logger

	// mu guards closed; a send on queue holds it for reading, so that
	// Close, which takes it for writing, never closes queue under one.
	mu     sync.RWMutex
	closed bool
	queue  chan store.AuditEntry
	stop   chan struct{}
	done   sync.WaitGroup
}

// queueSize bounds the entries waiting to be written; a request that
// finds it full waits: a change is never left out of the log.
const queueSize = 4096

// batchSize bounds the entries one write commits.
const batchSize = 256

// New returns a Recorder, writing from now until Close.
func New(cfg Config) *Recorder {
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = pruneInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Recorder{cfg: cfg, log: cfg.Logger, queue: make(chan store.AuditEntry, queueSize), stop: make(chan struct{})}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.done.Add(2)
	go r.writeLoop()
	go r.pruneLoop()
	return r
}

// Close writes the entries queued, then stops.
func (r *Recorder) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.queue)
	close(r.stop)
	r.mu.Unlock()
	r.done.Wait()
}

func (r *Recorder) writeLoop() {
	defer r.done.Done()
	for e := range r.queue {
		batch := []store.AuditEntry{e}
	more:
		for len(batch) < batchSize {
			select {
			case e, ok := <-r.queue:
				if !ok {
					break more
				}
				batch = append(batch, e)
			default:
				break more
			}
		}
		r.write(batch)
	}
}

// write commits batch, trying again for a while: the store may be
// failing over.
func (r *Recorder) write(batch []store.AuditEntry) {
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := r.cfg.Journal.AddAudit(ctx, batch)
		cancel()
		if err == nil {
			return
		}
		if i == 4 {
			r.log.Error("audit entries lost: the store refuses them", "entries", len(batch), "err", err)
			return
		}
		r.log.Warn("writing audit entries", "entries", len(batch), "err", err)
		time.Sleep(time.Duration(i+1) * time.Second)
	}
}

// pruneInterval is how often the journal is pruned by default.
const pruneInterval = time.Hour

func (r *Recorder) pruneLoop() {
	defer r.done.Done()
	if r.cfg.Retention < 0 {
		return
	}
	t := time.NewTimer(min(time.Minute, r.cfg.PruneInterval))
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if err := r.cfg.Journal.PruneJournal(ctx, r.cfg.Now().Add(-r.cfg.Retention)); err != nil {
			r.log.Warn("pruning the journal", "err", err)
		}
		cancel()
		t.Reset(r.cfg.PruneInterval)
	}
}

// record queues e.
func (r *Recorder) record(e store.AuditEntry) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		r.log.Warn("audit entry after close", "action", e.Action, "target", e.Target)
		return
	}
	r.queue <- e
}

// Mutating reports whether a request of method asks for a change.
func Mutating(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// entry is what a request's handlers tell the Recorder about it.
type entry struct {
	mu            sync.Mutex
	tenant, keyID string
	target        string
	// action and pathTarget are the route that served the request and
	// its first wildcard's value (Matched).
	action, pathTarget string
	// transport: the request carried actions recorded as requests of
	// their own (NotAnAction), not one itself.
	transport bool
}

type ctxKey struct{}

// NotAnAction tells the Recorder that the request of ctx, its key
// accepted, only carries actions that reach the API as requests of their
// own, each recorded: an MCP session's POST, whose tools call the REST
// API. Recorded too, it would be every action twice. A request refused
// before this is recorded as any other.
func NotAnAction(ctx context.Context) {
	if e, ok := ctx.Value(ctxKey{}).(*entry); ok {
		e.mu.Lock()
		e.transport = true
		e.mu.Unlock()
	}
}

// SetTarget names what the request of ctx acted on when its path does
// not (a create's new sandbox).
func SetTarget(ctx context.Context, target string) {
	if e, ok := ctx.Value(ctxKey{}).(*entry); ok {
		e.mu.Lock()
		e.target = target
		e.mu.Unlock()
	}
}

// Matched tells the Recorder which route served r: call it (deferred)
// where a ServeMux serves r, which writes the route's pattern and path
// values into r, as middleware between Wrap and there may have passed
// on a copy of the request Wrap saw.
func Matched(r *http.Request) {
	if e, ok := r.Context().Value(ctxKey{}).(*entry); ok && r.Pattern != "" {
		e.mu.Lock()
		e.action, e.pathTarget = r.Pattern, firstWildcard(r)
		e.mu.Unlock()
	}
}

// Wrap records every request to h that asks for a change and matched a
// route, once h has answered it.
func (r *Recorder) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !Mutating(req.Method) || r.cfg.Skip != nil && r.cfg.Skip(req) {
			h.ServeHTTP(w, req)
			return
		}
		e := &entry{}
		req = req.WithContext(context.WithValue(req.Context(), ctxKey{}, e))
		sw := httpkit.Record(w)
		start := r.cfg.Now()
		h.ServeHTTP(sw, req)
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.transport {
			return
		}
		action, target := e.action, e.target
		if action == "" && req.Pattern != "" {
			// A mux served req itself.
			action, e.pathTarget = req.Pattern, firstWildcard(req)
		}
		// Requests that matched no route changed nothing.
		if action == "" || action == "/" {
			return
		}
		if target == "" {
			target = e.pathTarget
		}
		status := sw.Status()
		if status == 0 {
			status = http.StatusOK
		}
		rid := httpkit.RequestIDFrom(req.Context())
		if rid == "" {
			rid = req.Header.Get(httpkit.RequestIDHeader)
		}
		r.record(store.AuditEntry{
			At: start.UTC(), Tenant: e.tenant, KeyID: e.keyID, Source: host(req.RemoteAddr),
			Action: action, Target: clip(target), Status: status, RequestID: clip(rid),
		})
	})
}

// firstWildcard is the value of the first wildcard of req's pattern: the
// resource its route acts on (/v1/sandboxes/{id}/..., /sandboxes/{sandboxID}).
func firstWildcard(req *http.Request) string {
	_, p, ok := strings.Cut(req.Pattern, "{")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(p, "}")
	return req.PathValue(strings.TrimSuffix(name, "..."))
}

func host(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// clip bounds what a client chose (a path's ID, a request ID) to what an
// audit row needs, as valid UTF-8.
func clip(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// Authenticator is the API's key check (auth.Keys).
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (tenant string, err error)
}

// Auth returns a the way the API uses it, telling the Recorder which key
// and tenant a request recorded acts for.
func (r *Recorder) Auth(a Authenticator) Authenticator { return keyCheck{a} }

type keyCheck struct{ a Authenticator }

func (k keyCheck) Authenticate(ctx context.Context, key string) (string, error) {
	t, err := k.a.Authenticate(ctx, key)
	if err != nil {
		return t, err
	}
	if e, ok := ctx.Value(ctxKey{}).(*entry); ok {
		e.mu.Lock()
		e.tenant, e.keyID = t, store.KeyID(auth.Hash(strings.TrimSpace(key)))
		e.mu.Unlock()
	}
	return t, nil
}

// List returns the entries q selects, newest first, and the before= of
// the next page (0 for none).
func (r *Recorder) List(ctx context.Context, q api.AuditQuery) ([]api.AuditEntry, int64, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	es, err := r.cfg.Journal.Audit(ctx, store.AuditFilter{
		Tenant: q.Tenant, Target: q.Sandbox, Action: q.Action, From: q.From, To: q.To, Before: q.Before, Limit: limit,
	})
	if err != nil {
		return nil, 0, err
	}
	out := make([]api.AuditEntry, 0, len(es))
	for _, e := range es {
		out = append(out, api.AuditEntry{Seq: e.Seq, Time: e.At, Tenant: e.Tenant, KeyID: e.KeyID, Source: e.Source,
			Action: e.Action, Target: e.Target, Status: e.Status, RequestID: e.RequestID})
	}
	var next int64
	if len(es) == limit {
		next = es[len(es)-1].Seq
	}
	return out, next, nil
}
