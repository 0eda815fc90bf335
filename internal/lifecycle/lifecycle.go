// Package lifecycle is the sandbox state machine as data: every state a
// sandbox can be in, public or internal, every transition between them with
// the operations that make it, which states the API shows, and what
// recovery does with a sandbox found in each state when the server starts.
// internal/control moves sandboxes only through Check, and
// docs/lifecycle.md's diagram is rendered from these tables (Diagram), so
// the code, the docs and recovery cannot drift apart.
package lifecycle

import (
	"fmt"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Internal states, which the API never shows.
const (
	// Pooled: started ahead of demand for a warm pool, handed out to a
	// create that matches (store.StatePooled; the store leaves it out of
	// use counts).
	Pooled = "pooled"
	// Prestarted: a sandbox process started ahead of demand, not yet bound
	// to files; a create, fork child or create from a snapshot takes one
	// (store.StatePrestarted; quotas leave it out).
	Prestarted = "prestarted"
	// Building: the sandbox of a Dockerfile RUN step.
	Building = "building"
)

// Any stands for every state in a Transition's From.
const Any = "*"

// Recovery is what the server does at start-up with a sandbox its store
// records in a state (internal/control maps each to the code that does it).
type Recovery string

const (
	// Discard: never acknowledged, so every trace of it goes.
	Discard Recovery = "discard: never acknowledged, every trace goes"
	// FinishDelete: the delete goes on to the end.
	FinishDelete Recovery = "finish the delete"
	// FinishStopped: a start or stop cut short ends stopped.
	FinishStopped Recovery = "finish as stopped"
	// Readopt: a sandbox whose init lives on is adopted again, its freezer
	// set as the record says; one that died is stopped.
	Readopt Recovery = "re-adopt if its init lives (freezer set as recorded), else stop"
	// SettleSuspend: a suspend cut short goes back to running if it can
	// (restored from a whole image if need be), else stops; a suspended one
	// waits for resume, anything left of a cut-short restore ended.
	SettleSuspend Recovery = "settle the suspend: back to running if it can, else stopped; suspended stays"
	// Cleanup: nothing runs; what a cut-short operation left is removed.
	Cleanup Recovery = "remove what a cut-short operation left running"
	// SettleArchive: with its local files it goes back to stopped, without
	// them (the object is whole) it is archived.
	SettleArchive Recovery = "stopped if its files are still local, else archived"
	// DropRestore: the files of a restore from the archive cut short go.
	// Relinquish: the cluster fenced this node and marked the sandbox
	// lost; whatever of it still runs here stops, and its record is left
	// for the cluster to restore elsewhere.
	Relinquish  Recovery = "stop what of it still runs here; the cluster restores it elsewhere"
	DropRestore Recovery = "remove the files of a cut-short restore"
)

// State describes one state.
type State struct {
	Name string
	// Visible: the API shows sandboxes in this state.
	Visible bool
	// Live: its processes exist (maybe frozen), so its init can die on its
	// own and a timeout applies.
	Live bool
	// Recover is what start-up does with a sandbox found in it.
	Recover Recovery
}

// States lists every state a sandbox record can hold.
var States = []State{
	{Name: api.StateCreating, Visible: true, Recover: Discard},
	{Name: Pooled, Recover: Discard},
	{Name: Prestarted, Recover: Discard},
	{Name: Building, Recover: Discard},
	{Name: api.StateStarting, Visible: true, Recover: FinishStopped},
	{Name: api.StateRunning, Visible: true, Live: true, Recover: Readopt},
	{Name: api.StatePaused, Visible: true, Live: true, Recover: Readopt},
	{Name: api.StateSuspending, Visible: true, Recover: SettleSuspend},
	{Name: api.StateSuspended, Visible: true, Recover: SettleSuspend},
	{Name: api.StateShelved, Visible: true, Recover: Cleanup},
	{Name: api.StateStopping, Visible: true, Recover: FinishStopped},
	{Name: api.StateStopped, Visible: true, Recover: Cleanup},
	{Name: api.StateArchiving, Visible: true, Recover: SettleArchive},
	{Name: api.StateArchived, Visible: true, Recover: DropRestore},
	{Name: api.StateError, Visible: true, Recover: Cleanup},
	{Name: api.StateDeleting, Visible: true, Recover: FinishDelete},
	{Name: api.StateLost, Visible: true, Recover: Relinquish},
}

// Transition is one allowed change of state.
type Transition struct {
	From, To string
	// By names the operations that make it.
	By string
}

// Transitions lists every allowed change of state. "" as From is a record
// made in To; api.StateDeleted as To is the record's removal, which the
// store records. A write that keeps the state is not a transition and is
// always allowed.
var Transitions = []Transition{
	{"", api.StateCreating, "create, fork"},
	{Prestarted, api.StateCreating, "create, fork (taking a prestarted process)"},
	{api.StateCreating, api.StateRunning, "create, fork (the agent answers)"},
	{"", Pooled, "warm pool fill"},
	{Pooled, api.StateRunning, "create (handed out of the pool)"},
	{"", Prestarted, "prestart"},
	{"", Building, "Dockerfile RUN step"},

	{api.StateRunning, api.StatePaused, "pause"},
	{api.StatePaused, api.StateRunning, "resume"},
	{api.StateRunning, api.StateSuspending, "pause to disk"},
	{api.StateSuspending, api.StateSuspended, "pause to disk"},
	{api.StateSuspending, api.StateRunning, "pause to disk failed, recovery"},
	{api.StateSuspended, api.StateRunning, "resume (restored from its image)"},
	{api.StateRunning, api.StateShelved, "pause without memory"},
	{api.StatePaused, api.StateShelved, "pause without memory"},
	{api.StateShelved, api.StateRunning, "resume (booted over its files)"},
	{api.StateShelved, api.StateError, "pause without memory failed"},

	{api.StateRunning, api.StateStopping, "stop, timeout, auto-stop, init exited, restore"},
	{api.StatePaused, api.StateStopping, "stop, timeout, init exited, restore"},
	{api.StateSuspended, api.StateStopping, "stop, restore"},
	{api.StateSuspending, api.StateStopping, "pause to disk failed, recovery"},
	{api.StateStarting, api.StateStopping, "recovery"},
	{api.StateStopping, api.StateStopped, "stop"},
	{api.StateShelved, api.StateStopped, "stop"},
	{api.StateStopped, api.StateStarting, "start, restore"},
	{api.StateStarting, api.StateRunning, "start"},
	{api.StateStarting, api.StateStopped, "start failed"},

	{api.StateStopped, api.StateArchiving, "archive, auto-archive"},
	{api.StateArchiving, api.StateArchived, "archive, recovery"},
	{api.StateArchiving, api.StateStopped, "archive failed, recovery"},
	{api.StateArchived, api.StateStopped, "start (files restored)"},

	{api.StateCreating, api.StateError, "recovery (runtime gone)"},
	{api.StateStarting, api.StateError, "recovery (runtime gone)"},
	{api.StateRunning, api.StateError, "recovery (runtime gone)"},
	{api.StateStopped, api.StateError, "recovery (runtime gone)"},
	{api.StateStopping, api.StateError, "stop failed, recovery (runtime gone)"},

	{Any, api.StateDeleting, "delete, auto-delete, ephemeral stop"},
	{Any, api.StateLost, "its node's lease expired (cluster)"},
	{api.StateLost, api.StateArchived, "restore on another node, from its archive or checkpoint (cluster)"},
	{api.StateDeleting, api.StateDeleted, "delete"},
	{api.StateCreating, api.StateDeleted, "create failed, recovery"},
	{Pooled, api.StateDeleted, "pool drained, recovery"},
	{Prestarted, api.StateDeleted, "prestarted discarded, recovery"},
	{Building, api.StateDeleted, "RUN step done, recovery"},
}

// RuntimeGone lists the states from which recovery records a sandbox
// whose runtime this server no longer has as error; each has its
// transition to error above.
var RuntimeGone = []string{api.StateRunning, api.StateStarting, api.StateStopping, api.StateStopped, api.StateCreating}

var (
	byName  = map[string]State{}
	allowed = map[[2]string]bool{}
	sources = map[string][]string{}
)

func init() {
	for _, st := range States {
		byName[st.Name] = st
	}
	for _, t := range Transitions {
		allowed[[2]string{t.From, t.To}] = true
	}
	targets := []string{api.StateDeleted} // a removal, not a state of States
	for _, st := range States {
		targets = append(targets, st.Name)
	}
	for _, to := range targets {
		for _, from := range States {
			if from.Name != to && Check(from.Name, to) == nil {
				sources[to] = append(sources[to], from.Name)
			}
		}
	}
}

// Sources returns the states from which a sandbox may move to state to (a
// write that keeps to is not a move), in States' order: what a store
// checks in the same write as the move (store.Sandboxes.Delete).
func Sources(to string) []string { return sources[to] }

// Lookup returns the description of state name.
func Lookup(name string) (State, bool) {
	st, ok := byName[name]
	return st, ok
}

// Visible reports whether the API shows a sandbox in state name.
func Visible(name string) bool { return byName[name].Visible }

// Live reports whether a sandbox in state name has processes (maybe
// frozen).
func Live(name string) bool { return byName[name].Live }

// Check returns nil if a sandbox may go from state from to state to (or
// stays in it), and otherwise an errdefs.ErrConflict naming both.
func Check(from, to string) error {
	if from == to || allowed[[2]string{from, to}] || from != "" && allowed[[2]string{Any, to}] {
		return nil
	}
	if from == "" {
		from = "nothing"
	}
	return fmt.Errorf("%w: no transition from %s to %s", errdefs.ErrConflict, from, to)
}
