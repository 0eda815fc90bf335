// Package templates keeps atoll's templates: names pointing to immutable
// versions of layer stacks, imported from OCI registries and archives,
// built from Dockerfiles (each RUN step in a scratch sandbox the sandbox
// state machine starts for it, through the narrow Sandboxes interface),
// bootstrapped with debootstrap, tagged, resolved for creates and collected
// once nothing holds them.
package templates

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
)

// Sandboxes is what templates ask of the sandbox state machine.
type Sandboxes interface {
	// StartScratch starts a sandbox over tmpl that the API never shows
	// (lifecycle.Building), for a build step; the caller must Discard it.
	StartScratch(ctx context.Context, tmpl layers.Template) (Scratch, error)
	// DrainPools discards the warm-pool sandboxes of versions no template
	// name pools any more; WakePools has the pools refilled.
	DrainPools(ctx context.Context)
	WakePools()
}

// Scratch is a running scratch sandbox.
type Scratch interface {
	// ID is its ID, which names its writable layer.
	ID() string
	// Agent is a client of its agent.
	Agent() *agent.Client
	// Stop ends its processes and keeps its files.
	Stop(ctx context.Context) error
	// Discard removes every trace of it.
	Discard(ctx context.Context)
}

// Defaults are the node's default runtime, whose scratch sandboxes build
// and whose layer images a template prepares.
type Defaults struct {
	Runtime string
}

// Config configures a Service.
type Config struct {
	Store     store.Store
	Layers    *layers.Store
	Runtimes  map[string]runtime.Runtime
	Defaults  Defaults
	Sandboxes Sandboxes
	// Blobs is, in a cluster, the object store the nodes share template
	// layers through (share.go); nil on a single machine.
	Blobs blob.Store
	// Pins, with Blobs, order this node's use of the objects against
	// other nodes' deletion of them (share.go); nil with a single node.
	Pins   store.BlobPins
	Logger *slog.Logger
}

// Service keeps templates.
type Service struct {
	store     store.Store
	layers    *layers.Store
	runtimes  map[string]runtime.Runtime
	defaults  Defaults
	sandboxes Sandboxes
	blobs     blob.Store
	pins      store.BlobPins
	log       *slog.Logger

	// pulls are the layer downloads under way, by layer ID.
	pullMu sync.Mutex
	pulls  map[string]*pullCall
	// held are the versions whose layers the node holds (Refresh);
	// swept is when Refresh last swept the object store (sweepObjects).
	heldMu sync.Mutex
	held   []string
	swept  time.Time

	// tmplMu serialises recording and deleting templates with the layer
	// collector; importing counts imports in flight, which hold layers no
	// template refers to yet. Callers may hold a sandbox's lock when they
	// take it, never the other way round.
	tmplMu    sync.Mutex
	importing int
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{store: cfg.Store, layers: cfg.Layers, runtimes: cfg.Runtimes, defaults: cfg.Defaults, sandboxes: cfg.Sandboxes,
		blobs: cfg.Blobs, pins: cfg.Pins, log: cfg.Logger, pulls: map[string]*pullCall{}}
}
