package api

import "time"

// AuditEntry is one API request that asked for a change (GET /v1/audit).
type AuditEntry struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	Tenant string    `json:"tenant,omitempty"` // none when the key was refused
	KeyID  string    `json:"key_id,omitempty"`
	Source string    `json:"source"`
	// Action is the route: its method and path pattern, as
	// "POST /v1/sandboxes/{id}/stop".
	Action string `json:"action"`
	// Target is the sandbox, snapshot, template, key, tenant, vault,
	// webhook or node acted on.
	Target    string `json:"target,omitempty"`
	Status    int    `json:"status"`
	RequestID string `json:"request_id,omitempty"`
}

// AuditList is the body of GET /v1/audit, newest first; Next, if not 0,
// is the before= of the next page.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
	Next    int64        `json:"next,omitempty"`
}

// AuditQuery selects audit entries (GET /v1/audit's parameters); a zero
// field selects all.
type AuditQuery struct {
	Tenant  string
	Sandbox string // any target, in fact: a sandbox's ID most often
	Action  string // a route, or a method alone ("DELETE")
	From    time.Time
	To      time.Time
	Before  int64
	Limit   int
}

// The lifecycle events' types (Event.Type).
const (
	LifecycleCreated       = "created"
	LifecycleStarted       = "started"
	LifecycleStopped       = "stopped"
	LifecyclePaused        = "paused"
	LifecycleResumed       = "resumed"
	LifecycleArchived      = "archived"
	LifecycleDeleted       = "deleted"
	LifecycleError         = "error"
	LifecycleLost          = "lost"
	LifecycleQuotaExceeded = "quota_exceeded"
)

// EventTypes are the types of events, in the order the docs list them.
var EventTypes = []string{LifecycleCreated, LifecycleStarted, LifecycleStopped, LifecyclePaused, LifecycleResumed,
	LifecycleArchived, LifecycleDeleted, LifecycleError, LifecycleLost, LifecycleQuotaExceeded}

// Event is a sandbox's lifecycle event, or a tenant's (a quota hit,
// without a sandbox): what GET /v1/events streams and webhooks deliver.
type Event struct {
	// Seq orders events: a stream resumed after Seq (Last-Event-ID)
	// misses none.
	Seq int64 `json:"seq"`
	// ID is unique: a webhook delivery's idempotency key.
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Tenant  string    `json:"tenant"`
	Sandbox string    `json:"sandbox,omitempty"`
	State   string    `json:"state,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

// Webhook is a tenant's subscription to its events (POST /v1/webhooks).
type Webhook struct {
	ID     string   `json:"id"`
	Tenant string   `json:"tenant"`
	URL    string   `json:"url"`
	Events []string `json:"events,omitempty"` // none: every type
	// Secret signs deliveries; shown only in the answer to the create.
	Secret    string    `json:"secret,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateWebhookRequest is the body of POST /v1/webhooks.
type CreateWebhookRequest struct {
	URL    string   `json:"url"`
	Events []string `json:"events,omitempty"`
}

// WebhookList is the body of GET /v1/webhooks.
type WebhookList struct {
	Webhooks []Webhook `json:"webhooks"`
}

// Delivery is one event owed to a webhook, and how its delivery went.
type Delivery struct {
	Event Event `json:"event"`
	// State is pending, delivered or failed (given up after a day).
	State      string     `json:"state"`
	Attempts   int        `json:"attempts"`
	NextAt     *time.Time `json:"next_at,omitempty"`
	LastStatus int        `json:"last_status,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
	DoneAt     *time.Time `json:"done_at,omitempty"`
}

// DeliveryList is the body of GET /v1/webhooks/{webhook}/deliveries,
// newest first.
type DeliveryList struct {
	Deliveries []Delivery `json:"deliveries"`
}

// The headers of a webhook delivery.
const (
	// HeaderSignature is "t=UNIX,v1=HEX": HEX is the HMAC-SHA256, keyed
	// by the webhook's secret, of UNIX, ".", and the body.
	HeaderSignature = "Atoll-Signature"
	// HeaderEventID is the event's ID: the same on every attempt, for
	// the receiver to drop a second delivery.
	HeaderEventID = "Atoll-Event-Id"
	// HeaderEventType is the event's type.
	HeaderEventType = "Atoll-Event-Type"
)
