package control

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// admission bounds the creates that start a sandbox (those the warm pool
// cannot serve): at most cap(slots) run at once, at most cap(queue) are in
// the server at all (running or waiting for a slot), and none waits longer
// than maxWait. A create over those bounds is answered at once with 503 and
// Retry-After, so that a server that cannot keep up says so instead of
// letting requests pile up until clients time out. Bounding the creates in
// flight also makes a burst faster: on a small host, many sandboxes starting
// at once mostly wait for each other (cgroup and mount locks in the kernel,
// the store's one writer).
type admission struct {
	slots   chan struct{}
	queue   chan struct{}
	maxWait time.Duration
	last    atomic.Int64 // when the last create was made (made), Unix ns
}

// Admission's defaults (Config.CreateConcurrency, CreateQueue).
const (
	// defaultCreatesPerCPU creates in flight per core keep a core busy
	// while others wait for the kernel (RCU grace periods as mounts go,
	// the spawn helper, a process's exit) or the disk. With 2 a core, a
	// sustained run left the machine idle 12% of the time; 4 took 4% more
	// creates a second and started a burst's sandboxes sooner
	// (docs/benchmarks.md).
	defaultCreatesPerCPU = 4
	// defaultCreateQueue creates may wait for a slot: a burst of hundreds
	// from a harness is served in order rather than refused, while a
	// flood beyond it is refused early.
	defaultCreateQueue = 256
	// createMaxWait bounds a create's wait for a slot, well inside the
	// timeouts of HTTP clients (the SDKs' and E2B's are 60 s and more).
	createMaxWait = 30 * time.Second
	// createRetryAfter is what a refused create is told to wait: about the
	// time a slot takes to free up under load.
	createRetryAfter = time.Second
)

func newAdmission(concurrent, queue int) *admission {
	return &admission{
		slots:   make(chan struct{}, concurrent),
		queue:   make(chan struct{}, concurrent+queue),
		maxWait: createMaxWait,
	}
}

// quiet is how long after a create a node counts as busy with creates
// (inFlight): the gaps between a burst's creates are not a lull.
const quiet = time.Second

// inFlight reports whether creates are starting sandboxes or waiting to,
// or one was made in the last quiet.
func (a *admission) inFlight() bool {
	return len(a.queue) > 0 || time.Since(time.Unix(0, a.last.Load())) < quiet
}

// made notes a create made now, for inFlight.
func (a *admission) made() { a.last.Store(time.Now().UnixNano()) }

// busy is the answer to a create the server cannot take now.
func busy(why string) error {
	return &errdefs.Busy{Kind: errdefs.ErrUnavailable, Msg: "server busy: " + why + "; retry after the Retry-After header's seconds", After: createRetryAfter}
}

// enter waits for a create slot and returns the function that gives it back,
// or a Busy error if the queue is full, the wait too long or ctx done.
func (a *admission) enter(ctx context.Context) (leave func(), err error) {
	select {
	case a.queue <- struct{}{}:
	default:
		return nil, busy("too many creates waiting")
	}
	t := time.NewTimer(a.maxWait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return func() { a.made(); <-a.slots; <-a.queue }, nil
	case <-t.C:
		<-a.queue
		return nil, busy("creates are waiting too long")
	case <-ctx.Done():
		// Nobody reads the answer; this one keeps it out of the log's
		// internal errors.
		<-a.queue
		return nil, busy("the client went away")
	}
}
