package store

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Journal is what happened, kept for operators and tenants: the audit log
// of the API's changes (package audit writes it), the sandboxes' lifecycle
// events (package events), and the webhooks that deliver those events with
// their deliveries (package webhooks). In a cluster it is the cluster's:
// an event one node records is streamed and delivered by every node.
//
// An event and the deliveries it owes are recorded in one transaction
// (AddEvents), so that a webhook never misses an event that was recorded.
// A delivery is claimed for a while (ClaimDeliveries) by the node that
// sends it; one that is not finished by then is due again, so that a node
// that dies mid-send costs a second delivery, never a lost one.
type Journal interface {
	// AddAudit appends entries.
	AddAudit(ctx context.Context, entries []AuditEntry) error
	// Audit returns the entries f selects, newest first (by Seq), at most
	// f.Limit (0: all).
	Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
	// AddEvents appends evs, each given its Seq (ascending in the order
	// of evs, and of commits: a reader that has seen Seq n will never see
	// a smaller one appear), and queues a delivery of each to every
	// webhook of its tenant that wants its type (Webhook.Wants), all in
	// one transaction. It returns evs with their Seq and Queued.
	AddEvents(ctx context.Context, evs []Event) ([]Event, error)
	// Events returns the events whose Seq is above after, by Seq, at
	// most limit (0: all).
	Events(ctx context.Context, after int64, limit int) ([]Event, error)
	// LastEventSeq is the highest Seq recorded; 0 if none.
	LastEventSeq(ctx context.Context) (int64, error)
	// PruneJournal deletes the audit entries and events from before
	// before, and the deliveries finished before it; an event a pending
	// delivery still needs stays.
	PruneJournal(ctx context.Context, before time.Time) error

	// AddWebhook records a webhook; an ID already recorded is
	// ErrConflict.
	AddWebhook(ctx context.Context, w Webhook) error
	// Webhooks returns tenant t's webhooks (every tenant's if t is ""),
	// by CreatedAt, then ID.
	Webhooks(ctx context.Context, t string) ([]Webhook, error)
	// GetWebhook returns one webhook.
	GetWebhook(ctx context.Context, id string) (Webhook, error)
	// DeleteWebhook removes a webhook with its deliveries.
	DeleteWebhook(ctx context.Context, id string) error
	// ClaimDeliveries takes up to limit deliveries that are due at now,
	// each the oldest pending one of its webhook and sandbox (so that a
	// sandbox's events reach a webhook in their order), counts an
	// attempt of each and holds them until now+hold: their NextAt, when
	// they are due again unless FinishDelivery settles them first.
	ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]Delivery, error)
	// FinishDelivery records the outcome of an attempt at delivery d:
	// its State (DeliveryDone, DeliveryFailed: given up, or
	// DeliveryPending with the NextAt of the next attempt), LastStatus
	// and LastError, and DoneAt once it is settled.
	FinishDelivery(ctx context.Context, d Delivery) error
	// Deliveries returns webhook id's deliveries, newest first, at most
	// limit (0: all).
	Deliveries(ctx context.Context, id string, limit int) ([]Delivery, error)
}

// AuditEntry is one API request that asked for a change.
type AuditEntry struct {
	Seq    int64
	At     time.Time
	Tenant string // "" when the key was refused
	KeyID  string // store.KeyID of the key; "" for none
	// Source is the client's address.
	Source string
	// Action is the route: its method and path pattern, as
	// "POST /v1/sandboxes/{id}/stop".
	Action string
	// Target is what the request acted on: a sandbox, snapshot, template,
	// key, tenant, vault, webhook or node ID or name; "" for none.
	Target string
	// Status is the HTTP status answered.
	Status    int
	RequestID string
}

// AuditFilter selects audit entries; a zero field selects all.
type AuditFilter struct {
	// Action is a route ("POST /v1/sandboxes/{id}/stop"), or a method
	// alone ("DELETE"): every route of it.
	Tenant, Target, Action string
	// From and To bound At, inclusive.
	From, To time.Time
	// Before selects entries whose Seq is below it, to page back.
	Before int64
	Limit  int
}

// Match reports whether f selects e (the stores' queries, in Go, for
// tests and for checking them).
func (f AuditFilter) Match(e AuditEntry) bool {
	return (f.Tenant == "" || e.Tenant == f.Tenant) && (f.Target == "" || e.Target == f.Target) &&
		(f.Action == "" || e.Action == f.Action || IsMethod(f.Action) && strings.HasPrefix(e.Action, f.Action+" ")) && (f.From.IsZero() || !e.At.Before(f.From)) &&
		(f.To.IsZero() || !e.At.After(f.To)) && (f.Before == 0 || e.Seq < f.Before)
}

// IsMethod reports whether s is an HTTP method's name (an audit filter
// of every route of it): 1 to 10 of [A-Z].
func IsMethod(s string) bool {
	return s != "" && len(s) <= 10 && strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == ""
}

// Event is a sandbox's lifecycle event (api.Event's types), or a tenant's
// (a quota hit, with no sandbox).
type Event struct {
	Seq int64
	// ID is unique, made by whoever records it: a webhook delivery's
	// idempotency key.
	ID      string
	At      time.Time
	Type    string
	Tenant  string
	Sandbox string
	// State is the sandbox's state after the event; Reason why it came
	// (an error's, a quota's message).
	State, Reason string
	// Queued is how many webhook deliveries AddEvents queued for it; it
	// is not kept.
	Queued int
}

// Webhook is a tenant's subscription to its events.
type Webhook struct {
	ID     string
	Tenant string
	URL    string
	// Events are the types it wants; none is every type.
	Events []string
	// Secret signs its deliveries (HMAC-SHA256).
	Secret    string
	CreatedAt time.Time
}

// Wants reports whether w wants events of type typ.
func (w Webhook) Wants(typ string) bool { return len(w.Events) == 0 || slices.Contains(w.Events, typ) }

// Check refuses a webhook that a store cannot hold exactly: an ID, tenant,
// URL, event or secret that is empty where it must not be, too long, or
// not UTF-8 text, and a URL that is not absolute http(s).
func (w Webhook) Check() error {
	for _, s := range append([]string{w.ID, w.Tenant, w.URL, w.Secret}, w.Events...) {
		if s == "" || len(s) > 2048 || !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			return fmt.Errorf("%w: webhook fields must be non-empty UTF-8 text of at most 2048 bytes", errdefs.ErrInvalid)
		}
	}
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: webhook URL must be an absolute http or https URL", errdefs.ErrInvalid)
	}
	return nil
}

// Delivery is one event owed to one webhook.
type Delivery struct {
	Seq     int64
	Webhook string
	Event   Event
	// State is DeliveryPending, DeliveryDone or DeliveryFailed.
	State    string
	Attempts int
	// NextAt is when it is due (pending).
	NextAt     time.Time
	LastStatus int
	LastError  string
	CreatedAt  time.Time
	DoneAt     time.Time // zero while pending
}

// The states of a delivery.
const (
	DeliveryPending = "pending"
	DeliveryDone    = "delivered"
	DeliveryFailed  = "failed"
)

// JoinEvents is the stored form of a webhook's event types.
func JoinEvents(types []string) string { return strings.Join(types, ",") }

// SplitEvents reads JoinEvents' form.
func SplitEvents(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
