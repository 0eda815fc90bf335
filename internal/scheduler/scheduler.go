package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// Config configures a Scheduler; the zero value of each field but Store is
// its documented default.
type Config struct {
	// Store is the cluster's store: its Nodes are the view ranked, its
	// Place the one arbiter of room.
	Store store.Cluster
	// Refresh is how often the view of the nodes is read again (1 s). It
	// is read sooner after the store refuses a placement. A read is a
	// row a node (store.Nodes; PostgreSQL keeps each node's sums): ~2 ms
	// of PostgreSQL's time at 1,000 nodes, measured, where summing the
	// sandbox rows had cost 30–40 ms at 50,000 sandboxes. Between reads a scheduler
	// counts its own placements, and expects the other API nodes' (see
	// options.others), so a second-old view places well enough.
	Refresh time.Duration
	// Batch is the most placements recorded in one store.Place (64), and
	// Wait how long the first placement of a batch waits for others to
	// join it (1 ms): one transaction per batch is what makes a burst
	// fast.
	Batch int
	Wait  time.Duration
	// Inflight is how many batches may be in the store at once (2): while
	// one commits, the next is ranked.
	Inflight int
	// Keep is how many candidates a Decision lists (8).
	Keep int
	// Share is how many placements of a batch share a draw among the
	// nodes (8; see Request.Draw): they go to the two nodes drawn, so a
	// batch of 64 locks about 16 node rows, not 64. Two batches of 64
	// nodes out of 1,000 nearly always share one, and wait for each
	// other; of 16, one time in five. 1 draws for each placement.
	Share int
	// Logger; nil is slog.Default().
	Logger *slog.Logger
}

// Scheduler places sandboxes. It keeps a view of the cluster's nodes,
// refreshed every Config.Refresh, adds to it what it places itself (so that
// concurrent placements in one process do not all pick one node), and
// records placements through store.Place in batches. The store decides:
// a placement it refuses (the node filled up meanwhile, through another
// API node) is ranked again without that node, in the next batch.
//
// One goroutine (loop) owns the view and every job; store calls run beside
// it and report back to it.
type Scheduler struct {
	cfg    Config
	log    *slog.Logger
	jobs   chan *job
	ctx    context.Context // the scheduler's life: its store calls
	cancel context.CancelFunc
	done   chan struct{} // closed when loop has returned
	stats  struct {
		placed, refused, noWarm, full, batches, refreshes atomic.Int64
		others                                            atomic.Uint64 // math.Float64bits
	}
}

// Stats are a scheduler's counts since New.
type Stats struct {
	Placed  int64 `json:"placed"`  // placements recorded
	Refused int64 `json:"refused"` // placements the store refused for room, each tried again elsewhere
	Full    int64 `json:"full"`    // placements no node could take (NoRoomError)
	// NoWarm are warm placements the store refused (another API node
	// had taken the node's last warm sandbox), each placed again.
	NoWarm int64 `json:"no_warm"`
	// Batches are the store.Place calls; Placed+Refused over Batches is
	// their mean size.
	Batches   int64 `json:"batches"`
	Refreshes int64 `json:"refreshes"` // reads of the nodes
	// Others is how many times as many placements as this scheduler's the
	// other API nodes made, as the last reads showed.
	Others float64 `json:"others"`
}

// Stats returns the scheduler's counts.
func (s *Scheduler) Stats() Stats {
	return Stats{Placed: s.stats.placed.Load(), Refused: s.stats.refused.Load(), Full: s.stats.full.Load(), NoWarm: s.stats.noWarm.Load(),
		Batches: s.stats.batches.Load(), Refreshes: s.stats.refreshes.Load(), Others: math.Float64frombits(s.stats.others.Load())}
}

// job is one Place call.
type job struct {
	ctx  context.Context
	sb   *store.Sandbox
	req  Request
	dec  Decision
	node string // the node of the batch it is in
	// fresh is set once it found no room and waits for (or had) an exact
	// view.
	fresh bool
	// noWarm are the nodes the store refused it a warm sandbox on.
	noWarm []string
	done   chan error
}

// New starts a scheduler over cfg.Store. Close stops it.
func New(cfg Config) *Scheduler {
	if cfg.Refresh <= 0 {
		cfg.Refresh = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.Wait <= 0 {
		cfg.Wait = time.Millisecond
	}
	if cfg.Inflight <= 0 {
		cfg.Inflight = 2
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 8
	}
	if cfg.Share <= 0 {
		cfg.Share = 8
	}
	s := &Scheduler{cfg: cfg, log: cfg.Logger, jobs: make(chan *job), done: make(chan struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.loop()
	return s
}

// Close stops the scheduler: placements not yet sent to the store fail,
// those in it are waited for.
func (s *Scheduler) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// ErrClosed is a placement asked of a closed scheduler.
var ErrClosed = fmt.Errorf("%w: scheduler closed", errdefs.ErrUnavailable)

// NoRoomError is a placement no node can take. It is ErrUnavailable (the
// API answers 503); Decision says why each node could not.
type NoRoomError struct{ Decision Decision }

func (e *NoRoomError) Error() string {
	d := e.Decision
	kinds := make([]string, 0, len(d.Excluded))
	for k := range d.Excluded {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, d.Excluded[k]))
	}
	total := d.Passed
	for _, c := range d.Excluded {
		total += c
	}
	msg := fmt.Sprintf("cluster has no room: no node of %d can take the sandbox", total)
	if len(parts) > 0 {
		msg += " (" + strings.Join(parts, ", ") + ")"
	}
	if n := d.Excluded["selector"]; n > 0 {
		msg += fmt.Sprintf("; %d do not carry node_selector %s", n, selectorString(d.Selector))
	}
	if len(d.Refused) > 0 {
		msg += "; refused by " + strings.Join(d.Refused, ", ")
	}
	return msg
}

func (e *NoRoomError) Unwrap() error { return errdefs.ErrUnavailable }

// selectorString is sel as "k=v,k=v", by key.
func selectorString(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + sel[k]
	}
	return strings.Join(keys, ",")
}

// Place chooses a node for sb, sets sb.Node and records sb there through
// the store's Place, trying the next candidate when a node turns out to be
// full. req's resources, runtime, template version, tenant and sandbox ID
// are taken from sb, which is what the store checks; its selector, spread,
// snapshot node and Avoid are the caller's. The decision returned names the
// node (Decision.Node) on success; with a *NoRoomError (ErrUnavailable) it
// says why no node could take it.
//
// ctx bounds the wait before the placement is sent to the store; once in a
// batch, Place waits for the store's answer, so that a placement the store
// recorded is never reported as failed.
func (s *Scheduler) Place(ctx context.Context, sb *store.Sandbox, req Request) (Decision, error) {
	if math.IsNaN(sb.CPU) || math.IsInf(sb.CPU, 0) || sb.CPU < 0 || sb.MemoryMiB < 0 || sb.DiskGiB < 0 {
		// No node fits them, but the fault is the request's, not the
		// cluster's: a 400, not a 503.
		return Decision{Sandbox: sb.ID}, fmt.Errorf("%w: placing a sandbox of %v CPU, %d MiB, %d GiB", errdefs.ErrInvalid, sb.CPU, sb.MemoryMiB, sb.DiskGiB)
	}
	req.Sandbox = sb.ID
	req.CPU, req.MemoryMiB, req.DiskGiB = sb.CPU, sb.MemoryMiB, sb.DiskGiB
	req.Runtime, req.TemplateVersion, req.Tenant = sb.Runtime, sb.TemplateVersion, sb.Tenant
	req.Avoid = slices.Clone(req.Avoid)
	j := &job{ctx: ctx, sb: sb, req: req, done: make(chan error, 1)}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return Decision{Sandbox: sb.ID}, ctx.Err()
	case <-s.done:
		return Decision{Sandbox: sb.ID}, ErrClosed
	}
	err := <-j.done
	return j.dec, err
}

// adjust is a placement this scheduler made (or is making), added to its
// view until a read of the nodes includes it.
type adjust struct {
	node     string
	res      store.Resources
	template string // its template version
	warm     bool   // it takes a warm sandbox of template on node
	// seq is when its commit completed (the count of commits then); 0
	// while in the store.
	seq int64
}

// batchDone is a store.Place's answer.
type batchDone struct {
	jobs []*job
	adj  []*adjust
	errs []error
}

// refreshed is a store.Nodes' answer, read after the commit numbered seq.
type refreshed struct {
	nodes []store.Node
	err   error
	seq   int64
	exact bool
}

// loopState is what the loop goroutine owns.
type loopState struct {
	view    []store.Node
	index   map[string]int
	have    bool
	refused map[string]bool // nodes that refused a placement since the view was read
	// classes are the static filters' results on view, by classKey: a
	// burst is thousands of alike requests.
	classes map[string]*class
	scratch scratch
	// ownSince is what this scheduler placed on each node of view since
	// it was read (its adjustments), and others how many times as much
	// the other API nodes placed meanwhile, as the last reads showed
	// (options.others). total and totalSeq are the last read's count of
	// sandboxes and seq.
	ownSince        []store.Resources
	others          float64
	gens            []uint32 // options.gens
	total, totalSeq int64
	adjusts         []*adjust
	seq             int64

	pending  []*job // to rank and send
	stale    []*job // found no room; wait for an exact view
	inflight int
	// refreshing: a read of the nodes is under way; want: another is due
	// when it ends; exact: one is wanted with nothing in the store
	// meanwhile (see stale).
	refreshing, want, exact bool
	// soon: a read is due early, a store having refused a placement, once
	// a quarter of Config.Refresh has passed since the last began.
	soon        bool
	lastRefresh time.Time
	fresh       chan refreshed
	results     chan batchDone
}

func (s *Scheduler) loop() {
	defer close(s.done)
	st := &loopState{refused: map[string]bool{}, classes: map[string]*class{}, fresh: make(chan refreshed, 1), results: make(chan batchDone, s.cfg.Inflight)}
	tick := time.NewTicker(s.cfg.Refresh)
	defer tick.Stop()
	batchTimer := time.NewTimer(time.Hour)
	batchTimer.Stop()
	timing := false // batchTimer runs
	s.refresh(st, false)
	for {
		// Send what can be sent: a full batch at once, a partial one when
		// its first placement has waited Config.Wait or when a batch in
		// the store just answered (those queued meanwhile have waited
		// long enough). No batch goes while an exact view is being read.
		for st.have && !st.exact && st.inflight < s.cfg.Inflight && len(st.pending) >= s.cfg.Batch {
			s.dispatch(st)
		}
		if st.have && len(st.pending) > 0 && !timing {
			batchTimer.Reset(s.cfg.Wait)
			timing = true
		}
		if st.exact && !st.refreshing && st.inflight == 0 {
			s.refresh(st, true)
		}
		if st.soon && !st.refreshing && time.Since(st.lastRefresh) >= s.cfg.Refresh/4 {
			s.refresh(st, false)
		}
		select {
		case j := <-s.jobs:
			st.pending = append(st.pending, j)
		case <-batchTimer.C:
			timing = false
			if st.have && !st.exact && st.inflight < s.cfg.Inflight && len(st.pending) > 0 {
				s.dispatch(st)
			}
		case r := <-st.results:
			st.inflight--
			s.settle(st, r)
			if st.have && !st.exact && st.inflight < s.cfg.Inflight && len(st.pending) > 0 {
				s.dispatch(st)
			}
		case r := <-st.fresh:
			s.refreshDone(st, r)
			if st.want && !st.exact {
				s.refresh(st, false)
			}
		case <-tick.C:
			if !st.refreshing {
				s.refresh(st, false)
			} else {
				st.want = true
			}
		case <-s.ctx.Done():
			for _, j := range append(st.pending, st.stale...) {
				j.done <- ErrClosed
			}
			st.pending, st.stale = nil, nil
			for st.inflight > 0 {
				s.settle(st, <-st.results)
				st.inflight--
			}
			for _, j := range st.pending { // refused ones put back
				j.done <- ErrClosed
			}
			if st.refreshing {
				<-st.fresh
			}
			return
		}
	}
}

// refresh starts a read of the nodes.
func (s *Scheduler) refresh(st *loopState, exact bool) {
	if st.refreshing {
		st.want = true
		return
	}
	st.refreshing, st.want, st.soon = true, false, false
	st.lastRefresh = time.Now()
	s.stats.refreshes.Add(1)
	seq := st.seq
	go func() {
		nodes, err := s.cfg.Store.Nodes(s.ctx)
		st.fresh <- refreshed{nodes: nodes, err: err, seq: seq, exact: exact}
	}()
}

// refreshDone makes a read of the nodes the view: the nodes as read, plus
// this scheduler's placements the read may not include (those in the store
// when it began, or committed since). One committed during the read may be
// counted twice until the next: the view errs towards full, and an exact
// read (stale jobs) settles it.
func (s *Scheduler) refreshDone(st *loopState, r refreshed) {
	st.refreshing = false
	if r.err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("reading the cluster's nodes", "err", r.err)
		}
		if !st.have {
			// Nothing to rank against: those waiting fail rather than
			// wait for a database that may be gone for long.
			for _, j := range st.pending {
				j.done <- fmt.Errorf("reading the cluster's nodes: %w", r.err)
			}
			st.pending = nil
		}
		if r.exact {
			for _, j := range st.stale {
				j.done <- fmt.Errorf("reading the cluster's nodes: %w", r.err)
			}
			st.stale, st.exact = nil, false
		}
		return
	}
	var total int64
	for i := range r.nodes {
		total += int64(r.nodes[i].Committed.Sandboxes)
	}
	if st.have {
		// How many placements the cluster took between the reads, of
		// which this scheduler's; deletes make it an underestimate.
		own, all := r.seq-st.totalSeq, total-st.total
		if own > 0 && all >= own {
			st.others = min(0.5*st.others+0.5*float64(all-own)/float64(own), 63)
		} else if own == 0 && all > 0 {
			st.others = 0 // another placer alone: nothing of ours to echo
		}
	}
	st.total, st.totalSeq = total, r.seq
	s.stats.others.Store(math.Float64bits(st.others))
	st.view, st.have = r.nodes, true
	st.ownSince = make([]store.Resources, len(r.nodes))
	st.gens = make([]uint32, len(r.nodes))
	for i := range st.gens {
		st.gens[i] = 1 // a new class computes on 0
	}
	clear(st.classes)
	st.index = make(map[string]int, len(r.nodes))
	for i := range st.view {
		st.index[st.view[i].Name] = i
	}
	kept := st.adjusts[:0]
	for _, a := range st.adjusts {
		if a.seq != 0 && a.seq <= r.seq {
			continue
		}
		kept = append(kept, a)
		st.apply(a, 1)
	}
	clear(st.adjusts[len(kept):])
	st.adjusts = kept
	clear(st.refused)
	if r.exact {
		st.pending = append(st.stale, st.pending...)
		st.stale, st.exact = nil, false
	}
}

// apply adds placement a to the view (sign 1) or takes it away (-1).
func (st *loopState) apply(a *adjust, sign int) {
	i, ok := st.index[a.node]
	if !ok {
		return
	}
	st.gens[i]++
	for _, c := range []*store.Resources{&st.view[i].Committed, &st.ownSince[i]} {
		c.CPU += float64(sign) * a.res.CPU
		c.MemoryMiB += int64(sign) * a.res.MemoryMiB
		c.DiskGiB += int64(sign) * a.res.DiskGiB
		c.Sandboxes += sign * a.res.Sandboxes
	}
	if p := st.view[i].Status.Pooled; a.warm && p != nil {
		p[a.template] = max(p[a.template]-sign, 0)
	}
}

// noWarm marks node's warm sandboxes of template all taken, in the view,
// until it is read again: the store said so (store.ErrNoWarm).
func (st *loopState) noWarm(node, template string) {
	if i, ok := st.index[node]; ok && st.view[i].Status.Pooled[template] > 0 {
		st.view[i].Status.Pooled[template] = 0
		st.gens[i]++
	}
}

// pooled reports whether candidate c has a warm sandbox of the template.
func pooled(c Candidate) bool {
	for _, p := range c.Parts {
		if p.Term == "pool" {
			return p.Value > 0
		}
	}
	return false
}

// holds is what sb adds to its node's Committed (store.Holds).
func holds(sb *store.Sandbox) store.Resources {
	var r store.Resources
	compute, slot := store.Holds(sb.State)
	if compute {
		r.CPU, r.MemoryMiB = sb.CPU, sb.MemoryMiB
	}
	if slot {
		r.DiskGiB, r.Sandboxes = sb.DiskGiB, 1
	}
	return r
}

// dispatch ranks up to a batch of pending jobs against the view, each
// adding its choice to the view before the next is ranked, and sends them
// to the store in one Place.
func (s *Scheduler) dispatch(st *loopState) {
	n := min(len(st.pending), s.cfg.Batch)
	take := st.pending[:n]
	st.pending = slices.Clone(st.pending[n:])
	now := time.Now()
	var b batchDone
	for k, j := range take {
		if s.cfg.Share > 1 {
			j.req.Draw = take[k-k%s.cfg.Share].sb.ID
		}
		if err := j.ctx.Err(); err != nil {
			j.done <- err
			continue
		}
		refused := j.dec.Refused
		o := options{keep: s.cfg.Keep, explain: j.req.Explain, avoid: st.refused, scratch: &st.scratch,
			ownSince: st.ownSince, others: st.others, gens: st.gens}
		if !o.explain {
			key := classKey(&j.req)
			cl := st.classes[key]
			if cl == nil || !now.Before(cl.expires) {
				cl = newClass(st.view, &j.req, now, nil)
				st.classes[key] = cl
			}
			o.class = cl
		}
		j.dec = rank(st.view, &j.req, now, o)
		j.dec.Refused = refused
		j.dec.Selector, j.dec.Spread = j.req.Selector, j.req.Spread
		j.dec.Snapshot, j.dec.SnapshotPull = j.req.Snapshot, j.req.Snapshot != "" && j.req.SnapshotNode == ""
		if len(j.dec.Candidates) == 0 {
			if !j.fresh {
				// The view may be behind the store (sandboxes deleted,
				// placements of ours counted twice): look again, exactly,
				// before answering no.
				j.fresh = true
				st.stale = append(st.stale, j)
				st.exact = true
				continue
			}
			s.stats.full.Add(1)
			j.done <- &NoRoomError{Decision: j.dec}
			continue
		}
		j.node = j.dec.Candidates[0].Node
		j.sb.Node = j.node
		// A warm sandbox waits there: the store reserves it with the
		// placement, unless it refused this job one there before.
		j.dec.Warm = pooled(j.dec.Candidates[0]) && !slices.Contains(j.noWarm, j.node)
		j.sb.Warm = j.dec.Warm
		// The decision goes into the row the store records, as its
		// placement record: one write, in the batch's transaction. An
		// update afterwards would be a second write per create, and
		// one of a row this process's node may not own (the fenced
		// view refuses it).
		rec := j.dec
		rec.Node = j.node
		j.sb.Placement, _ = json.Marshal(rec)
		a := &adjust{node: j.node, res: holds(j.sb), template: j.sb.TemplateVersion, warm: j.sb.Warm}
		if a.warm {
			// It replaces a pooled sandbox the view counts already
			// (of the default size, near enough: the store checks).
			a.res = store.Resources{}
		}
		st.apply(a, 1)
		st.adjusts = append(st.adjusts, a)
		b.jobs, b.adj = append(b.jobs, j), append(b.adj, a)
	}
	if len(b.jobs) == 0 {
		return
	}
	st.inflight++
	s.stats.batches.Add(1)
	sbs := make([]*store.Sandbox, len(b.jobs))
	for i, j := range b.jobs {
		sbs[i] = j.sb
	}
	go func() {
		b.errs = s.cfg.Store.Place(s.ctx, sbs)
		st.results <- b
	}()
}

// settle takes a batch's answers: placements recorded are done; those
// refused for room go back to the queue, to their next candidate, and the
// view is read again soon; other errors are the caller's.
func (s *Scheduler) settle(st *loopState, b batchDone) {
	for i, j := range b.jobs {
		a := b.adj[i]
		var err error
		if i < len(b.errs) {
			err = b.errs[i]
		} else {
			err = fmt.Errorf("%w: the store answered %d of %d placements", errdefs.ErrUnavailable, len(b.errs), len(b.jobs))
		}
		if err == nil {
			s.stats.placed.Add(1)
			st.seq++
			a.seq = st.seq
			j.dec.Node = j.node
			j.done <- nil
			continue
		}
		st.apply(a, -1)
		st.adjusts = slices.DeleteFunc(st.adjusts, func(x *adjust) bool { return x == a })
		j.sb.Node, j.sb.Warm = "", false
		if errors.Is(err, store.ErrNoWarm) {
			// Another API node took the node's last warm one (or the
			// view was behind): ranked again, the node may still win,
			// cold.
			s.stats.noWarm.Add(1)
			st.noWarm(j.node, a.template)
			j.noWarm = append(j.noWarm, j.node)
			st.pending = append(st.pending, j)
			st.soon = true
			continue
		}
		if errors.Is(err, store.ErrNoRoom) {
			s.stats.refused.Add(1)
			st.refused[j.node] = true
			j.req.Avoid = append(j.req.Avoid, j.node)
			j.dec.Refused = append(j.dec.Refused, j.node)
			st.pending = append(st.pending, j)
			st.soon = true
			continue
		}
		j.done <- fmt.Errorf("placing sandbox on node %s: %w", j.node, err)
	}
}
