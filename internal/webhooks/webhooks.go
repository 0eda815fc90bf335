// Package webhooks delivers tenants' lifecycle events to their URLs. A
// webhook is a tenant's (its key's); the store queues a delivery of each
// event to every webhook of its tenant that wants its type, in the
// transaction that records the event (store.Journal.AddEvents). The
// Service claims due deliveries from the store (the head of each
// webhook's queue per sandbox, so that one sandbox's events arrive in
// order), POSTs each event's JSON signed with HMAC-SHA256 over a
// timestamp and the body, and records the outcome: delivered on a 2xx,
// else tried again with doubling waits until a day has passed since the
// event. A claim is held for a while: a node that dies mid-send leaves it
// due again for any node, so a delivery may come twice (the event's ID,
// in Atoll-Event-Id, tells the receiver), never not at all.
package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/events"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Store is the part of the store's journal webhooks use.
type Store interface {
	AddWebhook(ctx context.Context, w store.Webhook) error
	Webhooks(ctx context.Context, t string) ([]store.Webhook, error)
	GetWebhook(ctx context.Context, id string) (store.Webhook, error)
	DeleteWebhook(ctx context.Context, id string) error
	ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]store.Delivery, error)
	FinishDelivery(ctx context.Context, d store.Delivery) error
	Deliveries(ctx context.Context, id string, limit int) ([]store.Delivery, error)
}

// Config configures a Service. Store is required.
type Config struct {
	Store Store
	// AllowPrivate lets webhooks reach private, loopback and link-local
	// addresses (a receiver on the server's own network); by default
	// such URLs are refused, and so are connections to such addresses
	// whatever a name resolves to, so that a tenant cannot make the
	// server call into its own network.
	AllowPrivate bool
	// RetryAfter is the wait before the first retry of a failed
	// delivery; each next one waits twice as long, up to an hour.
	// Default DefaultRetryAfter.
	RetryAfter time.Duration
	// GiveUpAfter is how long after its event a delivery is tried;
	// default a day.
	GiveUpAfter time.Duration
	// Now is the clock deliveries are claimed, sent, retried and given
	// up by; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger // default slog.Default()
}

// Defaults.
const (
	DefaultRetryAfter = 10 * time.Second
	maxRetryAfter     = time.Hour
	giveUpAfter       = 24 * time.Hour
	// hold is how long a claimed delivery is this node's to send: longer
	// than a send may take (sendTimeout).
	hold        = time.Minute
	sendTimeout = 10 * time.Second
	claimBatch  = 32
	poll        = time.Second
	// settle is how long Run lets events gather after a Kick before it
	// looks for deliveries: under a burst of creates and deletes every
	// event's write kicks it, hundreds of times a second, and each look is
	// a query, whether or not any webhook exists. A delivery leaves at most
	// this much later.
	settle = 20 * time.Millisecond
	// maxWebhooks is the most webhooks a tenant may have.
	maxWebhooks = 20
)

// Service manages webhooks and sends their deliveries.
type Service struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	kick   chan struct{}
}

// New returns a Service; Run sends the deliveries.
func New(cfg Config) *Service {
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.GiveUpAfter <= 0 {
		cfg.GiveUpAfter = giveUpAfter
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.Default()
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	if !cfg.AllowPrivate {
		// Checked on the address dialled, after any name resolution:
		// a public name that resolves to a private address is refused
		// too.
		d.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !public(ap.Addr()) {
				return fmt.Errorf("webhook address %s is not public", address)
			}
			return nil
		}
	}
	s.client = &http.Client{
		Timeout:   sendTimeout,
		Transport: &http.Transport{DialContext: d.DialContext, Proxy: nil, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute},
		// A redirect could lead anywhere: the answer is the receiver's.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s
}

// public reports whether a is an address a webhook may reach without
// AllowPrivate.
func public(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast() &&
		!netip.MustParsePrefix("100.64.0.0/10").Contains(a) // carrier-grade NAT
}

// Kick has Run look for due deliveries now (events were just recorded).
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run sends the deliveries due, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		n := s.sendDue(ctx)
		if n == claimBatch {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
		case <-t.C:
		}
	}
}

// sendDue claims the deliveries due and sends them, at once; it returns
// how many it claimed.
func (s *Service) sendDue(ctx context.Context) int {
	ds, err := s.cfg.Store.ClaimDeliveries(ctx, s.cfg.Now(), hold, claimBatch)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("claiming webhook deliveries", "err", err)
		}
		return 0
	}
	hooks := map[string]store.Webhook{}
	for _, d := range ds {
		if _, ok := hooks[d.Webhook]; !ok {
			w, err := s.cfg.Store.GetWebhook(ctx, d.Webhook)
			if err != nil {
				continue // deleted since: its deliveries went with it
			}
			hooks[d.Webhook] = w
		}
	}
	var wg sync.WaitGroup
	for _, d := range ds {
		w, ok := hooks[d.Webhook]
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.deliver(ctx, w, d)
		}()
	}
	wg.Wait()
	return len(ds)
}

// Sign is the Atoll-Signature of body sent at t with secret.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks an Atoll-Signature header of body against secret, and
// that it was made within tolerance of now: what a receiver does.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("no timestamp in the signature")
	}
	at := time.Unix(sec, 0)
	if now.Sub(at) > tolerance || at.Sub(now) > tolerance {
		return errors.New("signature timestamp out of tolerance")
	}
	want := Sign(secret, at, body)
	_, wantSig, _ := strings.Cut(want, ",v1=")
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(wantSig)) {
			return nil
		}
	}
	return errors.New("signature does not match")
}

// deliver sends one delivery and records its outcome.
func (s *Service) deliver(ctx context.Context, w store.Webhook, d store.Delivery) {
	body, _ := json.Marshal(events.Wire(d.Event))
	now := s.cfg.Now()
	status, err := s.send(ctx, w, d, body, now)
	switch {
	case err == nil:
		d.State, d.DoneAt, d.LastError = store.DeliveryDone, s.cfg.Now().UTC(), ""
	case now.Sub(d.Event.At) >= s.cfg.GiveUpAfter:
		d.State, d.DoneAt = store.DeliveryFailed, s.cfg.Now().UTC()
	default:
		d.State = store.DeliveryPending
		d.NextAt = s.cfg.Now().Add(s.backoff(d.Attempts))
	}
	d.LastStatus = status
	if err != nil {
		d.LastError = err.Error()
		if len(d.LastError) > 500 {
			d.LastError = d.LastError[:500]
		}
		s.log.Debug("webhook delivery failed", "webhook", w.ID, "event", d.Event.ID, "attempt", d.Attempts, "err", err)
	}
	// The outcome is recorded even if ctx ended: a send that happened
	// must not be sent again for want of its record.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.cfg.Store.FinishDelivery(fctx, d); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("recording a webhook delivery", "webhook", w.ID, "event", d.Event.ID, "err", err)
	}
}

// backoff is the wait after attempt n failed.
func (s *Service) backoff(n int) time.Duration {
	d := s.cfg.RetryAfter
	for i := 1; i < n && d < maxRetryAfter; i++ {
		d *= 2
	}
	return min(d, maxRetryAfter)
}

// send POSTs body to w; the status answered, and an error unless it is
// a 2xx.
func (s *Service) send(ctx context.Context, w store.Webhook, d store.Delivery, body []byte, now time.Time) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "atoll-webhooks")
	req.Header.Set(api.HeaderSignature, Sign(w.Secret, now, body))
	req.Header.Set(api.HeaderEventID, d.Event.ID)
	req.Header.Set(api.HeaderEventType, d.Event.Type)
	req.Header.Set("Atoll-Delivery-Attempt", strconv.Itoa(d.Attempts))
	resp, err := s.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which the webhook's owner knows
		}
		return 0, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("answered %s", resp.Status)
	}
	return resp.StatusCode, nil
}

// Create adds a webhook for ctx's tenant.
func (s *Service) Create(ctx context.Context, req api.CreateWebhookRequest) (api.Webhook, error) {
	if err := s.checkURL(req.URL); err != nil {
		return api.Webhook{}, err
	}
	for _, t := range req.Events {
		if !slices.Contains(api.EventTypes, t) {
			return api.Webhook{}, fmt.Errorf("%w: %.40q is not an event type (%s)", errdefs.ErrInvalid, t, strings.Join(api.EventTypes, ", "))
		}
	}
	t := tenant.Of(ctx)
	have, err := s.cfg.Store.Webhooks(ctx, t)
	if err != nil {
		return api.Webhook{}, err
	}
	if len(have) >= maxWebhooks {
		return api.Webhook{}, fmt.Errorf("%w: a tenant has at most %d webhooks", errdefs.ErrConflict, maxWebhooks)
	}
	w := store.Webhook{ID: newID(), Tenant: t, URL: req.URL, Events: slices.Compact(slices.Sorted(slices.Values(req.Events))),
		Secret: "whsec_" + randomHex(24), CreatedAt: s.cfg.Now().UTC().Truncate(time.Microsecond)}
	if err := s.cfg.Store.AddWebhook(ctx, w); err != nil {
		return api.Webhook{}, err
	}
	out := wire(w)
	out.Secret = w.Secret
	return out, nil
}

// checkURL refuses what a webhook cannot be sent to.
func (s *Service) checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case len(raw) > 2048:
		return fmt.Errorf("%w: webhook URL longer than 2048 bytes", errdefs.ErrInvalid)
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%w: webhook URL %.100q: want an absolute http or https URL", errdefs.ErrInvalid, raw)
	case u.User != nil:
		return fmt.Errorf("%w: webhook URL: no user or password in it; the signature authenticates atoll", errdefs.ErrInvalid)
	case s.cfg.AllowPrivate:
		return nil
	}
	host := strings.ToLower(u.Hostname())
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return fmt.Errorf("%w: webhook URL %.100q is on this machine; the server refuses private addresses (atoll serve --webhook-allow-private)", errdefs.ErrInvalid, raw)
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && !public(a) {
		return fmt.Errorf("%w: webhook URL %.100q is a private, loopback or link-local address; the server refuses those (atoll serve --webhook-allow-private)", errdefs.ErrInvalid, raw)
	}
	return nil
}

// mine returns webhook id if ctx's tenant owns it; another tenant's is
// not found, as if it did not exist.
func (s *Service) mine(ctx context.Context, id string) (store.Webhook, error) {
	w, err := s.cfg.Store.GetWebhook(ctx, id)
	if err != nil {
		return w, err
	}
	if !tenant.Sees(ctx, w.Tenant) {
		return store.Webhook{}, fmt.Errorf("webhook %s: %w", id, errdefs.ErrNotFound)
	}
	return w, nil
}

// List returns ctx's tenant's webhooks, without their secrets.
func (s *Service) List(ctx context.Context) ([]api.Webhook, error) {
	ws, err := s.cfg.Store.Webhooks(ctx, tenant.Of(ctx))
	if err != nil {
		return nil, err
	}
	out := []api.Webhook{}
	for _, w := range ws {
		out = append(out, wire(w))
	}
	return out, nil
}

// Delete removes one of ctx's tenant's webhooks.
func (s *Service) Delete(ctx context.Context, id string) error {
	if _, err := s.mine(ctx, id); err != nil {
		return err
	}
	return s.cfg.Store.DeleteWebhook(ctx, id)
}

// Deliveries returns a webhook's latest deliveries, newest first.
func (s *Service) Deliveries(ctx context.Context, id string, limit int) ([]api.Delivery, error) {
	if _, err := s.mine(ctx, id); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 50
	}
	ds, err := s.cfg.Store.Deliveries(ctx, id, limit)
	if err != nil {
		return nil, err
	}
	out := []api.Delivery{}
	for _, d := range ds {
		ad := api.Delivery{Event: events.Wire(d.Event), State: d.State, Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError}
		if d.State == store.DeliveryPending {
			next := d.NextAt
			ad.NextAt = &next
		}
		if !d.DoneAt.IsZero() {
			done := d.DoneAt
			ad.DoneAt = &done
		}
		out = append(out, ad)
	}
	return out, nil
}

func wire(w store.Webhook) api.Webhook {
	return api.Webhook{ID: w.ID, Tenant: w.Tenant, URL: w.URL, Events: w.Events, CreatedAt: w.CreatedAt}
}

// newID is a webhook ID: 20 of [a-z0-9], as sandboxes' are.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
