// Package scheduler places sandboxes on the nodes of a cluster: Rank is the
// pure part (which nodes can take a sandbox, and which of them is best, with
// the reasons), and Scheduler records its choices through the store's
// transactional Place, in batches, trying the next node when one turns out
// to be full.
package scheduler

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
)

// Request is what a placement must satisfy and what it prefers.
type Request struct {
	// Sandbox is the sandbox's ID; it seeds the draw among the nodes of the
	// window (see Window) unless Draw does, so that placers working at
	// once spread their sandboxes.
	Sandbox string `json:"sandbox"`
	// What the sandbox holds on its node.
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskGiB   int64   `json:"disk_gib"`
	Runtime   string  `json:"runtime"`
	// TemplateVersion is the template version it is made from ("" the
	// built-in template, held by every node).
	TemplateVersion string `json:"template_version,omitempty"`
	// SnapshotNode is the node holding the snapshot it is created from: the
	// only node it can go to, for now.
	SnapshotNode string `json:"snapshot_node,omitempty"`
	// Selector are labels a node must carry, each with the value given.
	Selector map[string]string `json:"selector,omitempty"`
	// Spread is a node label (e.g. "zone") whose values the placements
	// spread over.
	Spread string `json:"spread,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	// Avoid are nodes not to consider: those that refused this placement.
	Avoid []string `json:"avoid,omitempty"`
	// Draw seeds the draw among the nodes of the window (see Window):
	// Sandbox if empty. A scheduler gives the placements of a batch a few
	// draws, not one each, so that the batch goes to a few nodes, and
	// concurrent batches of several API nodes seldom lock the same node
	// rows in the store.
	Draw string `json:"draw,omitempty"`
	// Explain asks Scheduler.Place for every filtered node with its reason,
	// as Rank always gives; otherwise the Decision counts them by filter
	// (on a thousand nodes, the reasons cost more than the ranking).
	Explain bool `json:"-"`
}

// need is what the placement adds to a node's Committed.
func (r *Request) need() store.Resources {
	return store.Resources{CPU: r.CPU, MemoryMiB: r.MemoryMiB, DiskGiB: r.DiskGiB, Sandboxes: 1}
}

// Decision is a placement's explanation: the nodes that could take it, best
// first, and those that could not, with why. It is the API's placement
// record, and what `atoll create --explain` shows.
type Decision struct {
	Sandbox string `json:"sandbox"`
	// Draw is what seeded the draw among nodes, if not Sandbox.
	Draw string `json:"draw,omitempty"`
	// Node is the node the sandbox went to (set by Scheduler.Place once
	// the store accepted it); Rank leaves it empty.
	Node string `json:"node,omitempty"`
	// Warm says the placement took a warm sandbox of its template waiting
	// on Node (its pool term was 1 there), reserved in the store with it
	// (store.Sandbox.Warm); a cold start otherwise.
	Warm bool `json:"warm,omitempty"`
	// Candidates are the nodes that passed every filter, best first
	// (Scheduler keeps the first few).
	Candidates []Candidate `json:"candidates"`
	// Passed counts the nodes that passed, listed or not.
	Passed int `json:"passed"`
	// Filtered are the nodes that did not pass, by name, each with why.
	Filtered []Filtered `json:"filtered,omitempty"`
	// Excluded counts the filtered nodes by the filter that refused them.
	Excluded map[string]int `json:"excluded,omitempty"`
	// Refused are the nodes the store refused the placement on (full by
	// the time it got there), in the order tried.
	Refused []string `json:"refused,omitempty"`
	// Selector and Spread are the request's (Scheduler.Place sets them).
	Selector map[string]string `json:"selector,omitempty"`
	Spread   string            `json:"spread,omitempty"`
}

// Candidate is a node that can take the sandbox, with its score and the
// score's parts.
type Candidate struct {
	Node  string  `json:"node"`
	Score float64 `json:"score"`
	Parts []Part  `json:"parts"`
	// Window says the node's score was within Window of the best, so its
	// place among those was drawn (see Window); Drawn marks the two drawn
	// to compete for first.
	Window bool `json:"window,omitempty"`
	Drawn  bool `json:"drawn,omitempty"`
}

// Part is one term of a score: its value (0..1) and its weighted share.
type Part struct {
	Term     string  `json:"term"`
	Value    float64 `json:"value"`
	Weighted float64 `json:"weighted"`
}

// Filtered is a node that cannot take the sandbox, and why.
type Filtered struct {
	Node   string `json:"node"`
	Filter string `json:"filter"`
	Reason string `json:"reason"`
}

// Window is how close to the best score a node's score must be for the
// node to be as good a choice: the power of two choices. Of the nodes in
// the window, two are drawn by a hash of (sandbox, node), the better
// scoring one goes first, the other second, then the rest of the window in
// the hash's order, then the other nodes by score.
//
// Always taking the best node is what several placers each working from a
// view a little behind the store must not do: they all see the same
// emptiest nodes and pile onto them (measured: 8 schedulers on 100 nodes
// left them between 39 and 64 sandboxes where 50 was the mean). Two random
// choices, the better kept, spread load nearly as evenly as the best
// choice does with perfect information, and suffer far less from stale
// views (Mitzenmacher, "How useful is old information?"); the scheduler
// also counts what it expects the others placed (options.others). A
// window of 0.1 is a tenth of a node's capacity on the free term; the pool
// term (2) and the locality term (0.5) stay above it, so a warm or local
// node still wins. Measured at 1,000 nodes, 8 schedulers, 50 sandboxes a
// node: windows of 0.05, 0.1, 0.25 left nodes between 46–54, 45–54, 41–56.
const Window = 0.1

// term is one weighted part of a node's score. value is 0..1, higher is
// better; it sees the node (k-th of the class, n) as it would be after the
// placement.
type term struct {
	name   string
	weight float64
	value  func(c *rankCtx, k int, n *store.Node) float64
}

// terms is the score: a warm sandbox of the template waiting on the node is
// a start in milliseconds, worth more than anything else; a node that
// holds the template's layers saves a pull of seconds, worth more than a
// moderately emptier node; among the rest, the emptiest nodes and the
// least loaded spread groups win.
var terms = [...]term{
	{"pool", 2, poolValue},
	{"locality", 0.5, localityValue},
	{"free", 1, freeValue},
	{"spread", 0.5, spreadValue},
}

// poolValue is 1 on a node with a warm sandbox of the template.
func poolValue(c *rankCtx, k int, n *store.Node) float64 {
	if c.warm(n) {
		return 1
	}
	return 0
}

// warm reports whether n has a warm sandbox for the request: of its
// template version and runtime.
func (c *rankCtx) warm(n *store.Node) bool {
	return len(n.Status.Pooled) > 0 && n.Status.Pooled[c.req.TemplateVersion] > 0 &&
		(n.PooledRuntime == "" || n.PooledRuntime == c.req.Runtime)
}

// localityValue is 1 on a node holding the template's layers; every node
// holds the built-in template's.
func localityValue(c *rankCtx, k int, n *store.Node) float64 {
	if c.class.local[k] {
		return 1
	}
	return 0
}

// freeValue is the share of the node's scarcest resource left free after
// the placement: spreading the load. It counts what the node has
// committed, and what a scheduler expects other API nodes to have placed
// there since its view was read (see options.others).
func freeValue(c *rankCtx, k int, n *store.Node) float64 {
	cm := c.load(k, n)
	need := &c.need
	free := 1.0
	if n.Capacity.CPU > 0 {
		free = min(free, (n.Capacity.CPU-cm.CPU-need.CPU)/n.Capacity.CPU)
	}
	share := func(capacity, committed, need int64) {
		if capacity > 0 {
			free = min(free, float64(capacity-committed-need)/float64(capacity))
		}
	}
	share(n.Capacity.MemoryMiB, cm.MemoryMiB, need.MemoryMiB)
	share(n.Capacity.DiskGiB, cm.DiskGiB, need.DiskGiB)
	share(int64(n.Capacity.Sandboxes), int64(cm.Sandboxes), int64(need.Sandboxes))
	return max(free, 0)
}

// spreadValue is 1 for a node of the spread group (its value of the spread
// label) with the fewest sandboxes per node, falling towards 0 as its
// group's load nears the most loaded group's; 0 for a node without the
// label.
func spreadValue(c *rankCtx, k int, n *store.Node) float64 {
	g := c.class.group[k]
	if g < 0 {
		return 0
	}
	if c.maxShare == 0 {
		return 1
	}
	return 1 - (c.shares[g]-c.minShare)/c.maxShare
}

// filter is one reason a node cannot take a sandbox: refuses says whether
// it applies, why says it in words (only asked for when explaining). A
// static filter depends only on the request's class and the node as read
// from the store, not on what is committed on it: a scheduler applies the
// static ones once per view for a burst of alike requests.
type filter struct {
	name    string
	static  bool
	refuses func(c *rankCtx, n *store.Node) bool
	why     func(c *rankCtx, n *store.Node) string
}

// filters are checked in order, the static ones first; the first that
// refuses a node is its reason.
var filters = []filter{
	{"snapshot", true,
		func(c *rankCtx, n *store.Node) bool { return c.req.SnapshotNode != "" && n.Name != c.req.SnapshotNode },
		func(c *rankCtx, n *store.Node) string { return "snapshot is on node " + c.req.SnapshotNode }},
	{"state", true,
		func(c *rankCtx, n *store.Node) bool { return n.State != store.NodeLive },
		func(c *rankCtx, n *store.Node) string { return n.State }},
	{"lease", true,
		func(c *rankCtx, n *store.Node) bool { return !c.now.Before(n.LeaseExpires) },
		func(c *rankCtx, n *store.Node) string {
			return "lease expired " + c.now.Sub(n.LeaseExpires).Round(time.Second).String() + " ago"
		}},
	{"schedule", true,
		func(c *rankCtx, n *store.Node) bool { return n.Schedule != "" },
		func(c *rankCtx, n *store.Node) string { return n.Schedule }},
	{"runtime", true,
		func(c *rankCtx, n *store.Node) bool { return !slices.Contains(n.Runtimes, c.req.Runtime) },
		func(c *rankCtx, n *store.Node) string { return "no runtime " + c.req.Runtime }},
	{"selector", true,
		func(c *rankCtx, n *store.Node) bool { return c.mismatch(n) != "" },
		func(c *rankCtx, n *store.Node) string { return "selector " + c.mismatch(n) }},
	{"avoid", false,
		func(c *rankCtx, n *store.Node) bool { return len(c.avoided) > 0 && c.avoided[n.Name] },
		func(c *rankCtx, n *store.Node) string { return "refused the placement" }},
	{"room", false,
		func(c *rankCtx, n *store.Node) bool { return !c.fits(n) },
		func(c *rankCtx, n *store.Node) string { return "no room: " + short(n, c.needOn(n)) }},
}

// dynamic are the filters that are not static, by index.
var dynamic = func() (d []int) {
	for f := range filters {
		if !filters[f].static {
			d = append(d, f)
		}
	}
	return d
}()

// roomFilter is the index of "room", whose answer a cached class keeps.
var roomFilter = slices.IndexFunc(filters, func(f filter) bool { return f.name == "room" })

// epsilon absorbs the rounding of sums of fractional CPUs (0.1+0.2).
const epsilon = 1e-9

// fits reports whether need fits in n beside what it has committed: every
// resource within capacity, as the store's Place checks.
func fits(n *store.Node, need *store.Resources) bool {
	return n.Committed.CPU+need.CPU <= n.Capacity.CPU+epsilon &&
		n.Committed.MemoryMiB+need.MemoryMiB <= n.Capacity.MemoryMiB &&
		n.Committed.DiskGiB+need.DiskGiB <= n.Capacity.DiskGiB &&
		n.Committed.Sandboxes+need.Sandboxes <= n.Capacity.Sandboxes
}

// needOn is what the placement adds to n: on a node with a warm sandbox of
// the template, what it needs beyond the pooled sandbox it replaces (as
// the store counts a warm placement).
func (c *rankCtx) needOn(n *store.Node) store.Resources {
	need := c.need
	if c.warm(n) {
		h := n.PooledHolds
		need.CPU -= h.CPU
		need.MemoryMiB -= h.MemoryMiB
		need.DiskGiB -= h.DiskGiB
		need.Sandboxes -= h.Sandboxes
	}
	return need
}

// fits reports whether the placement fits on n (needOn).
func (c *rankCtx) fits(n *store.Node) bool {
	need := c.needOn(n)
	return fits(n, &need)
}

// short names the resources need does not fit in on n, each as
// "committed/capacity + need".
func short(n *store.Node, need store.Resources) string {
	var s []string
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	if n.Committed.CPU+need.CPU > n.Capacity.CPU+epsilon {
		s = append(s, "cpu "+f(n.Committed.CPU)+"/"+f(n.Capacity.CPU)+" + "+f(need.CPU))
	}
	i := func(name string, committed, capacity, need int64) {
		if committed+need > capacity {
			s = append(s, fmt.Sprintf("%s %d/%d + %d", name, committed, capacity, need))
		}
	}
	i("memory_mib", n.Committed.MemoryMiB, n.Capacity.MemoryMiB, need.MemoryMiB)
	i("disk_gib", n.Committed.DiskGiB, n.Capacity.DiskGiB, need.DiskGiB)
	i("sandboxes", int64(n.Committed.Sandboxes), int64(n.Capacity.Sandboxes), int64(need.Sandboxes))
	return strings.Join(s, ", ")
}

// class is what the static filters leave of a view's nodes for a class of
// requests (classKey), and what else of the ranking depends only on the
// class: which nodes hold the template, their spread groups, the hashes of
// their names.
type class struct {
	nodes    []int   // indexes into the view
	local    []bool  // by position in nodes
	group    []int32 // spread group by position in nodes, -1 without the label
	hash     []uint64
	groups   int
	excluded map[string]int // by the static filters
	// expires is the first lease of nodes to run out: the class is stale
	// from then on.
	expires time.Time
	// A scheduler's cache of the dynamic part (options.gens), by
	// position: the view's generation of the node when last computed,
	// whether the request fitted, and its score.
	gen   []uint32
	room  []bool
	score []float64
}

// classKey is what of req the static filters and class read, and the
// resources, which a cached class's scores depend on.
func classKey(req *Request) string {
	var b strings.Builder
	b.WriteString(req.Runtime)
	b.WriteByte(0)
	b.WriteString(req.TemplateVersion)
	b.WriteByte(0)
	b.WriteString(req.SnapshotNode)
	b.WriteByte(0)
	b.WriteString(req.Spread)
	b.WriteByte(0)
	b.WriteString(strconv.FormatFloat(req.CPU, 'g', -1, 64))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(req.MemoryMiB, 10))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(req.DiskGiB, 10))
	keys := make([]string, 0, len(req.Selector))
	for k := range req.Selector {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(req.Selector[k])
	}
	return b.String()
}

// rankCtx is one ranking's inputs and what it precomputes from them.
type rankCtx struct {
	req      *Request
	now      time.Time
	need     store.Resources
	avoided  map[string]bool // req.Avoid, and the caller's own
	selector []string        // req.Selector's keys, sorted
	class    *class
	// ownSince and others: see options.
	ownSince []store.Resources
	others   float64
	// The spread groups' sandboxes per node (of the nodes that pass), and
	// the least and most of them.
	shares             []float64
	minShare, maxShare float64
}

// load is what the k-th node of the class (n) holds, for the scores:
// Committed, and others times what this scheduler placed there since its
// view was read.
func (c *rankCtx) load(k int, n *store.Node) store.Resources {
	cm := n.Committed
	if c.others > 0 && c.ownSince != nil {
		o := c.ownSince[c.class.nodes[k]]
		cm.CPU += c.others * o.CPU
		cm.MemoryMiB += int64(c.others * float64(o.MemoryMiB))
		cm.DiskGiB += int64(c.others * float64(o.DiskGiB))
		cm.Sandboxes += int(c.others * float64(o.Sandboxes))
	}
	return cm
}

// score is the k-th node of the class's score (n).
func (c *rankCtx) score(k int, n *store.Node) float64 {
	var score float64
	for t := range terms {
		score += terms[t].weight * terms[t].value(c, k, n)
	}
	return score
}

// mismatch is the first "key=value" of the selector node n does not carry,
// or "".
func (c *rankCtx) mismatch(n *store.Node) string {
	for _, k := range c.selector {
		if v, ok := n.Labels[k]; !ok || v != c.req.Selector[k] {
			return k + "=" + c.req.Selector[k]
		}
	}
	return ""
}

// options tune a ranking for its caller.
type options struct {
	// keep is how many candidates the decision lists (0: all).
	keep int
	// explain lists every filtered node with its reason; otherwise only
	// the counts by filter.
	explain bool
	// avoid are more nodes to skip, as refused.
	avoid map[string]bool
	// class is the static filters' result for this request's class on
	// nodes, made by newClass; nil to make it here.
	class *class
	// scratch is reused between rankings by one caller.
	scratch *scratch
	// ownSince (by position in nodes) is what a scheduler placed since its
	// view was read, and others how many times as much it expects the
	// other API nodes to have placed in the same time: the scores count
	// it (the filters do not; the store has the last word on room).
	// Several schedulers each working from a view a little behind, all
	// seeing the same emptiest nodes, otherwise all favour them at once;
	// expecting each of the others to do as it does, each favours them a
	// share as much.
	ownSince []store.Resources
	others   float64
	// gens (by position in nodes) is the generation of each node in a
	// scheduler's view: it changes whenever the node's Committed or Status
	// does, so that class can keep a node's room and score until then.
	gens []uint32
}

// scratch is a ranking's working memory, kept by a caller that ranks many.
type scratch struct {
	score  []float64
	passed []bool
	counts []int
	sums   []int
}

// Rank ranks nodes for req at time now: every node that can take the
// sandbox, best first, each with its score and parts, and every node that
// cannot, with why. Nodes whose scores are within Window of the best are
// ordered by a draw seeded by a hash of (req.Sandbox, node) rather than by
// score alone (see Window).
func Rank(nodes []store.Node, req Request, now time.Time) Decision {
	return rank(nodes, &req, now, options{explain: true})
}

func newCtx(req *Request, now time.Time, avoid map[string]bool) *rankCtx {
	c := &rankCtx{req: req, now: now, need: req.need(), avoided: avoid}
	if len(req.Avoid) > 0 {
		c.avoided = make(map[string]bool, len(req.Avoid)+len(avoid))
		for k := range avoid {
			c.avoided[k] = true
		}
		for _, name := range req.Avoid {
			c.avoided[name] = true
		}
	}
	for k := range req.Selector {
		c.selector = append(c.selector, k)
	}
	sort.Strings(c.selector)
	return c
}

// newClass applies the static filters to nodes for req's class. With d,
// it records each node refused, with why, in d.Filtered.
func newClass(nodes []store.Node, req *Request, now time.Time, d *Decision) *class {
	c := newCtx(req, now, nil)
	cl := &class{excluded: map[string]int{}}
	groups := map[string]int32{}
	for i := range nodes {
		n := &nodes[i]
		refused := false
		for f := range filters {
			if filters[f].static && filters[f].refuses(c, n) {
				cl.excluded[filters[f].name]++
				if d != nil {
					d.Filtered = append(d.Filtered, Filtered{Node: n.Name, Filter: filters[f].name, Reason: filters[f].why(c, n)})
				}
				refused = true
				break
			}
		}
		if refused {
			continue
		}
		if cl.expires.IsZero() || n.LeaseExpires.Before(cl.expires) {
			cl.expires = n.LeaseExpires
		}
		cl.nodes = append(cl.nodes, i)
		cl.local = append(cl.local, req.TemplateVersion == "" || slices.Contains(n.Status.Templates, req.TemplateVersion))
		g := int32(-1)
		if v, ok := n.Labels[req.Spread]; ok && req.Spread != "" {
			if g, ok = groups[v]; !ok {
				g = int32(len(groups))
				groups[v] = g
			}
		}
		cl.group = append(cl.group, g)
		cl.hash = append(cl.hash, nameHash(n.Name))
	}
	cl.groups = len(groups)
	if len(cl.nodes) == 0 {
		cl.expires = now.Add(time.Hour) // nothing to run out; a new view replaces it
	}
	return cl
}

func rank(nodes []store.Node, req *Request, now time.Time, o options) Decision {
	d := Decision{Sandbox: req.Sandbox, Excluded: map[string]int{}}
	if req.Draw != req.Sandbox {
		d.Draw = req.Draw
	}
	cl := o.class
	if cl == nil {
		var explain *Decision
		if o.explain {
			explain = &d
		}
		cl = newClass(nodes, req, now, explain)
	}
	for k, v := range cl.excluded {
		d.Excluded[k] = v
	}
	c := newCtx(req, now, o.avoid)
	c.class = cl
	c.ownSince, c.others = o.ownSince, o.others
	sc := o.scratch
	if sc == nil {
		sc = &scratch{}
	}
	m := len(cl.nodes)
	sc.score = slices.Grow(sc.score[:0], m)[:m]
	sc.passed = slices.Grow(sc.passed[:0], m)[:m]
	// A cached class keeps each node's room and score until the view's
	// generation of the node changes, unless the scores depend on every
	// node (spread).
	cached := o.gens != nil && cl.groups == 0
	if cached && len(cl.gen) != m {
		cl.gen, cl.room, cl.score = make([]uint32, m), make([]bool, m), make([]float64, m)
	}

	// The dynamic filters, node by node.
	for k, i := range cl.nodes {
		n := &nodes[i]
		sc.passed[k] = true
		for _, f := range dynamic {
			var refuses bool
			if cached && f == roomFilter {
				if cl.gen[k] != o.gens[i] {
					cl.gen[k], cl.room[k] = o.gens[i], c.fits(n)
					if cl.room[k] {
						cl.score[k] = c.score(k, n)
					}
				}
				refuses = !cl.room[k]
			} else {
				refuses = filters[f].refuses(c, n)
			}
			if refuses {
				sc.passed[k] = false
				d.Excluded[filters[f].name]++
				if o.explain {
					d.Filtered = append(d.Filtered, Filtered{Node: n.Name, Filter: filters[f].name, Reason: filters[f].why(c, n)})
				}
				break
			}
		}
		if sc.passed[k] {
			d.Passed++
		}
	}
	if len(d.Excluded) == 0 {
		d.Excluded = nil
	}
	if o.explain {
		// In the order of nodes, whichever filter refused them.
		order := make(map[string]int, len(nodes))
		for i := range nodes {
			order[nodes[i].Name] = i
		}
		sort.SliceStable(d.Filtered, func(a, b int) bool { return order[d.Filtered[a].Node] < order[d.Filtered[b].Node] })
	}
	if d.Passed == 0 {
		d.Candidates = []Candidate{}
		return d
	}

	// The spread groups' load among the nodes that passed.
	if cl.groups > 0 {
		sc.counts = slices.Grow(sc.counts[:0], cl.groups)[:cl.groups]
		sc.sums = slices.Grow(sc.sums[:0], cl.groups)[:cl.groups]
		clear(sc.counts)
		clear(sc.sums)
		for k, i := range cl.nodes {
			if g := cl.group[k]; g >= 0 && sc.passed[k] {
				sc.counts[g]++
				sc.sums[g] += c.load(k, &nodes[i]).Sandboxes
			}
		}
		c.shares = make([]float64, cl.groups)
		c.minShare = math.Inf(1)
		for g := range c.shares {
			if sc.counts[g] == 0 {
				continue
			}
			c.shares[g] = float64(sc.sums[g]) / float64(sc.counts[g])
			c.minShare = min(c.minShare, c.shares[g])
			c.maxShare = max(c.maxShare, c.shares[g])
		}
	}

	best := math.Inf(-1)
	for k, i := range cl.nodes {
		if !sc.passed[k] {
			continue
		}
		if cached {
			sc.score[k] = cl.score[k]
		} else {
			sc.score[k] = c.score(k, &nodes[i])
		}
		if sc.score[k] > best {
			best = sc.score[k]
		}
	}

	// The order: the window by the draw's hash of (draw, node), then the
	// others by score; the first two of the window are the drawn, and the
	// better of them goes first.
	draw := req.Draw
	if draw == "" {
		draw = req.Sandbox
	}
	base := sandboxHash(draw)
	type entry struct {
		k      int
		score  float64
		hash   uint64
		window bool
	}
	before := func(a, b *entry) bool {
		if a.window != b.window {
			return a.window
		}
		if a.window && a.hash != b.hash {
			return a.hash < b.hash
		}
		if a.score != b.score {
			return a.score > b.score
		}
		return nodes[cl.nodes[a.k]].Name < nodes[cl.nodes[b.k]].Name
	}

	// The first keep in order (two at least, for the draw), by insertion:
	// the scheduler keeps a few of a thousand nodes, where a full sort
	// would cost more than the rest of the ranking.
	keep := d.Passed
	if o.keep > 0 && max(o.keep, 2) < keep {
		keep = max(o.keep, 2)
	}
	top := make([]entry, 0, keep)
	for k := range cl.nodes {
		if !sc.passed[k] {
			continue
		}
		e := entry{k: k, score: sc.score[k]}
		if e.score >= best-Window {
			e.hash, e.window = mix(base, cl.hash[k]), true
		}
		if len(top) == keep && !before(&e, &top[keep-1]) {
			continue
		}
		at := sort.Search(len(top), func(j int) bool { return before(&e, &top[j]) })
		if len(top) < keep {
			top = append(top, entry{})
		}
		copy(top[at+1:], top[at:])
		top[at] = e
	}
	drawn := 0
	for drawn < min(2, len(top)) && top[drawn].window {
		drawn++
	}
	if drawn == 2 && top[1].score > top[0].score {
		top[0], top[1] = top[1], top[0]
	}
	if o.keep > 0 && len(top) > o.keep {
		top = top[:o.keep]
	}
	d.Candidates = make([]Candidate, len(top))
	for j, e := range top {
		n := &nodes[cl.nodes[e.k]]
		cd := Candidate{Node: n.Name, Score: round(e.score), Window: e.window, Drawn: j < drawn, Parts: make([]Part, len(terms))}
		for t := range terms {
			v := terms[t].value(c, e.k, n)
			cd.Parts[t] = Part{Term: terms[t].name, Value: round(v), Weighted: round(terms[t].weight * v)}
		}
		d.Candidates[j] = cd
	}
	return d
}

// sandboxHash is FNV-1a of a sandbox ID; nameHash the same of a node's
// name, after a separator.
func sandboxHash(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h
}

func nameHash(name string) uint64 { return sandboxHash("\x00" + name) }

// mix is the tie-break hash of a sandbox and a node: their hashes
// combined, through splitmix64's finaliser so that names differing in one
// letter land far apart.
func mix(sandbox, node uint64) uint64 {
	h := sandbox ^ (node * 0x9e3779b97f4a7c15)
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// round keeps explanations readable: four decimals.
func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }
