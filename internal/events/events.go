// Package events records the sandboxes' lifecycle events in the store's
// journal and streams them to subscribers (GET /v1/events). The control
// plane publishes an event when the store has recorded the change it
// tells of (control/events.go); the Bus writes events in batches, off the
// caller's path, and the store numbers them in commit order. Every
// subscriber reads the journal from its own position, so a stream
// resumed after an event misses none; it is woken when this node writes
// events and, for the events other nodes of a cluster write, by a poll of
// the store.
package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Journal is where events go: the store's.
type Journal interface {
	AddEvents(ctx context.Context, evs []store.Event) ([]store.Event, error)
	Events(ctx context.Context, after int64, limit int) ([]store.Event, error)
	LastEventSeq(ctx context.Context) (int64, error)
}

// Config configures a Bus. Journal is required.
type Config struct {
	Journal Journal
	// Poll is how often subscribers look for events other nodes wrote;
	// default DefaultPoll.
	Poll   time.Duration
	Logger *slog.Logger // default slog.Default()
	// Written, if set, is told once a batch is recorded that queued
	// webhook deliveries (the webhooks' sender, to deliver at once).
	Written func()
}

// DefaultPoll is how often the journal is read for other nodes' events.
const DefaultPoll = time.Second

// Bus records and streams events.
type Bus struct {
	cfg Config
	log *slog.Logger

	// mu guards closed, and wake: closed and replaced each time events
	// are written, to wake the subscribers. A send on queue holds mu for
	// reading, so that Close never closes queue under one.
	mu     sync.RWMutex
	closed bool
	wake   chan struct{}
	queue  chan store.Event
	done   sync.WaitGroup
	// streams is closed by EndStreams, ending every subscription.
	streams   chan struct{}
	endStream sync.Once
}

const (
	queueSize = 4096
	batchSize = 256
	// pageSize is how many events a subscriber reads at once.
	pageSize = 500
)

// New returns a Bus, writing from now until Close.
func New(cfg Config) *Bus {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	b := &Bus{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}), queue: make(chan store.Event, queueSize),
		streams: make(chan struct{})}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.done.Add(1)
	go b.writeLoop()
	return b
}

// Close writes the events queued, ends the streams, and stops.
func (b *Bus) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.queue)
	b.mu.Unlock()
	b.EndStreams()
	b.done.Wait()
}

// EndStreams ends every subscription, now and to come, so that an HTTP
// server shutting down does not wait for streams that never end; events
// are still recorded until Close.
func (b *Bus) EndStreams() { b.endStream.Do(func() { close(b.streams) }) }

// Publish queues e to be recorded, with an ID and a time if it has none.
// It waits only while the queue is full.
func (b *Bus) Publish(e store.Event) {
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		b.log.Warn("event after close", "type", e.Type, "sandbox", e.Sandbox)
		return
	}
	b.queue <- e
}

// NewID is a new event ID: "evt_" and 24 hex digits.
func NewID() string {
	var r [12]byte
	rand.Read(r[:])
	return "evt_" + hex.EncodeToString(r[:])
}

func (b *Bus) writeLoop() {
	defer b.done.Done()
	for e := range b.queue {
		batch := []store.Event{e}
	more:
		for len(batch) < batchSize {
			select {
			case e, ok := <-b.queue:
				if !ok {
					break more
				}
				batch = append(batch, e)
			default:
				break more
			}
		}
		b.write(batch)
	}
}

// write records batch, trying again for a while (the store may be
// failing over), then wakes the subscribers.
func (b *Bus) write(batch []store.Event) {
	queued := false
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := b.cfg.Journal.AddEvents(ctx, batch)
		cancel()
		if err == nil {
			queued = slices.ContainsFunc(out, func(e store.Event) bool { return e.Queued > 0 })
			break
		}
		if i == 4 {
			b.log.Error("events lost: the store refuses them", "events", len(batch), "err", err)
			return
		}
		b.log.Warn("recording events", "events", len(batch), "err", err)
		time.Sleep(time.Duration(i+1) * time.Second)
	}
	b.mu.Lock()
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
	// Without a delivery queued the sender has nothing to look for; it
	// polls anyway, for other nodes' events.
	if queued && b.cfg.Written != nil {
		b.cfg.Written()
	}
}

// woken is the channel the next write closes.
func (b *Bus) woken() <-chan struct{} {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.wake
}

// Subscribe sends the events ctx's tenant sees (admins, and the server
// itself: every tenant's) whose Seq is above after (after < 0: those
// recorded from now on), in order, until ctx ends or the Bus closes.
func (b *Bus) Subscribe(ctx context.Context, after int64) (<-chan api.Event, error) {
	if after < 0 {
		last, err := b.cfg.Journal.LastEventSeq(ctx)
		if err != nil {
			return nil, err
		}
		after = last
	}
	who, scoped := tenant.FromContext(ctx)
	if scoped && tenant.IsAdmin(who) {
		scoped = false
	}
	ch := make(chan api.Event, 64)
	go func() {
		defer close(ch)
		poll := time.NewTicker(b.cfg.Poll)
		defer poll.Stop()
		for {
			wake := b.woken()
			evs, err := b.cfg.Journal.Events(ctx, after, pageSize)
			if err != nil {
				if ctx.Err() == nil {
					b.log.Warn("reading events", "err", err)
				}
			}
			for _, e := range evs {
				after = e.Seq
				if scoped && e.Tenant != who {
					continue
				}
				select {
				case ch <- Wire(e):
				case <-ctx.Done():
					return
				case <-b.streams:
					return
				}
			}
			if len(evs) == pageSize {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-b.streams:
				return
			case <-wake:
			case <-poll.C:
			}
		}
	}()
	return ch, nil
}

// Wire is e as the API shows it.
func Wire(e store.Event) api.Event {
	return api.Event{Seq: e.Seq, ID: e.ID, Type: e.Type, Time: e.At, Tenant: e.Tenant, Sandbox: e.Sandbox, State: e.State, Reason: e.Reason}
}
