package atoll

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// Audit returns the audit log entries q selects, newest first (admin keys
// only); the list's Next, if not 0, is q.Before of the next page.
func (c *Client) Audit(ctx context.Context, q api.AuditQuery) (api.AuditList, error) {
	v := url.Values{}
	for k, s := range map[string]string{"tenant": q.Tenant, "sandbox": q.Sandbox, "action": q.Action} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for k, t := range map[string]time.Time{"from": q.From, "to": q.To} {
		if !t.IsZero() {
			v.Set(k, t.UTC().Format(time.RFC3339))
		}
	}
	if q.Before > 0 {
		v.Set("before", strconv.FormatInt(q.Before, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return call[api.AuditList](ctx, c, request{method: "GET", path: "/v1/audit", query: v})
}

// EventsOptions select the events a stream sends.
type EventsOptions struct {
	// After resumes after the event of this seq; nil starts from now.
	After *int64
	// Types are the event types to send; none: every type.
	Types []string
	// Sandbox sends one sandbox's events only.
	Sandbox string
}

// EventStream is a stream of lifecycle events (Client.Events).
type EventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Events streams the lifecycle events of the key's tenant (admin keys:
// every tenant's) as the server's Server-Sent Events, until ctx ends or
// Close. A stream that breaks can be resumed with EventsOptions.After set
// to the last event's Seq.
func (c *Client) Events(ctx context.Context, opts EventsOptions) (*EventStream, error) {
	v := url.Values{}
	if opts.After != nil {
		v.Set("after", strconv.FormatInt(*opts.After, 10))
	}
	if len(opts.Types) > 0 {
		v.Set("types", strings.Join(opts.Types, ","))
	}
	if opts.Sandbox != "" {
		v.Set("sandbox", opts.Sandbox)
	}
	resp, err := c.send(ctx, request{method: "GET", path: "/v1/events", query: v})
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("GET /v1/events: answered %s, not an event stream", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &EventStream{body: resp.Body, sc: sc}, nil
}

// Next returns the next event; io.EOF when the server ended the stream.
func (s *EventStream) Next() (api.Event, error) {
	var data strings.Builder
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				continue // a comment's end, or a keep-alive
			}
			var e api.Event
			if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
				return api.Event{}, fmt.Errorf("decoding an event: %w", err)
			}
			return e, nil
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
		// id:, event: and comments: the data holds all of it.
	}
	if err := s.sc.Err(); err != nil {
		return api.Event{}, err
	}
	return api.Event{}, io.EOF
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }

// CreateWebhook adds a webhook for the key's tenant's events of types
// (none: every type). The answer holds its secret, which signs each
// delivery; it is never shown again.
func (c *Client) CreateWebhook(ctx context.Context, req api.CreateWebhookRequest) (api.Webhook, error) {
	return call[api.Webhook](ctx, c, request{method: "POST", path: "/v1/webhooks", json: req})
}

// ListWebhooks lists the key's tenant's webhooks, without their secrets.
func (c *Client) ListWebhooks(ctx context.Context) ([]api.Webhook, error) {
	l, err := call[api.WebhookList](ctx, c, request{method: "GET", path: "/v1/webhooks"})
	return l.Webhooks, err
}

// DeleteWebhook removes a webhook with its deliveries.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: "/v1/webhooks/" + url.PathEscape(id)}, nil)
}

// WebhookDeliveries returns a webhook's latest deliveries, newest first
// (limit 0: the server's default).
func (c *Client) WebhookDeliveries(ctx context.Context, id string, limit int) ([]api.Delivery, error) {
	v := url.Values{}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	l, err := call[api.DeliveryList](ctx, c, request{method: "GET", path: "/v1/webhooks/" + url.PathEscape(id) + "/deliveries", query: v})
	return l.Deliveries, err
}
