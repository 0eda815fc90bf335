// Package scheduler places sandboxes on the nodes of a cluster: Rank is the
// pure part (which nodes can take a sandbox, and which of them is best, with
// the reasons), and Scheduler records its choices through the store's
// transactional Place, in batches, trying the next node when one turns out
// to be full.
package scheduler

import (
	"fmt"
	"hash/fnv"
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
	// Sandbox is the sandbox's ID; it seeds the choice among nodes of equal
	// score, so that placers working at once spread their sandboxes.
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
	// Node is the node the sandbox went to (set by Scheduler.Place once
	// the store accepted it); Rank leaves it empty.
	Node string `json:"node,omitempty"`
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
}

// Candidate is a node that can take the sandbox, with its score and the
// score's parts.
type Candidate struct {
	Node  string  `json:"node"`
	Score float64 `json:"score"`
	Parts []Part  `json:"parts"`
	// Tied says the node's score was within Band of the best, so its place
	// among the tied ones was drawn by a hash of sandbox and node.
	Tied bool `json:"tied,omitempty"`
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

// Band is how close to the best score a node's score must be to count as
// tied with it. Tied nodes are ordered by a hash of (sandbox, node), not by
// their score: placers in several processes, each seeing nearly the same
// view of the cluster, then pick different nodes for different sandboxes
// instead of all writing to the emptiest node at once. A band of 0.02 of the
// free-capacity term is about one sandbox in fifty of a node's capacity; the
// locality and pool terms are far above it.
const Band = 0.02

// term is one weighted part of a node's score. value is 0..1, higher is
// better; it sees the node as it would be after the placement.
type term struct {
	name   string
	weight float64
	value  func(c *rankCtx, n *store.Node) float64
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
func poolValue(c *rankCtx, n *store.Node) float64 {
	if n.Status.Pooled[c.req.TemplateVersion] > 0 {
		return 1
	}
	return 0
}

// localityValue is 1 on a node holding the template's layers; every node
// holds the built-in template's.
func localityValue(c *rankCtx, n *store.Node) float64 {
	if c.req.TemplateVersion == "" || slices.Contains(n.Status.Templates, c.req.TemplateVersion) {
		return 1
	}
	return 0
}

// freeValue is the share of the node's scarcest resource left free after
// the placement: spreading the load.
func freeValue(c *rankCtx, n *store.Node) float64 {
	need := c.need
	free := 1.0
	share := func(capacity, committed, need float64) {
		if capacity > 0 {
			free = min(free, (capacity-committed-need)/capacity)
		}
	}
	share(n.Capacity.CPU, n.Committed.CPU, need.CPU)
	share(float64(n.Capacity.MemoryMiB), float64(n.Committed.MemoryMiB), float64(need.MemoryMiB))
	share(float64(n.Capacity.DiskGiB), float64(n.Committed.DiskGiB), float64(need.DiskGiB))
	share(float64(n.Capacity.Sandboxes), float64(n.Committed.Sandboxes), float64(need.Sandboxes))
	return max(free, 0)
}

// spreadValue is 1 for a node of the spread group (its value of the spread
// label) with the fewest sandboxes per node, falling towards 0 as its
// group's load nears the most loaded group's; 0 for a node without the
// label.
func spreadValue(c *rankCtx, n *store.Node) float64 {
	if c.req.Spread == "" {
		return 0
	}
	v, ok := n.Labels[c.req.Spread]
	if !ok {
		return 0
	}
	if c.maxShare == 0 {
		return 1
	}
	return 1 - (c.groups[v].share()-c.minShare)/c.maxShare
}

// group is the nodes of one value of the spread label.
type group struct{ nodes, sandboxes int }

func (g group) share() float64 { return float64(g.sandboxes) / float64(g.nodes) }

// filter is one reason a node cannot take a sandbox: refuses says whether
// it applies, why says it in words (only asked for when explaining).
type filter struct {
	name    string
	refuses func(c *rankCtx, n *store.Node) bool
	why     func(c *rankCtx, n *store.Node) string
}

// filters are checked in order; the first that refuses a node is its
// reason.
var filters = []filter{
	{"avoid",
		func(c *rankCtx, n *store.Node) bool { return c.avoid(n.Name) },
		func(c *rankCtx, n *store.Node) string { return "refused the placement" }},
	{"snapshot",
		func(c *rankCtx, n *store.Node) bool { return c.req.SnapshotNode != "" && n.Name != c.req.SnapshotNode },
		func(c *rankCtx, n *store.Node) string { return "snapshot is on node " + c.req.SnapshotNode }},
	{"state",
		func(c *rankCtx, n *store.Node) bool { return n.State != store.NodeLive },
		func(c *rankCtx, n *store.Node) string { return n.State }},
	{"lease",
		func(c *rankCtx, n *store.Node) bool { return !c.now.Before(n.LeaseExpires) },
		func(c *rankCtx, n *store.Node) string {
			return "lease expired " + c.now.Sub(n.LeaseExpires).Round(time.Second).String() + " ago"
		}},
	{"schedule",
		func(c *rankCtx, n *store.Node) bool { return n.Schedule != "" },
		func(c *rankCtx, n *store.Node) string { return n.Schedule }},
	{"runtime",
		func(c *rankCtx, n *store.Node) bool { return !slices.Contains(n.Runtimes, c.req.Runtime) },
		func(c *rankCtx, n *store.Node) string { return "no runtime " + c.req.Runtime }},
	{"selector",
		func(c *rankCtx, n *store.Node) bool { return c.mismatch(n) != "" },
		func(c *rankCtx, n *store.Node) string { return "selector " + c.mismatch(n) }},
	{"room",
		func(c *rankCtx, n *store.Node) bool { return !fits(n, c.need) },
		func(c *rankCtx, n *store.Node) string { return "no room: " + short(n, c.need) }},
}

// epsilon absorbs the rounding of sums of fractional CPUs (0.1+0.2).
const epsilon = 1e-9

// fits reports whether need fits in n beside what it has committed: every
// resource within capacity, as the store's Place checks.
func fits(n *store.Node, need store.Resources) bool {
	return n.Committed.CPU+need.CPU <= n.Capacity.CPU+epsilon &&
		n.Committed.MemoryMiB+need.MemoryMiB <= n.Capacity.MemoryMiB &&
		n.Committed.DiskGiB+need.DiskGiB <= n.Capacity.DiskGiB &&
		n.Committed.Sandboxes+need.Sandboxes <= n.Capacity.Sandboxes
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

// rankCtx is one ranking's inputs and what it precomputes from them.
type rankCtx struct {
	req      *Request
	now      time.Time
	need     store.Resources
	avoided  map[string]bool // req.Avoid, and the caller's own
	selector []string        // req.Selector's keys, sorted
	// The spread groups of the nodes that passed, and the least and most
	// sandboxes per node among them.
	groups             map[string]group
	minShare, maxShare float64
}

func (c *rankCtx) avoid(name string) bool { return c.avoided[name] }

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
}

// Rank ranks nodes for req at time now: every node that can take the
// sandbox, best first, each with its score and parts, and every node that
// cannot, with why. Nodes whose scores are within Band of the best are
// ordered by a hash of (req.Sandbox, node) rather than by score.
func Rank(nodes []store.Node, req Request, now time.Time) Decision {
	return rank(nodes, &req, now, options{explain: true})
}

// scored is a node that passed, with its score and term values.
type scored struct {
	n      *store.Node
	score  float64
	values [len(terms)]float64 // by terms' order
	hash   uint64
	tied   bool
}

func rank(nodes []store.Node, req *Request, now time.Time, o options) Decision {
	c := &rankCtx{req: req, now: now, need: req.need(), avoided: o.avoid}
	if len(req.Avoid) > 0 {
		c.avoided = make(map[string]bool, len(req.Avoid)+len(o.avoid))
		for k := range o.avoid {
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

	d := Decision{Sandbox: req.Sandbox}
	passed := make([]int, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		refused := -1
		for f := range filters {
			if filters[f].refuses(c, n) {
				refused = f
				break
			}
		}
		if refused < 0 {
			passed = append(passed, i)
			continue
		}
		if d.Excluded == nil {
			d.Excluded = map[string]int{}
		}
		d.Excluded[filters[refused].name]++
		if o.explain {
			d.Filtered = append(d.Filtered, Filtered{Node: n.Name, Filter: filters[refused].name, Reason: filters[refused].why(c, n)})
		}
	}
	d.Passed = len(passed)
	if len(passed) == 0 {
		d.Candidates = []Candidate{}
		return d
	}

	if req.Spread != "" {
		c.groups = map[string]group{}
		for _, i := range passed {
			if v, ok := nodes[i].Labels[req.Spread]; ok {
				g := c.groups[v]
				g.nodes++
				g.sandboxes += nodes[i].Committed.Sandboxes
				c.groups[v] = g
			}
		}
		c.minShare = math.Inf(1)
		for _, g := range c.groups {
			c.minShare = min(c.minShare, g.share())
			c.maxShare = max(c.maxShare, g.share())
		}
	}

	best := math.Inf(-1)
	all := make([]scored, len(passed))
	for j, i := range passed {
		s := &all[j]
		s.n = &nodes[i]
		for t := range terms {
			s.values[t] = terms[t].value(c, s.n)
			s.score += terms[t].weight * s.values[t]
		}
		best = max(best, s.score)
	}
	seed := fnv.New64a()
	seed.Write([]byte(req.Sandbox))
	base := seed.Sum64()
	for j := range all {
		s := &all[j]
		if s.tied = s.score >= best-Band; s.tied {
			s.hash = mix(base, s.n.Name)
		}
	}
	before := func(a, b *scored) bool {
		if a.tied != b.tied {
			return a.tied
		}
		if a.tied && a.hash != b.hash {
			return a.hash < b.hash
		}
		if a.score != b.score {
			return a.score > b.score
		}
		return a.n.Name < b.n.Name
	}
	keep := len(all)
	if o.keep > 0 && o.keep < keep {
		keep = o.keep
	}
	// The first keep in order, by insertion: the scheduler keeps a few of
	// a thousand nodes, where a full sort would cost more than the rest
	// of the ranking.
	top := make([]*scored, 0, keep)
	for j := range all {
		s := &all[j]
		if len(top) == keep && !before(s, top[keep-1]) {
			continue
		}
		at := sort.Search(len(top), func(k int) bool { return before(s, top[k]) })
		if len(top) < keep {
			top = append(top, nil)
		}
		copy(top[at+1:], top[at:])
		top[at] = s
	}
	d.Candidates = make([]Candidate, len(top))
	for k, s := range top {
		cd := Candidate{Node: s.n.Name, Score: round(s.score), Tied: s.tied, Parts: make([]Part, len(terms))}
		for t := range terms {
			cd.Parts[t] = Part{Term: terms[t].name, Value: round(s.values[t]), Weighted: round(terms[t].weight * s.values[t])}
		}
		d.Candidates[k] = cd
	}
	return d
}

// mix is the tie-break hash of a sandbox (its FNV-1a hash, base) and a
// node: FNV-1a continued over the node's name, then a finaliser so that
// names differing in one letter land far apart.
func mix(base uint64, node string) uint64 {
	h := base ^ 0xff // separates "ab"+"c" from "a"+"bc"
	h *= 1099511628211
	for i := 0; i < len(node); i++ {
		h ^= uint64(node[i])
		h *= 1099511628211
	}
	// splitmix64's finaliser.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// round keeps explanations readable: four decimals.
func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }
