// Package control is the sandbox state machine: it validates requests, records
// every state change in the store before acknowledging it (through states.go,
// against internal/lifecycle's table), drives the layer store and the
// runtimes, re-adopts running sandboxes after a restart and sweeps up what a
// crash left half-made. Templates (internal/templates) and the sandboxes kept
// ready ahead of demand (internal/pools) are packages of their own that ask
// it for sandboxes through small interfaces (scratch.go, pool.go,
// prestart.go).
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/metrics"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/pools"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/templates"
	"github.com/atoll-dev/atoll/internal/tenant"
	"github.com/atoll-dev/atoll/internal/usage"
	"github.com/atoll-dev/atoll/internal/vault"
)

// Defaults are the limits a sandbox gets when its create request leaves them out.
type Defaults struct {
	Template  string
	Runtime   string
	CPU       float64
	MemoryMiB int64
	DiskGiB   int64
	PIDs      int64
}

// Config configures a Service.
type Config struct {
	Store store.Store
	// Node runs the sandboxes: runtimes, layers, networks, the agent
	// binary, memory images. A runtime the node knows but cannot offer is
	// a clear 503 rather than an unknown runtime's 400; without a network
	// sandboxes have loopback only and network policies are refused;
	// without a checkpoint directory suspending is.
	Node     Node
	Defaults Defaults
	// WarmPool is how many default sandboxes to keep started ahead of
	// demand; 0 disables the pool.
	WarmPool int
	// Prestart is how many sandbox processes to keep started ahead of
	// demand, not yet bound to files (see prestart.go); 0 disables them.
	Prestart int
	// CreateConcurrency is how many creates the warm pool cannot serve
	// may start sandboxes at once (0: 4 per core), and CreateQueue how
	// many more may wait for their turn (0: 256); creates beyond them are
	// refused with a Busy error (see admission.go).
	CreateConcurrency int
	CreateQueue       int
	// Archive is where archived sandboxes' files go; nil disables archiving.
	Archive blob.Store
	// MetricsInterval is how often running sandboxes are sampled for
	// their metrics; default metrics.DefaultInterval (5 s, E2B's).
	MetricsInterval time.Duration
	// UsageInterval is how often the usage meter samples every sandbox
	// of the node and writes its usage (package usage); default
	// usage.DefaultInterval. NoUsage turns metering off.
	UsageInterval time.Duration
	NoUsage       bool
	// Placer and Peers make the Service a node of a cluster, with a
	// named Node and a fenced store (see cluster.go); nil on a single
	// machine.
	Placer Placer
	Peers  Peers
	// Demand, on a cluster node, is the cluster's demand
	// (store.Cluster.Demand), which the node's warm pools then follow
	// within WarmPool and the room Capacity leaves (pools.Sizer); nil
	// keeps the fixed sizes.
	Demand   func(ctx context.Context) (store.Demand, error)
	Capacity store.Resources
	// TakeCreates, on a cluster node, takes tenants' creates from buckets
	// every node shares (store.Cluster.TakeCreates), so that a tenant's
	// creates_per_second holds across the cluster; nil keeps the buckets
	// in this process, which a single machine's every create goes through.
	TakeCreates func(ctx context.Context, t string, n int, rate, burst float64) (time.Duration, error)
	// BlobPins, on a cluster node, order its use of template layers'
	// objects against other nodes' deletion of them (templates.Config.Pins).
	BlobPins store.BlobPins
	// Mover hands sandboxes to other nodes (move.go): a drain's and a
	// lost sandbox's restore; nil on a single machine.
	Mover Mover
	// Events takes the sandboxes' lifecycle events (events.Bus); nil
	// publishes none.
	Events Events
	Logger *slog.Logger
}

// Node is what the control plane asks of the machine that runs its
// sandboxes: the seam between the tier that decides and records (this
// package, internal/templates, internal/pools) and the tier that runs
// (internal/node's Node implements it). Cluster mode puts the node
// protocol behind it; nothing else of a node reaches this package.
type Node interface {
	// Name is the node's name in its cluster; "" on a single machine.
	Name() string
	// Runtimes are the runtimes it offers, by name; Unavailable those it
	// knows but cannot offer, with why.
	Runtimes() map[string]runtime.Runtime
	Unavailable() map[string]string
	Layers() *layers.Store
	// Network is its sandbox network manager and pool; either may be nil.
	Network() (*network.Manager, *network.Pool)
	AgentPath() string
	// CheckpointDir holds suspended sandboxes' memory images; "" refuses
	// suspending.
	CheckpointDir() string
}

// Service manages sandboxes.
//
// Lock order, first taken first:
//
//	a sandbox's lock (lock(id), held across a whole operation)
//	  the locks of sandboxes it is making (a fork's children, new IDs
//	  nobody else can know yet)
//	  a snapshot's lock (lock(snapshotLock(id)), for a create or restore
//	  from it)
//	    templates' tmplMu (in Release, Collect), pools' mu
//	mu, activityMu: leaves, held only to read or change their maps
//
// No lock of this package is taken under tmplMu or the pools' mu: those
// packages call back here (StartScratch, StartPooled, DiscardIf) with
// nothing held.
type Service struct {
	store store.Store
	// events takes the lifecycle events (events.go); nil: none.
	events Events
	// name is the node's (Config.Node.Name()); "" on a single machine.
	name   string
	placer Placer
	peers  Peers
	mover  Mover
	layers *layers.Store
	// vlayers give vaults' mounts as read-only layers (vaultlayers.go);
	// nil: mounts are clones unpacked into the writable layer.
	vlayers   VaultLayers
	runtimes  map[string]runtime.Runtime
	agentPath string
	defaults  Defaults
	log       *slog.Logger
	// unavailable is Config.Unavailable.
	unavailable map[string]string

	// locks serialise operations on one sandbox; mu guards the map, and
	// fenced: the sandboxes whose writes the cluster refused (or recorded
	// lost), which this node no longer acts on (cluster.go).
	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	fenced map[string]bool
	// relinquished is set by Relinquish: the node runs nothing more.
	relinquished atomic.Bool

	// tmpls keeps templates; it starts its build steps' scratch sandboxes
	// here (scratch.go).
	tmpls *templates.Service

	// activityMu guards activity: when each sandbox was last used, for
	// auto-stop. It is not durable: a restart counts as activity.
	activityMu sync.Mutex
	activity   map[string]time.Time
	// checkpointed is when each sandbox's last checkpoint was taken here,
	// and uploading which ones upload one (checkpoint.go), under
	// activityMu; uploads are the uploads in flight, which Run waits for.
	checkpointed map[string]time.Time
	uploading    map[string]bool
	uploads      sync.WaitGroup

	archive blob.Store
	// moving holds the progress of archives and restores in flight, by
	// sandbox ID, under activityMu.
	moving map[string]*counter

	// admit bounds the creates that start sandboxes.
	admit *admission
	// rates limits each tenant's creates (quota.go).
	rates *rates

	// pools keeps sandboxes started ahead of demand; it makes and
	// discards them here (pool.go, prestart.go).
	pools *pools.Service

	net     *network.Manager
	netPool *network.Pool
	// checkpoints is Config.CheckpointDir.
	checkpoints string
	// metrics samples running sandboxes (metrics.go).
	metrics *metrics.Sampler
	// meter meters the node's sandboxes' usage (usage.go); nil when
	// metering is off.
	meter *usage.Meter
}

// uidBase is the first host uid of sandbox ranges: far above the ids a host
// gives its users and subuid ranges, so sandbox root never owns a host file.
const (
	uidBase  = 1 << 27
	uidRange = 1 << 16
)

// New returns a Service; call Recover before serving requests.
func New(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &cfg.Defaults
	if d.Template == "" {
		d.Template = layers.HostTemplate
	}
	if d.Runtime == "" {
		d.Runtime = "ns"
	}
	if d.CPU == 0 {
		d.CPU = 1
	}
	if d.MemoryMiB == 0 {
		d.MemoryMiB = 1024
	}
	if d.DiskGiB == 0 {
		d.DiskGiB = 10
	}
	if d.PIDs == 0 {
		d.PIDs = 1024
	}
	if cfg.CreateConcurrency <= 0 {
		cfg.CreateConcurrency = defaultCreatesPerCPU * goruntime.NumCPU()
	}
	if cfg.CreateQueue <= 0 {
		cfg.CreateQueue = defaultCreateQueue
	}
	n := cfg.Node
	if n == nil {
		return nil, errors.New("control: no node to run sandboxes on")
	}
	netm, netPool := n.Network()
	s := &Service{
		admit:        newAdmission(cfg.CreateConcurrency, cfg.CreateQueue),
		rates:        newRates(cfg.Store, cfg.TakeCreates),
		store:        cfg.Store,
		events:       cfg.Events,
		name:         n.Name(),
		placer:       cfg.Placer,
		peers:        cfg.Peers,
		mover:        cfg.Mover,
		checkpointed: map[string]time.Time{},
		uploading:    map[string]bool{},
		fenced:       map[string]bool{},
		layers:       n.Layers(),
		runtimes:     n.Runtimes(),
		unavailable:  n.Unavailable(),
		agentPath:    n.AgentPath(),
		defaults:     cfg.Defaults,
		log:          cfg.Logger,
		locks:        map[string]*sync.Mutex{},
		archive:      cfg.Archive,
		activity:     map[string]time.Time{},
		moving:       map[string]*counter{},
		net:          netm,
		netPool:      netPool,
		checkpoints:  n.CheckpointDir(),
	}
	s.tmpls = templates.New(templates.Config{
		Store: cfg.Store, Layers: s.layers, Runtimes: s.runtimes,
		Defaults: templates.Defaults{Runtime: cfg.Defaults.Runtime}, Sandboxes: s, Logger: cfg.Logger,
		Blobs: s.layerBlobs(), Pins: cfg.BlobPins,
	})
	prestart := cfg.Prestart
	if _, ok := s.runtimes[d.Runtime].(runtime.Preparer); !ok {
		prestart = 0
	}
	s.pools = s.newPools(pools.Config{
		Store: cfg.Store, Templates: s.tmpls, Sandboxes: s,
		DefaultTemplate: d.Template, WarmPool: cfg.WarmPool, Prestart: prestart, Node: n.Name(), Logger: cfg.Logger,
		BuiltIn: layers.HostTemplate,
	}, cfg.Demand, cfg.Capacity)
	s.metrics = metrics.New(metrics.Config{Source: meterSource{s}, Interval: cfg.MetricsInterval, Logger: cfg.Logger})
	if !cfg.NoUsage {
		s.meter = usage.New(usage.Config{Source: &usageSource{s: s}, Store: cfg.Store, Node: s.name,
			Interval: cfg.UsageInterval, Logger: cfg.Logger})
	}
	if s.runtimes[d.Runtime] == nil {
		return nil, fmt.Errorf("default runtime %q is not available", d.Runtime)
	}
	return s, nil
}

// Run keeps the warm pool filled and watches running sandboxes until ctx
// ends, so that one whose init dies on its own (e.g. killed by the OOM killer)
// is recorded as stopped.
func (s *Service) Run(ctx context.Context) {
	defer s.uploads.Wait()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.metrics.Run(ctx)
	}()
	if s.meter != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.meter.Run(ctx)
		}()
	}
	go func() {
		defer wg.Done()
		s.pools.Run(ctx)
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	if s.name != "" {
		s.tmpls.Refresh(ctx)
	}
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.relinquished.Load() {
				continue
			}
			// A cluster node reports the versions whose layers it holds,
			// and drops those no version uses any more.
			if s.name != "" && tick%heldEvery == 0 {
				s.tmpls.Refresh(ctx)
			}
			sbs, err := s.store.ListNode(ctx, s.name)
			if err != nil {
				continue
			}
			s.relinquishLost(ctx, sbs)
			s.reapDead(ctx, sbs)
			s.applyPolicies(ctx, sbs)
			s.sweepPlaced(ctx, sbs)
		}
	}
}

// heldEvery is how many ticks of Run pass between refreshes of the
// template versions a cluster node holds.
const heldEvery = 5

// layerBlobs is the object store template layers are shared through: the
// archive store, on a cluster node only. A single machine keeps its layers
// where it made them.
func (s *Service) layerBlobs() blob.Store {
	if s.name == "" || s.archive == nil {
		return nil
	}
	return s.archive
}

// reapDead records stopped the sandboxes of sbs (this node's) whose init
// died on its own.
func (s *Service) reapDead(ctx context.Context, sbs []store.Sandbox) {
	for _, sb := range sbs {
		if !lifecycle.Live(sb.State) || s.isFenced(sb.ID) {
			continue
		}
		rt := s.runtimes[sb.Runtime]
		if rt == nil || rt.Alive(instance(sb)) {
			continue
		}
		unlock := s.lock(sb.ID)
		cur, err := s.store.Get(ctx, sb.ID)
		if err == nil && cur.Node == s.name && lifecycle.Live(cur.State) && !rt.Alive(instance(cur)) {
			s.log.Warn("sandbox init exited; marking stopped", "sandbox", cur.ID)
			_ = s.stopLocked(ctx, &cur, "init exited")
		}
		unlock()
	}
}

func (s *Service) lock(id string) func() {
	l := s.mutex(id)
	l.Lock()
	return l.Unlock
}

func (s *Service) mutex(id string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	return l
}

// ms is the time since t0 in fractional milliseconds, for logs.
func ms(t0 time.Time) float64 { return float64(time.Since(t0).Microseconds()) / 1000 }

func instance(sb store.Sandbox) runtime.Instance {
	return runtime.Instance{PID: sb.PID, StartTime: sb.StartTime, Socket: sb.Socket}
}

func (s *Service) validate(req *api.CreateSandboxRequest) error {
	d := s.defaults
	if req.Template == "" {
		req.Template = d.Template
	}
	if req.Runtime == "" {
		req.Runtime = d.Runtime
	}
	if req.CPU == 0 {
		req.CPU = d.CPU
	}
	if req.MemoryMiB == 0 {
		req.MemoryMiB = d.MemoryMiB
	}
	if req.DiskGiB == 0 {
		req.DiskGiB = d.DiskGiB
	}
	if req.PIDs == 0 {
		req.PIDs = d.PIDs
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalid}, args...)...)
	}
	if why, ok := s.unavailable[req.Runtime]; ok && s.runtimes[req.Runtime] == nil {
		return fmt.Errorf("%w: runtime %s is not available on this server: %s", errdefs.ErrUnavailable, req.Runtime, why)
	}
	switch {
	case s.runtimes[req.Runtime] == nil:
		return bad("unknown runtime %q", truncate(req.Runtime, 32))
	case req.CPU < 0.01 || req.CPU > float64(goruntime.NumCPU()):
		return bad("cpu must be between 0.01 and %d cores", goruntime.NumCPU())
	case req.MemoryMiB < 32 || req.MemoryMiB > 1<<20:
		return bad("memory_mib must be between 32 and 1048576")
	case req.DiskGiB < 1 || req.DiskGiB > 1<<14:
		return bad("disk_gib must be between 1 and 16384")
	case req.PIDs < 16 || req.PIDs > 1<<22:
		return bad("pids must be between 16 and 4194304")
	case len(req.Env) > 1024:
		return bad("at most 1024 environment variables")
	case len(req.Labels) > 64:
		return bad("at most 64 labels")
	case req.TimeoutSec < 0 || req.TimeoutSec > maxPolicySec:
		return bad("timeout_sec must be between 0 and %d", maxPolicySec)
	case req.AutoDeleteSec < 0 || req.AutoDeleteSec > maxPolicySec:
		return bad("auto_delete_sec must be between 0 and %d", maxPolicySec)
	case req.AutoStopSec < 0 || req.AutoStopSec > maxPolicySec:
		return bad("auto_stop_sec must be between 0 and %d", maxPolicySec)
	case req.AutoArchiveSec < 0 || req.AutoArchiveSec > maxPolicySec:
		return bad("auto_archive_sec must be between 0 and %d", maxPolicySec)
	case req.AutoArchiveSec > 0 && s.archive == nil:
		return fmt.Errorf("%w: this server has no archive store for auto_archive_sec", errdefs.ErrUnavailable)
	case req.CheckpointEverySec < 0 || req.CheckpointEverySec > maxPolicySec:
		return bad("checkpoint_every_sec must be between 0 and %d", maxPolicySec)
	case req.CheckpointEverySec > 0 && s.archive == nil:
		return fmt.Errorf("%w: this server has no archive store for checkpoint_every_sec", errdefs.ErrUnavailable)
	}
	if _, err := s.checkPolicy(req.Runtime, req.Network); err != nil {
		return err
	}
	// Vaults: their names and paths here (the server clones them once the
	// sandbox runs); a vault that does not exist fails the create there.
	var err error
	if req.Vaults, err = vault.CheckMounts(req.Vaults); err != nil {
		return err
	}
	if len(req.Vaults) == 0 {
		req.Vaults = nil
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(k)+len(v) > 128<<10 {
			return bad("invalid environment variable %q", truncate(k, 64))
		}
	}
	for k, v := range req.Labels {
		if !validLabelKey(k) || len(v) > 256 || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return bad("invalid label %q: keys are 1-63 of [A-Za-z0-9._/-], values at most 256 bytes", truncate(k, 64))
		}
	}
	return s.validatePlacement(req)
}

// validatePlacement checks what a create asks of its placement. Node
// labels are at most 63 bytes each (--node-label), so a longer key or value
// could never match.
func (s *Service) validatePlacement(req *api.CreateSandboxRequest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalid}, args...)...)
	}
	if len(req.NodeSelector) > 0 && s.placer == nil {
		// The one node of a single machine carries no labels: a
		// selector could only fail, and failing as "no room" would
		// mislead.
		return bad("node_selector needs cluster mode: this server is a single machine, whose one node carries no labels")
	}
	if len(req.NodeSelector) > 16 {
		return bad("at most 16 node_selector labels")
	}
	for k, v := range req.NodeSelector {
		if !validLabelKey(k) || len(v) > 63 || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return bad("invalid node_selector %q: keys are 1-63 of [A-Za-z0-9._/-], values at most 63 bytes", truncate(k, 64))
		}
	}
	if req.Spread != "" && !validLabelKey(req.Spread) {
		return bad("invalid spread %q: a node label key, 1-63 of [A-Za-z0-9._/-]", truncate(req.Spread, 64))
	}
	return nil
}

func validLabelKey(k string) bool {
	if k == "" || len(k) > 63 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._/-", c)) {
			return false
		}
	}
	return true
}

// create makes a sandbox and returns once its agent answers.
func (s *Service) create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	var snap store.Snapshot
	if req.Snapshot != "" {
		if err := checkID(req.Snapshot); err != nil {
			return api.Sandbox{}, err
		}
		var err error
		if snap, err = s.snapshot(ctx, req.Snapshot); err != nil {
			return api.Sandbox{}, err
		}
		if name, _, _ := strings.Cut(req.Template, "@"); req.Template != "" && name != snap.Template {
			return api.Sandbox{}, fmt.Errorf("%w: snapshot %s is of template %s, not %s", errdefs.ErrInvalid, snap.ID, snap.Template, truncate(req.Template, 64))
		}
		req.Template = snap.Template
	}
	if err := s.validate(&req); err != nil {
		return api.Sandbox{}, err
	}
	if err := s.limitCreates(ctx, 1); err != nil {
		return api.Sandbox{}, err
	}
	if err := s.admitWarm(ctx, req); err != nil {
		return api.Sandbox{}, err
	}
	// A sandbox from a snapshot has the snapshot's version, which the
	// snapshot holds; otherwise the version the request names.
	var v store.Template
	var err error
	if req.Snapshot != "" && snap.TemplateVersion != "" {
		v, err = s.store.TemplateVersion(ctx, snap.TemplateVersion)
	} else if req.Snapshot == "" {
		req.Template, v, err = s.tmpls.Resolve(ctx, req.Template)
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	// The node that runs the sandbox stacks its template: here, unless
	// a placer may send it elsewhere (RunPlaced stacks it there). A
	// create from a snapshot is placed too, where its files are
	// (snapshotsplace.go).
	placed := s.placer != nil
	snapNode := ""
	if placed && req.Snapshot != "" {
		if snapNode, err = s.snapshotNode(ctx, snap); err != nil {
			return api.Sandbox{}, err
		}
	}
	var tmpl layers.Template
	if !placed {
		if tmpl, err = s.tmpls.Stack(ctx, v); err != nil {
			return api.Sandbox{}, err
		}
	}
	policy, err := s.checkPolicy(req.Runtime, req.Network)
	if err != nil {
		return api.Sandbox{}, err
	}
	// A warm sandbox waits on this node. In a cluster the scheduler
	// decides which node's warm sandbox a create takes, if any
	// (runWarm).
	if req.Snapshot == "" && !placed {
		if sb, ok := s.takePooled(context.WithoutCancel(ctx), pools.Key(req.Template, v), req, policy); ok {
			return sb, nil
		}
	}
	sb := store.Sandbox{Sandbox: api.Sandbox{
		State: api.StateCreating, Template: req.Template, TemplateVersion: v.ID, Runtime: req.Runtime,
		CPU: req.CPU, MemoryMiB: req.MemoryMiB, DiskGiB: req.DiskGiB, PIDs: req.PIDs,
		Env: req.Env, Labels: req.Labels, CreatedAt: time.Now().UTC(),
		Ephemeral: req.Ephemeral, AutoDeleteSec: req.AutoDeleteSec, AutoStopSec: req.AutoStopSec,
		AutoArchiveSec: req.AutoArchiveSec, AutoResume: req.AutoResume, Ports: portAccess(req.Ports),
		CheckpointEverySec: req.CheckpointEverySec, Vaults: req.Vaults,
	}, TimeoutSec: req.TimeoutSec, FromSnapshot: req.Snapshot, Policy: policy, Tenant: tenant.Of(ctx)}
	// In a cluster a new sandbox goes where the placer says.
	if placed {
		return s.createPlaced(ctx, sb, req, snapNode)
	}
	if err := s.usable(); err != nil {
		return api.Sandbox{}, err
	}
	leave, err := s.admit.enter(ctx)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer leave()
	sb.CreatedAt = time.Now().UTC()
	// The work goes on if the client hangs up: a half-made sandbox would be
	// worse than an unwanted whole one, which the client can delete.
	ctx = context.WithoutCancel(ctx)
	t0 := time.Now()
	unlock, err := s.newSandbox(ctx, &sb)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	s.log.Debug("recorded", "sandbox", sb.ID, "op", "create", "ms", ms(t0))
	if _, err := s.startCreated(ctx, &sb, tmpl, snap); err != nil {
		return api.Sandbox{}, err
	}
	s.log.Debug("created", "sandbox", sb.ID, "op", "create", "ms", ms(t0))
	return s.view(sb), nil
}

// startCreated starts sb, recorded in state creating (from snap's files if
// snap has an ID), and records it running; if that fails, it is discarded.
// The caller holds its lock. pull is the fetch of an archived snapshot a
// cluster node made for it (withSnapshot), if any.
func (s *Service) startCreated(ctx context.Context, sb *store.Sandbox, tmpl layers.Template, snap store.Snapshot) (*api.SnapshotPull, error) {
	var pull *api.SnapshotPull
	if snap.ID != "" {
		var err error
		pull, err = s.withSnapshot(ctx, snap.ID, func() error {
			_, err := s.layers.WritableFromSnapshot(snap.ID, sb.ID, sb.DiskGiB<<30)
			return err
		})
		if err != nil {
			s.discard(ctx, *sb)
			return nil, err
		}
	}
	if snap.ID == "" {
		if err := s.planVaultLayers(ctx, sb, tmpl); err != nil {
			s.discard(ctx, *sb)
			return nil, err
		}
	}
	if err := s.startLocked(ctx, sb, tmpl, api.StateCreating, api.StateRunning, 0); err != nil {
		s.discard(ctx, *sb)
		return nil, err
	}
	return pull, nil
}

// startLocked starts sb (in state from) and records it in state to. The
// caller holds its lock.
func (s *Service) startLocked(ctx context.Context, sb *store.Sandbox, tmpl layers.Template, from, to string, weight uint64) error {
	if err := s.run(ctx, sb, tmpl, to, weight); err != nil {
		return err
	}
	if err := s.setState(ctx, sb, from); err != nil {
		_ = s.runtimes[sb.Runtime].Stop(ctx, sb.ID, instance(*sb))
		s.releaseNetwork(ctx, *sb)
		return err
	}
	return nil
}

// run starts sb and sets its fields for state to, without recording them:
// the caller does, and stops it (and releases its network) if that fails.
func (s *Service) run(ctx context.Context, sb *store.Sandbox, tmpl layers.Template, to string, weight uint64) (err error) {
	rt := s.runtimes[sb.Runtime]
	t0 := time.Now()
	netw, err := s.attachNetwork(ctx, *sb)
	if err != nil {
		s.log.Error("attaching network", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: giving the sandbox its network failed", errdefs.ErrUnavailable)
	}
	defer func() {
		if err != nil {
			s.releaseNetwork(ctx, *sb)
		}
	}()
	spec, err := s.spec(ctx, *sb, tmpl, netw, weight)
	if err != nil {
		return err
	}
	s.log.Debug("writable layer ready", "sandbox", sb.ID, "op", "start", "ms", ms(t0))
	inst, err := rt.Start(ctx, spec)
	s.log.Debug("runtime started", "sandbox", sb.ID, "op", "start", "ms", ms(t0))
	if err != nil {
		s.log.Error("starting sandbox", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: starting sandbox failed", errdefs.ErrUnavailable)
	}
	if err := s.startCommands(ctx, inst.Socket, tmpl); err != nil {
		_ = rt.Stop(ctx, sb.ID, inst)
		return err
	}
	now := time.Now().UTC()
	sb.State, sb.Error = to, ""
	sb.StartedAt, sb.StoppedAt = &now, nil
	s.touch(sb.ID)
	s.setTimeout(sb, now)
	sb.PID, sb.StartTime, sb.Socket = inst.PID, inst.StartTime, inst.Socket
	return nil
}

// setTimeout sets when sb's timeout stops it, counted from now.
func (s *Service) setTimeout(sb *store.Sandbox, now time.Time) {
	sb.ExpiresAt = nil
	if sb.TimeoutSec > 0 {
		exp := now.Add(time.Duration(sb.TimeoutSec) * time.Second)
		sb.ExpiresAt = &exp
	}
}

// spec is what sb's runtime needs to start it, over its writable layer
// (made if it has none).
func (s *Service) spec(ctx context.Context, sb store.Sandbox, tmpl layers.Template, netw *runtime.Network, weight uint64) (runtime.Spec, error) {
	writable, err := s.layers.CreateWritable(sb.ID, sb.DiskGiB<<30)
	if err != nil {
		return runtime.Spec{}, fmt.Errorf("preparing writable layer: %w", err)
	}
	lower, err := s.vaultLayers(ctx, sb, writable, tmpl.Layers)
	if err != nil {
		return runtime.Spec{}, err
	}
	env := map[string]string{}
	for k, v := range tmpl.Env {
		env[k] = v
	}
	for k, v := range sb.Env {
		env[k] = v
	}
	return runtime.Spec{
		ID:        sb.ID,
		Hostname:  sb.ID,
		Rootfs:    runtime.Rootfs{Layers: lower, Writable: writable, Binds: tmpl.Binds},
		Limits:    runtime.Limits{CPU: sb.CPU, MemoryBytes: sb.MemoryMiB << 20, PIDs: sb.PIDs, CPUWeight: weight},
		IDMap:     idMap(sb.Slot),
		Env:       env,
		User:      tmpl.User,
		Workdir:   tmpl.Workdir,
		Setuid:    tmpl.Setuid,
		AgentPath: s.agentPath,
		Network:   netw,
	}, nil
}

// readyTimeout bounds how long a template's ready command may take to pass.
const readyTimeout = 60 * time.Second

// startCommands runs a template's start command in the background and waits
// for its ready command to exit 0, polling, before a sandbox counts as up.
func (s *Service) startCommands(ctx context.Context, sock string, tmpl layers.Template) error {
	if tmpl.StartCmd == "" && tmpl.ReadyCmd == "" {
		return nil
	}
	c := s.agentClient(sock)
	if tmpl.StartCmd != "" {
		if _, err := c.Start(ctx, api.ExecRequest{Shell: tmpl.StartCmd, Background: true, Tag: "start"}); err != nil {
			return fmt.Errorf("%w: the template's start command: %v", errdefs.ErrUnavailable, err)
		}
	}
	if tmpl.ReadyCmd == "" {
		return nil
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		res, err := c.Exec(ctx, api.ExecRequest{Shell: tmpl.ReadyCmd, TimeoutMs: 10000})
		if err == nil && res.ExitCode == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the template's ready command did not succeed within %v", errdefs.ErrUnavailable, readyTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// discard removes every trace of a sandbox whose creation failed.
func (s *Service) discard(ctx context.Context, sb store.Sandbox) {
	if rt := s.runtimes[sb.Runtime]; rt != nil {
		if err := rt.Cleanup(ctx, sb.ID); err != nil {
			s.log.Error("cleaning up sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	s.releaseNetwork(ctx, sb)
	if err := s.layers.RemoveWritable(sb.ID); err != nil {
		s.log.Error("removing writable layer", "sandbox", sb.ID, "err", err)
	}
	if err := s.removeRecord(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Error("deleting sandbox record", "sandbox", sb.ID, "err", err)
		return
	}
	s.tmpls.Release(ctx, sb.TemplateVersion)
}

// Get returns one sandbox.
func (s *Service) Get(ctx context.Context, id string) (api.Sandbox, error) {
	sb, err := s.get(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	s.touch(id)
	sb.Progress = s.progress(id)
	return s.view(sb), nil
}

// get reads a sandbox the API may show to the tenant of ctx: another
// tenant's is not found, as one that does not exist; a malformed ID is
// invalid.
func (s *Service) get(ctx context.Context, id string) (store.Sandbox, error) {
	if err := checkID(id); err != nil {
		return store.Sandbox{}, err
	}
	sb, err := s.store.Get(ctx, id)
	if err == nil && (hidden(sb) || !tenant.Sees(ctx, sb.Tenant)) {
		return store.Sandbox{}, notFound(id)
	}
	return sb, err
}

// snapshot reads a snapshot the tenant of ctx owns; a malformed ID is
// invalid.
func (s *Service) snapshot(ctx context.Context, id string) (store.Snapshot, error) {
	if err := checkID(id); err != nil {
		return store.Snapshot{}, err
	}
	sn, err := s.store.GetSnapshot(ctx, id)
	if err == nil && !tenant.Sees(ctx, sn.Tenant) {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return sn, err
}

// List returns sandboxes in state (any if empty) carrying all of labels.
func (s *Service) List(ctx context.Context, state string, labels map[string]string) ([]api.Sandbox, error) {
	sbs, err := s.store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Sandbox{}
next:
	for _, sb := range sbs {
		if hidden(sb) || !tenant.Sees(ctx, sb.Tenant) || state != "" && sb.State != state {
			continue
		}
		for k, v := range labels {
			if got, ok := sb.Labels[k]; !ok || got != v {
				continue next
			}
		}
		sb.Progress = s.progress(sb.ID)
		out = append(out, s.view(sb))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Stop ends a running sandbox's processes and keeps its files.
func (s *Service) Stop(ctx context.Context, id string) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "stop")
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	if sb.State == api.StateShelved {
		// Nothing runs: only the record changes.
		now := time.Now().UTC()
		sb.State, sb.StoppedAt = api.StateStopped, &now
		if err := s.setState(ctx, &sb, api.StateShelved); err != nil {
			return api.Sandbox{}, err
		}
	} else if err := s.stopLocked(ctx, &sb, ""); err != nil {
		return api.Sandbox{}, err
	}
	if sb.Ephemeral {
		if err := s.deleteLocked(ctx, sb); err != nil {
			return api.Sandbox{}, err
		}
		sb.State = api.StateDeleted
	}
	return s.view(sb), nil
}

func (s *Service) stopLocked(ctx context.Context, sb *store.Sandbox, reason string) error {
	if err := s.haltLocked(ctx, sb, reason); err != nil {
		return err
	}
	// A checkpointing sandbox's last checkpoint is of its files as it
	// stopped: if its node is lost, it is restored with all of them.
	if sb.CheckpointEverySec > 0 && !sb.Ephemeral && s.archive != nil && s.name != "" {
		if err := s.checkpoint(ctx, sb); err != nil {
			s.log.Error("checkpoint at stop", "sandbox", sb.ID, "err", err)
		}
	}
	return nil
}

// haltLocked is stopLocked without the checkpoint at stop, for a move,
// which archives the files at once: the archive is then their copy in
// object storage, and a node lost while it is written loses no more than
// one lost while the checkpoint was.
func (s *Service) haltLocked(ctx context.Context, sb *store.Sandbox, reason string) error {
	from := sb.State
	sb.State = api.StateStopping
	if err := s.setState(ctx, sb, from); err != nil {
		return err
	}
	if err := s.endLocked(ctx, sb, "stopping"); err != nil {
		return err
	}
	if err := s.discardImage(*sb); err != nil {
		s.log.Error("stopping sandbox", "sandbox", sb.ID, "err", err)
	}
	now := time.Now().UTC()
	sb.State, sb.Error, sb.StoppedAt = api.StateStopped, reason, &now
	sb.PID, sb.StartTime, sb.Socket = 0, 0, ""
	sb.ExpiresAt = nil
	return s.setState(ctx, sb, api.StateStopping)
}

// endLocked ends sb's processes and gives back its network, for an
// operation (doing: "stopping", "shelving") that has recorded sb in the
// state it is in; if they do not end, sb is recorded as error, to be
// deleted.
func (s *Service) endLocked(ctx context.Context, sb *store.Sandbox, doing string) error {
	s.finalUsage(ctx, *sb)
	if err := s.runtimes[sb.Runtime].Stop(ctx, sb.ID, instance(*sb)); err != nil {
		s.log.Error(doing+" sandbox", "sandbox", sb.ID, "err", err)
		from := sb.State
		sb.State, sb.Error = api.StateError, doing+" failed; delete it"
		_ = s.setState(ctx, sb, from)
		return fmt.Errorf("%w: %s sandbox failed", errdefs.ErrUnavailable, doing)
	}
	s.releaseNetwork(ctx, *sb)
	return nil
}

// start runs a stopped sandbox again over the files it left.
func (s *Service) start(ctx context.Context, id string) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	// A lost sandbox is no node's: whichever node is asked restores it
	// (move.go).
	if sb, err := s.get(ctx, id); err == nil && sb.State == api.StateLost && sb.Node != s.name {
		return s.restoreLost(ctx, sb)
	}
	sb, unlock, err := s.acquire(ctx, id, "start")
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	if sb.State == api.StateArchived {
		if err := s.unarchiveLocked(ctx, &sb); err != nil {
			return api.Sandbox{}, err
		}
	}
	if err := s.restartLocked(ctx, &sb); err != nil {
		return api.Sandbox{}, err
	}
	return s.view(sb), nil
}

// restartLocked starts stopped sb over its files, through starting; if that
// fails, it is stopped again. The caller holds its lock.
func (s *Service) restartLocked(ctx context.Context, sb *store.Sandbox) error {
	tmpl, err := s.tmpls.SandboxStack(ctx, *sb)
	if err != nil {
		return err
	}
	sb.State = api.StateStarting
	if err := s.setState(ctx, sb, api.StateStopped); err != nil {
		return err
	}
	if err := s.startLocked(ctx, sb, tmpl, api.StateStarting, api.StateRunning, 0); err != nil {
		_ = s.runtimes[sb.Runtime].Cleanup(ctx, sb.ID)
		sb.State = api.StateStopped
		_ = s.setState(ctx, sb, api.StateStarting)
		return err
	}
	return nil
}

// Delete removes a sandbox and everything it holds.
func (s *Service) Delete(ctx context.Context, id string) error {
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "")
	if err != nil {
		// A lost sandbox of another node (acquire refuses it): this node
		// deletes it in that one's stead.
		if sb.ID == id && sb.State == api.StateLost && sb.Node != s.name {
			return s.deleteLost(ctx, sb)
		}
		return err
	}
	defer unlock()
	if err := s.deleteLocked(ctx, sb); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.locks, id)
	s.mu.Unlock()
	s.activityMu.Lock()
	delete(s.activity, id)
	s.activityMu.Unlock()
	s.metrics.Forget(id)
	return nil
}

func (s *Service) deleteLocked(ctx context.Context, sb store.Sandbox) error {
	from := sb.State
	sb.State = api.StateDeleting
	if err := s.setState(ctx, &sb, from); err != nil {
		return err
	}
	rt := s.runtimes[sb.Runtime]
	if rt != nil {
		s.finalUsage(ctx, sb)
		if err := rt.Stop(ctx, sb.ID, instance(sb)); err != nil {
			s.log.Error("stopping sandbox for delete", "sandbox", sb.ID, "err", err)
			return fmt.Errorf("%w: deleting sandbox failed; try again", errdefs.ErrUnavailable)
		}
	}
	s.releaseNetwork(ctx, sb)
	if err := s.discardImage(sb); err != nil {
		s.log.Error("deleting sandbox", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: deleting sandbox failed; try again", errdefs.ErrUnavailable)
	}
	// Once Stop ended every process of the sandbox, its layer may be reused.
	remove := s.layers.RemoveWritable
	if rt != nil {
		remove = s.layers.RecycleWritable
	}
	if err := remove(sb.ID); err != nil {
		s.log.Error("removing writable layer", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: deleting sandbox failed; try again", errdefs.ErrUnavailable)
	}
	if s.archive != nil {
		if err := s.archive.Delete(ctx, archiveKey(sb.ID)); err != nil && !isNotExist(err) {
			s.log.Error("removing archive", "sandbox", sb.ID, "err", err)
			return fmt.Errorf("%w: deleting sandbox failed; try again", errdefs.ErrUnavailable)
		}
		if err := s.removeCheckpoints(ctx, sb.ID); err != nil {
			s.log.Error("removing checkpoints", "sandbox", sb.ID, "err", err)
			return fmt.Errorf("%w: deleting sandbox failed; try again", errdefs.ErrUnavailable)
		}
	}
	if err := s.removeRecord(ctx, sb.ID); err != nil {
		return err
	}
	s.tmpls.Release(ctx, sb.TemplateVersion)
	return nil
}

// AgentDialer returns how to reach the agent of a running sandbox (an
// auto-resume one is woken first).
func (s *Service) AgentDialer(ctx context.Context, id string) (func(ctx context.Context) (net.Conn, error), error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb, err := s.forTraffic(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != api.StateRunning {
		return nil, fmt.Errorf("%w: sandbox %s is %s, not running", errdefs.ErrConflict, id, sb.State)
	}
	s.touch(id)
	sock := sb.Socket
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, nil
}

// Recover reconciles the store with what the host runs, at start-up: running
// sandboxes whose init lives on are re-adopted, those that died are stopped,
// operations a crash cut short are finished or undone, and leftovers that no
// record owns are removed.
func (s *Service) Recover(ctx context.Context) error {
	sbs, err := s.store.ListNode(ctx, s.name)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, sb := range sbs {
		known[sb.ID] = true
		if s.name != "" && sb.State == api.StateCreating && time.Since(sb.CreatedAt) < placedTTL {
			// Maybe placed here by another node and about to be run
			// (RunPlaced); if not, the placed-row sweep discards it.
			continue
		}
		rt := s.runtimes[sb.Runtime]
		if rt == nil {
			// From the states RuntimeGone lists; a sandbox in another
			// (archived, already error) stays as it is.
			sb.State, sb.Error = api.StateError, "runtime "+sb.Runtime+" is not available"
			_ = s.setState(ctx, &sb, lifecycle.RuntimeGone...)
			continue
		}
		st, ok := lifecycle.Lookup(sb.State)
		if !ok {
			s.log.Warn("sandbox in a state this server does not know", "sandbox", sb.ID, "state", sb.State)
			continue
		}
		recoveries[st.Recover](s, ctx, sb, rt)
	}
	s.removeForkImages()
	if err := s.recoverNetworks(ctx); err != nil {
		return err
	}
	if err := s.recoverSnapshots(ctx, known); err != nil {
		return err
	}
	// Snapshots taken just before a crash, never recorded.
	snaps, err := s.layers.SnapshotIDs()
	if err != nil {
		return err
	}
	for _, id := range snaps {
		if _, err := s.store.GetSnapshot(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			s.log.Info("removing snapshot no record names", "snapshot", id)
			_ = s.layers.RemoveSnapshot(id)
		}
	}
	ids, err := s.layers.WritableIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if known[id] {
			continue
		}
		s.log.Info("removing writable layer no sandbox owns", "sandbox", id)
		for _, rt := range s.runtimes {
			_ = rt.Cleanup(ctx, id)
		}
		if err := s.layers.RemoveWritable(id); err != nil {
			s.log.Error("removing orphaned writable layer", "sandbox", id, "err", err)
		}
	}
	// Versions whose last sandbox the sweep above removed, and the layers
	// and uploads of imports and builds a crash cut short (recorded by no
	// version).
	uploads, _ := filepath.Glob(filepath.Join(s.layers.Dir(), ".upload-*.tar"))
	for _, u := range uploads {
		_ = os.Remove(u)
	}
	s.tmpls.Collect(ctx)
	return nil
}

// recoveries is how Recover settles a sandbox found in a state at
// start-up; lifecycle.States says which applies to each state.
var recoveries = map[lifecycle.Recovery]func(s *Service, ctx context.Context, sb store.Sandbox, rt runtime.Runtime){
	lifecycle.Discard: func(s *Service, ctx context.Context, sb store.Sandbox, _ runtime.Runtime) {
		s.log.Info("removing sandbox whose creation was interrupted", "sandbox", sb.ID)
		s.discard(ctx, sb)
	},
	lifecycle.FinishDelete: func(s *Service, ctx context.Context, sb store.Sandbox, _ runtime.Runtime) {
		s.log.Info("finishing interrupted delete", "sandbox", sb.ID)
		if err := s.deleteLocked(ctx, sb); err != nil {
			s.log.Error("finishing delete", "sandbox", sb.ID, "err", err)
		}
	},
	lifecycle.FinishStopped: func(s *Service, ctx context.Context, sb store.Sandbox, _ runtime.Runtime) {
		s.log.Info("finishing interrupted start/stop as stopped", "sandbox", sb.ID)
		_ = s.stopLocked(ctx, &sb, "")
	},
	lifecycle.Readopt:       (*Service).readopt,
	lifecycle.SettleSuspend: (*Service).recoverSuspend,
	lifecycle.Cleanup: func(_ *Service, ctx context.Context, sb store.Sandbox, rt runtime.Runtime) {
		// Nothing runs; make sure nothing is left from a crash (a shelve
		// or a boot of a shelved sandbox cut short).
		_ = rt.Cleanup(ctx, sb.ID)
	},
	lifecycle.SettleArchive: func(s *Service, ctx context.Context, sb store.Sandbox, _ runtime.Runtime) {
		s.recoverArchiving(ctx, sb)
	},
	lifecycle.Relinquish: func(_ *Service, ctx context.Context, sb store.Sandbox, rt runtime.Runtime) {
		// The cluster fenced this node and restores the sandbox
		// elsewhere: nothing of it may go on running here.
		_ = rt.Cleanup(ctx, sb.ID)
	},
	lifecycle.DropRestore: func(s *Service, _ context.Context, sb store.Sandbox, _ runtime.Runtime) {
		// A restore from the archive that a crash cut short.
		if s.layers.WritableExists(sb.ID) {
			_ = s.layers.RemoveWritable(sb.ID)
		}
	},
}

// readopt takes back running or paused sb if its init lives on, and
// records it stopped if it died while the server was down.
func (s *Service) readopt(ctx context.Context, sb store.Sandbox, rt runtime.Runtime) {
	if rt.Alive(instance(sb)) {
		// The record says whether it is frozen: a snapshot or fork that
		// the crash cut short left it frozen, and a pause or resume may
		// have reached the freezer but not the record.
		settle := rt.Resume
		if sb.State == api.StatePaused {
			settle = rt.Pause
		}
		if err := settle(ctx, sb.ID); err != nil {
			s.log.Error("setting the freezer of a re-adopted sandbox", "sandbox", sb.ID, "state", sb.State, "err", err)
		}
		s.log.Info("re-adopted running sandbox", "sandbox", sb.ID, "pid", sb.PID)
		return
	}
	s.log.Warn("sandbox stopped while the server was down", "sandbox", sb.ID)
	_ = s.stopLocked(ctx, &sb, "stopped while the server was down")
}
