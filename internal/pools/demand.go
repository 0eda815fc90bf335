package pools

import (
	"context"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
)

// In a cluster the warm pools follow demand (Config.Sizer): every node
// counts the creates it places, by template version, over a rolling window
// (Rate), and reports the rate with its heartbeat (store.NodeStatus.Demand);
// each node then keeps, of each template's current version, about the
// creates it expects within Horizon: its share of the cluster's rate,
// within a budget of the smaller of --warm-pool and half (rounded up) the
// sandboxes it still has room for, so that a filling node gives most of
// its last room to the creates themselves. Room bounds the filling only:
// a burst that fills a node is about to take its warm sandboxes, and
// discarding them would slow it (a warm placement needs no room beyond
// its warm sandbox's, store.Cluster.Place). Beyond the budget the versions
// share it in proportion to their rates. A template's pool size (LABEL
// atoll.pool) is a floor. A template nobody creates drains to zero once
// the window has passed without a create: the rolling count is exact, so
// a rate falls to zero, not towards it.
//
// Prestarted processes are not bound to a template: a cold create takes
// one whatever its template. A node keeps about the cold creates it
// expects within Horizon, its share of the cluster's rate less what its
// warm pools are sized to serve, within --prestart; as for the pools, half
// its room bounds the filling, not what it keeps. None while nobody
// creates.
//
// A single machine keeps the fixed sizes: its one node is where every
// create lands, the operator sized --warm-pool for it, and a pool that
// follows demand would only start later than one kept full.

// Window is how far back Rate counts creates, and Horizon how many
// minutes of its share of the demand a node keeps warm.
const (
	Window  = 5 * time.Minute
	Horizon = 1.0
)

// rateBuckets divide Window: a create leaves the count within
// Window/rateBuckets of Window after it.
const rateBuckets = 10

// Rate counts events by key over the last Window. The zero value is ready.
type Rate struct {
	mu sync.Mutex
	// counts[i] are the events of bucket at[i] (a bucket is the time
	// since the epoch in Window/rateBuckets).
	counts [rateBuckets]map[string]int
	at     [rateBuckets]int64
}

func bucket(now time.Time) int64 { return now.UnixNano() / int64(Window/rateBuckets) }

// Add counts one event of key at now.
func (r *Rate) Add(key string, now time.Time) {
	b := bucket(now)
	i := int(b % rateBuckets)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at[i] != b || r.counts[i] == nil {
		r.at[i], r.counts[i] = b, map[string]int{}
	}
	r.counts[i][key]++
}

// PerMinute is the events a minute by key over the Window before now;
// keys without any are left out, and nil if none has.
func (r *Rate) PerMinute(now time.Time) map[string]float64 {
	b := bucket(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[string]float64
	for i := range r.counts {
		if b-r.at[i] >= rateBuckets || r.at[i] > b {
			continue
		}
		for k, n := range r.counts[i] {
			if out == nil {
				out = map[string]float64{}
			}
			out[k] += float64(n) / Window.Minutes()
		}
	}
	return out
}

// Sizer is what sizes a cluster node's warm pools.
type Sizer interface {
	// Sizing returns the cluster's demand, and how many more sandboxes
	// of the default size the node has room for, its pooled ones counted
	// as room.
	Sizing(ctx context.Context) (d store.Demand, room int, err error)
}

// want is a template version's share of the demand.
type want struct {
	key  string
	rate float64 // creates a minute, cluster-wide
	n    int
}

// share sizes pools for wants: each its expected creates on one of nodes
// within Horizon, rounded up; if they come to more than budget, each gets
// a share of budget in proportion, the remainder going to the busiest.
func share(wants []want, nodes, budget int) {
	total := 0
	for i := range wants {
		wants[i].n = int(math.Ceil(wants[i].rate * Horizon / float64(max(nodes, 1))))
		total += wants[i].n
	}
	if total <= budget {
		return
	}
	sort.SliceStable(wants, func(a, b int) bool { return wants[a].rate > wants[b].rate })
	left := max(budget, 0)
	full := make([]int, len(wants))
	for i := range wants {
		full[i] = wants[i].n
		wants[i].n = wants[i].n * max(budget, 0) / total
		left -= wants[i].n
	}
	for i := 0; left > 0; i = (i + 1) % len(wants) {
		if wants[i].n < full[i] {
			wants[i].n++
			left--
		}
	}
}

// demandTargets are the pools' targets from the cluster's demand (see
// above) and how many processes to keep prestarted; !ok if the demand
// cannot be read: the pools then stay as they are.
func (p *Service) demandTargets(ctx context.Context) (_ map[string]target, prestart, prestartKeep int, ok bool) {
	d, room, err := p.sizer.Sizing(ctx)
	if err != nil {
		p.log.Warn("reading the cluster's demand for warm pools", "err", err)
		return nil, 0, 0, false
	}
	ts, err := p.store.ListTemplates(ctx)
	if err != nil {
		return nil, 0, 0, false
	}
	type version struct {
		name string
		v    store.Template
	}
	current := map[string]version{"": {name: p.builtIn}}
	floor := map[string]int{}
	for _, t := range ts {
		current[t.Current.ID] = version{t.Name, t.Current}
		floor[t.Current.ID] = t.Current.Config.PoolSize
	}
	var wants []want
	for id, r := range d.Rates {
		// The demand for an older version of a name is the old
		// sandboxes'; new creates get the current one.
		if _, ok := current[id]; ok && r > 0 {
			wants = append(wants, want{key: id, rate: r})
		}
	}
	// What demand alone asks for is kept; what room allows, filled. A
	// burst fills the node, and discarding the warm sandboxes it is about
	// to take would only slow it.
	keep := slices.Clone(wants)
	share(keep, d.Nodes, p.poolSize)
	share(wants, d.Nodes, min(p.poolSize, (room+1)/2))
	expected, warm, warmKept := 0.0, 0, 0
	for i, w := range wants {
		expected += w.rate * Horizon / float64(max(d.Nodes, 1))
		warm += w.n
		warmKept += keep[i].n
	}
	cold := int(math.Ceil(expected))
	prestart = min(p.prestartSize, max(0, cold-warm), max(0, (room+1)/2-warm))
	prestartKeep = max(prestart, min(p.prestartSize, max(0, cold-warmKept)))
	kept := map[string]int{}
	for _, w := range keep {
		kept[w.key] = w.n
	}
	targets := map[string]target{}
	for _, w := range wants {
		if w.n > 0 || kept[w.key] > 0 {
			c := current[w.key]
			targets[Key(c.name, c.v)] = target{name: c.name, v: c.v, n: w.n, keep: kept[w.key]}
		}
	}
	for id, n := range floor {
		c := current[id]
		k := Key(c.name, c.v)
		if tg := targets[k]; n > tg.n {
			targets[k] = target{name: c.name, v: c.v, n: n, keep: max(n, tg.keep)}
		}
	}
	return targets, prestart, prestartKeep, true
}

// Count counts a create of template version v ("" the built-in) this
// node placed, for Demand.
func (p *Service) Count(v string) { p.rate.Add(v, time.Now()) }

// Demand is the creates a minute by template version this node placed
// over the last Window, for its heartbeat (store.NodeStatus.Demand).
func (p *Service) Demand() map[string]float64 { return p.rate.PerMinute(time.Now()) }
