package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
)

// Limits of polling watchers (CreateWatcher), which live on the host
// between calls, so each costs memory and an agent connection.
const (
	maxWatchersPerSandbox = 64
	maxWatcherEvents      = 10000 // buffered between polls; more are dropped
	watcherIdle           = 10 * time.Minute
)

// watchers are the polling watchers of every sandbox.
type watchers struct {
	log *slog.Logger
	wg  sync.WaitGroup
	// mu guards all: watchers by sandbox ID and watcher ID.
	mu  sync.Mutex
	all map[string]map[string]*watcher
}

type watcher struct {
	cancel context.CancelFunc
	// mu guards the fields below, which the reader goroutine fills.
	mu       sync.Mutex
	events   []*filesystem.FilesystemEvent
	dropped  int
	ended    bool
	lastPoll time.Time
}

func newWatchers(log *slog.Logger) *watchers {
	return &watchers{log: log, all: map[string]map[string]*watcher{}}
}

func (ws *watchers) create(ctx context.Context, c *call, p string, opts agent.WatchOptions) (string, error) {
	ws.expire()
	ws.mu.Lock()
	n := len(ws.all[c.sb.ID])
	ws.mu.Unlock()
	if n >= maxWatchersPerSandbox {
		return "", connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d watchers per sandbox; remove some", maxWatchersPerSandbox))
	}
	// The watch outlives this request: it ends with RemoveWatcher, idleness,
	// the sandbox stopping or the server closing.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	dir, stream, err := c.watchDir(ctx, wctx, p, opts)
	if err != nil {
		cancel()
		return "", err
	}
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	w := &watcher{cancel: cancel, lastPoll: time.Now()}
	ws.mu.Lock()
	if ws.all[c.sb.ID] == nil {
		ws.all[c.sb.ID] = map[string]*watcher{}
	}
	ws.all[c.sb.ID][id] = w
	ws.mu.Unlock()
	ws.wg.Go(func() {
		defer stream.Close()
		for {
			ev, err := stream.Next()
			if err != nil {
				w.mu.Lock()
				w.ended = true
				w.mu.Unlock()
				return
			}
			fe := c.fsEvent(wctx, dir, ev)
			if fe == nil {
				continue
			}
			w.mu.Lock()
			if len(w.events) < maxWatcherEvents {
				w.events = append(w.events, fe)
			} else {
				w.dropped++
			}
			w.mu.Unlock()
		}
	})
	return id, nil
}

func (ws *watchers) get(sandbox, id string) (*watcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.all[sandbox][id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return w, nil
}

// events hands out what the watcher saw since the last poll. A watcher
// whose watch ended is removed once drained.
func (ws *watchers) events(sandbox, id string) ([]*filesystem.FilesystemEvent, error) {
	w, err := ws.get(sandbox, id)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, dropped, ended := w.events, w.dropped, w.ended
	w.events, w.dropped, w.lastPoll = nil, 0, time.Now()
	w.mu.Unlock()
	if dropped > 0 {
		ws.log.Warn("watcher dropped events between polls", "sandbox", sandbox, "dropped", dropped)
	}
	if ended && len(evs) == 0 {
		ws.remove(sandbox, id)
		return nil, connect.NewError(connect.CodeNotFound, errors.New("the watch ended: the directory or the sandbox went away"))
	}
	if evs == nil {
		evs = []*filesystem.FilesystemEvent{}
	}
	return evs, nil
}

func (ws *watchers) remove(sandbox, id string) error {
	ws.mu.Lock()
	w, ok := ws.all[sandbox][id]
	if ok {
		delete(ws.all[sandbox], id)
		if len(ws.all[sandbox]) == 0 {
			delete(ws.all, sandbox)
		}
	}
	ws.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	w.cancel()
	return nil
}

// expire removes watchers nobody polled for watcherIdle: clients that
// went away without RemoveWatcher.
func (ws *watchers) expire() {
	type key struct{ sb, id string }
	var old []key
	ws.mu.Lock()
	for sb, m := range ws.all {
		for id, w := range m {
			w.mu.Lock()
			if time.Since(w.lastPoll) > watcherIdle {
				old = append(old, key{sb, id})
			}
			w.mu.Unlock()
		}
	}
	ws.mu.Unlock()
	for _, k := range old {
		ws.remove(k.sb, k.id)
	}
}

func (ws *watchers) closeAll() {
	ws.mu.Lock()
	for _, m := range ws.all {
		for _, w := range m {
			w.cancel()
		}
	}
	ws.all = map[string]map[string]*watcher{}
	ws.mu.Unlock()
	ws.wg.Wait()
}
