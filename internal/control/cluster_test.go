package control

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/lifecycle"
	"github.com/atoll-dev/atoll/internal/node"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// These tests run a Service as node "a" of a cluster over the real SQLite
// store, with a real layer store and the real ns runtime. The rows of the
// other node, "b", are written into the store directly: nothing of b runs.

// clusterNode is a Service named name over st, with what the test needs
// to look under it.
type clusterNode struct {
	*Service
	st      store.Store
	rt      runtime.Runtime
	runRoot string
}

// newClusterNode starts a Service named name over st (a fresh SQLite store
// if nil) with cfg's Placer, Peers and WarmPool.
func newClusterNode(t *testing.T, name string, st store.Store, cfg Config) *clusterNode {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.Dir(t)
	if st == nil {
		sq, err := sqlite.Open(filepath.Join(dir, "atoll.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sq.Close() })
		st = sq
	}
	ls := testenv.Layers(t, dir)
	runRoot := filepath.Join(dir, "run")
	rt, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", runRoot).Run() })
	cfg.Store = st
	cfg.Node = node.New(node.Config{Name: name, Runtimes: []runtime.Runtime{rt}, Layers: ls, AgentPath: testenv.AgentBinary(t)})
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever a test leaves running goes with it.
	t.Cleanup(func() {
		ids, _ := ls.WritableIDs()
		for _, id := range ids {
			_ = rt.Cleanup(context.Background(), id)
			_ = ls.RemoveWritable(id)
		}
	})
	return &clusterNode{Service: s, st: st, rt: rt, runRoot: runRoot}
}

// alive reports whether sandbox id's init, as its row records it, runs.
func (n *clusterNode) alive(t *testing.T, id string) bool {
	t.Helper()
	sb, err := n.st.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.PID != 0 && n.rt.Alive(instance(sb))
}

// run runs n's Run loop for d.
func (n *clusterNode) run(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	n.Run(ctx)
}

// insert records sb as is (its Node too) in st, as another node or the
// placer would.
func insert(t *testing.T, st store.Store, sb store.Sandbox) store.Sandbox {
	t.Helper()
	if sb.ID == "" {
		sb.ID = newID()
	}
	if sb.Runtime == "" {
		sb.Runtime = "ns"
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = time.Now().UTC()
	}
	sb.CPU, sb.MemoryMiB, sb.DiskGiB, sb.PIDs = 1, 256, 1, 256
	if err := st.Create(context.Background(), &sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

// history is a sandbox's row and transitions, to compare before and after.
func history(t *testing.T, st store.Store, id string) (string, int) {
	t.Helper()
	ctx := context.Background()
	tr, err := st.Transitions(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := st.Get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "gone", len(tr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sb.State, len(tr)
}

// TestClusterNodeScope checks that a node's Recover, sweeps and lifecycle
// policies act on its own rows only: each row of node b below is one that
// node a would change (stop, delete, discard) were it a's, and the same
// rows of a are changed.
func TestClusterNodeScope(t *testing.T) {
	ctx := context.Background()
	a := newClusterNode(t, "a", nil, Config{})
	past := time.Now().UTC().Add(-time.Hour)
	old := time.Now().UTC().Add(-2 * placedTTL)
	rows := func(nodeName string) map[string]string {
		ids := map[string]string{}
		for what, sb := range map[string]store.Sandbox{
			// Recover would stop it: its init (none) is dead.
			"running, dead": {Sandbox: api.Sandbox{State: api.StateRunning}},
			// Recover would discard it, and so would the placed-row sweep.
			"creating, old": {Sandbox: api.Sandbox{State: api.StateCreating, CreatedAt: old}},
			// Recover would finish its delete.
			"deleting": {Sandbox: api.Sandbox{State: api.StateDeleting}},
			// auto-delete is due.
			"stopped, ephemeral": {Sandbox: api.Sandbox{State: api.StateStopped, Ephemeral: true, StoppedAt: &past}},
			// The pools discard it.
			"pooled": {Sandbox: api.Sandbox{State: lifecycle.Pooled}},
		} {
			sb.Node = nodeName
			ids[what] = insert(t, a.st, sb).ID
		}
		return ids
	}
	theirs, mine := rows("b"), rows("a")
	type hist struct {
		state string
		n     int
	}
	before := map[string]hist{}
	for what, id := range theirs {
		st, n := history(t, a.st, id)
		before[what] = hist{st, n}
	}

	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	a.run(2500 * time.Millisecond) // at least two sweeps and policy rounds

	for what, id := range theirs {
		if st, n := history(t, a.st, id); (hist{st, n}) != before[what] {
			t.Errorf("b's %s sandbox: now %s with %d transitions, was %+v: node a touched it", what, st, n, before[what])
		}
	}
	// The same rows of a's own were settled.
	for what, want := range map[string]string{
		"running, dead": api.StateStopped, "creating, old": "gone", "deleting": "gone",
		"stopped, ephemeral": "gone", "pooled": "gone",
	} {
		if st, _ := history(t, a.st, mine[what]); st != want {
			t.Errorf("a's %s sandbox is %s, want %s", what, st, want)
		}
	}

	// An operation asked of a about b's sandbox is refused for the
	// cluster layer to route, and changes nothing.
	id := theirs["running, dead"]
	for op, do := range map[string]func() error{
		"stop":   func() error { _, err := a.Stop(ctx, id); return err },
		"delete": func() error { return a.Delete(ctx, id) },
		"agent":  func() error { _, err := a.AgentDialer(ctx, id); return err },
	} {
		var e *ElsewhereError
		if err := do(); !errors.As(err, &e) || e.Node != "b" || !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%s of b's sandbox on a: %v, want an ElsewhereError naming b", op, err)
		}
	}
	// b's lost sandbox: no node runs it, so nothing is to be routed, and
	// the refusal says why.
	lost := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateLost, Node: "b",
		Error: "node b was fenced: lease expired"}}).ID
	for op, do := range map[string]func() error{
		"stop":   func() error { _, err := a.Stop(ctx, lost); return err },
		"delete": func() error { return a.Delete(ctx, lost) },
		"agent":  func() error { _, err := a.AgentDialer(ctx, lost); return err },
	} {
		if err := do(); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "is lost: node b was fenced") {
			t.Errorf("%s of b's lost sandbox on a: %v, want a conflict saying it is lost", op, err)
		}
	}
	if st, n := history(t, a.st, id); (hist{st, n}) != before["running, dead"] {
		t.Errorf("b's sandbox is %s with %d transitions after a refused operations on it, was %+v", st, n, before["running, dead"])
	}

	// The API still lists the whole cluster's sandboxes.
	all, err := a.List(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	for _, sb := range all {
		nodes[sb.Node]++
	}
	if nodes["b"] != 5 || nodes["a"] != 1 { // b's pooled row is hidden, its lost one shown
		t.Errorf("List shows %v sandboxes by node, want b:5 a:1", nodes)
	}
}

// placer places every sandbox on node to, as the scheduler would (here
// over SQLite, whose Create honours sb.Node), and counts its calls.
type placer struct {
	st    store.Store
	to    string
	warm  bool // the placements reserve a warm sandbox, their records say
	calls atomic.Int32
	last  string // the ID of the last sandbox placed
}

func (p *placer) Place(ctx context.Context, sb *store.Sandbox, _ api.CreateSandboxRequest, _ string) error {
	p.calls.Add(1)
	sb.Node, p.last = p.to, sb.ID
	if p.warm {
		sb.Warm, sb.Placement = true, json.RawMessage(`{"sandbox":"`+sb.ID+`","node":"`+p.to+`","warm":true}`)
	}
	return p.st.Create(ctx, sb)
}

// peers records the RunOn calls it gets; the node-to-node transport is
// another package's.
type peers struct {
	mu    sync.Mutex
	calls [][2]string
}

func (p *peers) RunOn(_ context.Context, node, id string) (api.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, [2]string{node, id})
	return api.Sandbox{ID: id, Node: node, State: api.StateRunning}, nil
}

func (p *peers) StartOn(_ context.Context, node, id string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrUnavailable
}

// TestClusterCreatePlaced checks that a create goes through the placer:
// placed here, it runs here; placed on b, b is asked to run it and a
// starts nothing.
func TestClusterCreatePlaced(t *testing.T) {
	ctx := context.Background()
	pl, pe := &placer{to: "a"}, &peers{}
	a := newClusterNode(t, "a", nil, Config{Placer: pl, Peers: pe})
	pl.st = a.st
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}

	got, err := a.Create(ctx, api.CreateSandboxRequest{Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning || got.Node != "a" || pl.calls.Load() != 1 {
		t.Errorf("placed here: %s on %q after %d placements, want running on a after 1", got.State, got.Node, pl.calls.Load())
	}
	if !a.alive(t, got.ID) {
		t.Error("placed here: its init does not run")
	}
	if len(pe.calls) != 0 {
		t.Errorf("placed here, yet a peer was asked: %v", pe.calls)
	}
	if res, err := a.agentClient(a.sock(t, got.ID)).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the placed sandbox: %+v, %v", res, err)
	}

	pl.to = "b"
	got, err = a.Create(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pe.calls) != 1 || pe.calls[0] != [2]string{"b", got.ID} {
		t.Fatalf("placed on b: peers were asked %v, want b to run %s", pe.calls, got.ID)
	}
	row, err := a.st.Get(ctx, got.ID)
	if err != nil || row.Node != "b" || row.State != api.StateCreating {
		t.Errorf("placed on b: row %+v (%v), want b's, creating, for b to run", row, err)
	}
	if a.layers.WritableExists(got.ID) {
		t.Error("placed on b: node a made its writable layer")
	}

	// Without peers, a sandbox placed elsewhere is a clear 503.
	a.peers = nil
	if _, err := a.Create(ctx, api.CreateSandboxRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("placed on b with no peers: %v, want unavailable", err)
	}
}

// sock is the agent socket of running sandbox id.
func (n *clusterNode) sock(t *testing.T, id string) string {
	t.Helper()
	sb, err := n.st.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Socket
}

// TestClusterPoolServesPlacement checks that in a cluster a create is
// placed even when this node's warm pool could serve it (placement checks
// every create), that the node it is placed on serves it from its pool
// (the pooled sandbox, under its own ID, replaces the placed row), and
// that a create placed on another node leaves this node's pool alone.
func TestClusterPoolServesPlacement(t *testing.T) {
	ctx := context.Background()
	pl := &placer{to: "a"}
	a := newClusterNode(t, "a", nil, Config{Placer: pl, Peers: &peers{}, WarmPool: 1})
	pl.st = a.st
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	filled := func() {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); a.Pooled()[""] != 1; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the warm pool was not filled: %v", a.Pooled())
			}
		}
	}
	filled()
	pooled := ""
	if sbs, err := a.st.ListNode(ctx, "a"); err == nil {
		for _, sb := range sbs {
			if sb.State == lifecycle.Pooled {
				pooled = sb.ID
			}
		}
	}
	// A cold placement starts cold, warm sandbox or not: a warm
	// placement may be on its way for it.
	got, err := a.Create(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != pl.last || got.State != api.StateRunning || a.Pooled()[""] != 1 {
		t.Errorf("placed cold: %s %s, pool %v; want the placed sandbox %s running, the pool left", got.ID, got.State, a.Pooled(), pl.last)
	}
	pl.warm = true
	got, err = a.Create(ctx, api.CreateSandboxRequest{Labels: map[string]string{"k": "v"}, Env: map[string]string{"E": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if pl.calls.Load() != 2 {
		t.Errorf("a create with a warm sandbox here took %d placements in all, want 2", pl.calls.Load())
	}
	if got.ID != pooled || got.Node != "a" || got.State != api.StateRunning || got.Labels["k"] != "v" {
		t.Errorf("served warm: %s %s on %q, labels %v; want the pooled sandbox %s running on a", got.ID, got.State, got.Node, got.Labels, pooled)
	}
	if _, err := a.st.Get(ctx, pl.last); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the placed row %s served warm is still there: %v", pl.last, err)
	}
	if res, err := a.agentClient(a.sock(t, got.ID)).Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", "test \"$E\" = 1"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the sandbox served warm, with its environment: %+v, %v", res, err)
	}

	// Placed on b, the create leaves this node's pool as it is.
	filled()
	pl.to = "b"
	got, err = a.Create(ctx, api.CreateSandboxRequest{NodeSelector: map[string]string{"zone": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != "b" || pl.calls.Load() != 3 || a.Pooled()[""] != 1 {
		t.Errorf("placed on b: on %q after %d placements, pool %v; want placed on b, the pool left", got.Node, pl.calls.Load(), a.Pooled())
	}
}

// TestClusterRunPlaced checks RunPlaced: it runs a row placed on this node
// and refuses others; and that the sweep discards a placed row nobody ran
// once it is old, unless an operation here holds it.
func TestClusterRunPlaced(t *testing.T) {
	ctx := context.Background()
	a := newClusterNode(t, "a", nil, Config{})
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	placed := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateCreating, Node: "a"}})
	got, err := a.RunPlaced(ctx, placed.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning || !a.alive(t, placed.ID) {
		t.Errorf("RunPlaced: %s, alive %v; want running", got.State, a.alive(t, placed.ID))
	}
	if _, err := a.RunPlaced(ctx, placed.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("RunPlaced of a running sandbox: %v, want conflict", err)
	}
	theirs := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateCreating, Node: "b"}})
	if _, err := a.RunPlaced(ctx, theirs.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("RunPlaced of b's sandbox: %v, want conflict", err)
	}
	if st, _ := history(t, a.st, theirs.ID); st != api.StateCreating {
		t.Errorf("b's placed sandbox is %s after a refused it, want creating", st)
	}
	if _, err := a.RunPlaced(ctx, newID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RunPlaced of no sandbox: %v, want not found", err)
	}
	if _, err := a.RunPlaced(ctx, "../../etc/passwd"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("RunPlaced of a malformed ID: %v, want invalid", err)
	}

	// Placed rows nobody ran: a young one stays, an old one an operation
	// here began on (holds, or held: a fork's child between its record
	// and its start) stays, an old one nothing here began on goes.
	old := time.Now().UTC().Add(-2 * placedTTL)
	young := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateCreating, Node: "a"}})
	held := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateCreating, Node: "a", CreatedAt: old}})
	stale := insert(t, a.st, store.Sandbox{Sandbox: api.Sandbox{State: api.StateCreating, Node: "a", CreatedAt: old}})
	unlock := a.lock(held.ID)
	sbs, err := a.st.ListNode(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	a.sweepPlaced(ctx, sbs)
	unlock()
	for id, want := range map[string]string{young.ID: api.StateCreating, held.ID: api.StateCreating, stale.ID: "gone", theirs.ID: api.StateCreating} {
		if st, _ := history(t, a.st, id); st != want {
			t.Errorf("after the sweep, placed row %s is %s, want %s", id, st, want)
		}
	}
	// What the sweep discarded cannot be run after all.
	if _, err := a.RunPlaced(ctx, stale.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RunPlaced of a swept row: %v, want not found", err)
	}
}

// fencing stands in for store.Cluster.As(node, epoch), which no store of
// this tree implements yet, over the real SQLite store: once fence is
// called, every sandbox write is refused with store.ErrFenced, as the
// cluster store refuses the writes of an epoch that is no longer live.
type fencing struct {
	store.Store
	fenced atomic.Bool
	writes atomic.Int32 // refused
}

func (f *fencing) refuse() error {
	if f.fenced.Load() {
		f.writes.Add(1)
		return store.ErrFenced
	}
	return nil
}

func (f *fencing) Create(ctx context.Context, sb *store.Sandbox) error {
	if err := f.refuse(); err != nil {
		return err
	}
	return f.Store.Create(ctx, sb)
}

func (f *fencing) Update(ctx context.Context, sb *store.Sandbox, from ...string) error {
	if err := f.refuse(); err != nil {
		return err
	}
	return f.Store.Update(ctx, sb, from...)
}

func (f *fencing) UpdateAll(ctx context.Context, sbs []*store.Sandbox, from ...string) error {
	if err := f.refuse(); err != nil {
		return err
	}
	return f.Store.UpdateAll(ctx, sbs, from...)
}

func (f *fencing) Delete(ctx context.Context, id string, from ...string) (store.Sandbox, error) {
	if err := f.refuse(); err != nil {
		return store.Sandbox{}, err
	}
	return f.Store.Delete(ctx, id, from...)
}

func newFencedNode(t *testing.T) (*clusterNode, *fencing) {
	t.Helper()
	sq, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	f := &fencing{Store: sq}
	a := newClusterNode(t, "a", f, Config{})
	if err := a.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a, f
}

// TestClusterFencedWrite checks that a write the cluster refuses as fenced
// reaches the caller as unavailable, stops the sandbox here, and is not
// retried by the policies; and that creates are refused too.
func TestClusterFencedWrite(t *testing.T) {
	ctx := context.Background()
	a, f := newFencedNode(t)
	sb, err := a.Create(ctx, api.CreateSandboxRequest{TimeoutSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.fenced.Store(true)
	_, err = a.Stop(ctx, sb.ID)
	if !errors.Is(err, errdefs.ErrUnavailable) || !store.IsFenced(err) {
		t.Fatalf("Stop on a fenced node: %v, want unavailable (fenced)", err)
	}
	if a.alive(t, sb.ID) {
		t.Error("the fenced sandbox still runs here")
	}
	if st, _ := history(t, a.st, sb.ID); st != api.StateRunning {
		t.Errorf("the fenced sandbox's row is %s, want running as it was", st)
	}
	// Its timeout is due now; the policies must not try to stop it again.
	refused := f.writes.Load()
	time.Sleep(1100 * time.Millisecond)
	a.run(2100 * time.Millisecond)
	if n := f.writes.Load() - refused; n != 0 {
		t.Errorf("the policies tried %d more writes of the fenced sandbox", n)
	}
	if _, err := a.Create(ctx, api.CreateSandboxRequest{}); !errors.Is(err, errdefs.ErrUnavailable) || !store.IsFenced(err) {
		t.Errorf("Create on a fenced node: %v, want unavailable (fenced)", err)
	}
	if ids, _ := a.layers.WritableIDs(); len(ids) != 1 {
		t.Errorf("writable layers after a refused create: %v, want only the first sandbox's", ids)
	}
}

// TestClusterRelinquish checks that Relinquish stops every sandbox process
// of the node without a write to the store, and that the node starts
// nothing afterwards.
func TestClusterRelinquish(t *testing.T) {
	ctx := context.Background()
	a, f := newFencedNode(t)
	var ids []string
	for range 2 {
		sb, err := a.Create(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	pre, err := a.Prestart(ctx) // a process no row of a running sandbox names
	if err != nil {
		t.Fatal(err)
	}
	preDir := filepath.Join(a.runRoot, pre.ID)
	if _, err := os.Stat(preDir); err != nil {
		t.Fatalf("the prestarted sandbox has no run directory: %v", err)
	}
	f.fenced.Store(true)
	if err := a.Relinquish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if a.alive(t, id) {
			t.Errorf("sandbox %s runs on after Relinquish", id)
		}
		if st, _ := history(t, a.st, id); st != api.StateRunning {
			t.Errorf("sandbox %s's row is %s, want running: Relinquish writes nothing", id, st)
		}
	}
	if n := f.writes.Load(); n != 0 {
		t.Errorf("Relinquish tried %d writes", n)
	}
	if _, err := os.Stat(preDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the prestarted sandbox's run directory is left after Relinquish: %v", err)
	}
	f.fenced.Store(false) // even if the store took it, the node starts nothing
	if _, err := a.Create(ctx, api.CreateSandboxRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Create after Relinquish: %v, want unavailable", err)
	}
	if _, err := a.RunPlaced(ctx, newID()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("RunPlaced after Relinquish: %v, want unavailable", err)
	}
}

// TestClusterLostLeftAlone checks that a sandbox the cluster recorded lost
// while the node ran has its processes stopped here and is otherwise left
// alone: no policy (its timeout is past) and no sweep writes it.
func TestClusterLostLeftAlone(t *testing.T) {
	ctx := context.Background()
	a, _ := newFencedNode(t)
	sb, err := a.Create(ctx, api.CreateSandboxRequest{TimeoutSec: 1})
	if err != nil {
		t.Fatal(err)
	}
	// What Cluster.Expire does to it.
	row, err := a.st.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	row.LostFrom, row.State = row.State, api.StateLost
	if err := a.st.Update(ctx, &row, api.StateRunning); err != nil {
		t.Fatal(err)
	}
	_, n := history(t, a.st, sb.ID)
	time.Sleep(1100 * time.Millisecond) // its timeout is due
	a.run(2100 * time.Millisecond)
	if a.alive(t, sb.ID) {
		t.Error("the lost sandbox still runs here")
	}
	if st, m := history(t, a.st, sb.ID); st != api.StateLost || m != n {
		t.Errorf("the lost sandbox is %s with %d transitions, want lost with %d", st, m, n)
	}
	// A restart's Recover stops it too (lifecycle.Relinquish) and keeps it.
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if st, m := history(t, a.st, sb.ID); st != api.StateLost || m != n {
		t.Errorf("after Recover the lost sandbox is %s with %d transitions, want lost with %d", st, m, n)
	}
}
