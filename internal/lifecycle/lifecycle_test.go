package lifecycle

import (
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

var update = flag.Bool("update", false, "rewrite docs/lifecycle.md's generated part from the tables")

const (
	docPath  = "../../docs/lifecycle.md"
	docBegin = "<!-- BEGIN generated from internal/lifecycle: go test ./internal/lifecycle -run TestDoc -update -->\n"
	docEnd   = "<!-- END generated -->\n"
)

// TestDoc checks that docs/lifecycle.md shows the tables as they are.
func TestDoc(t *testing.T) {
	raw, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, docBegin), strings.Index(doc, docEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated markers %q … %q", docPath, docBegin, docEnd)
	}
	got, want := doc[i+len(docBegin):j], Doc()
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(docPath, []byte(doc[:i+len(docBegin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's state diagram differs from the tables; run go test ./internal/lifecycle -run TestDoc -update\n got:\n%s\nwant:\n%s", docPath, got, want)
}

// TestTables checks the tables against each other: every state named by a
// transition is declared, every declared state can be reached from a new
// record and can reach its removal, and the internal states match the
// store's.
func TestTables(t *testing.T) {
	if Pooled != store.StatePooled {
		t.Errorf("Pooled is %q, store.StatePooled %q", Pooled, store.StatePooled)
	}
	if Prestarted != store.StatePrestarted {
		t.Errorf("Prestarted is %q, store.StatePrestarted %q", Prestarted, store.StatePrestarted)
	}
	seen := map[string]bool{}
	for _, st := range States {
		if seen[st.Name] {
			t.Errorf("state %s declared twice", st.Name)
		}
		seen[st.Name] = true
		if st.Recover == "" {
			t.Errorf("state %s has no recovery", st.Name)
		}
	}
	for _, tr := range Transitions {
		for _, s := range []string{tr.From, tr.To} {
			if s != "" && s != Any && s != api.StateDeleted && !seen[s] {
				t.Errorf("transition %s → %s names undeclared state %q", tr.From, tr.To, s)
			}
		}
		if tr.By == "" {
			t.Errorf("transition %s → %s names no operation", tr.From, tr.To)
		}
	}
	reach := func(from string, forward bool) map[string]bool {
		got := map[string]bool{from: true}
		for changed := true; changed; {
			changed = false
			for _, tr := range Transitions {
				a, b := tr.From, tr.To
				if !forward {
					a, b = b, a
				}
				// Any as a source reaches forward from every state,
				// and backward it stands for every state.
				if (got[a] || a == Any && forward) && !got[b] && (b != Any || !forward) {
					got[b], changed = true, true
				}
			}
		}
		return got
	}
	fromNew, toGone := reach("", true), reach(api.StateDeleted, false)
	for _, st := range States {
		if !fromNew[st.Name] {
			t.Errorf("state %s cannot be reached from a new record", st.Name)
		}
		if !toGone[st.Name] && !toGone[Any] {
			t.Errorf("state %s cannot be deleted", st.Name)
		}
	}
	for _, s := range RuntimeGone {
		if Check(s, api.StateError) != nil {
			t.Errorf("RuntimeGone names %s, which has no transition to error", s)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		ok       bool
	}{
		{api.StateRunning, api.StatePaused, true},
		{api.StateRunning, api.StateRunning, true}, // a write that keeps the state
		{api.StateArchived, api.StateDeleting, true},
		{Pooled, api.StateDeleting, true},
		{"", api.StateCreating, true},
		{"", api.StateRunning, false},
		{api.StateStopped, api.StateRunning, false}, // through starting
		{api.StateArchived, api.StateRunning, false},
		{api.StatePaused, api.StateSuspending, false},
		{api.StateDeleting, api.StateRunning, false},
		{Prestarted, Pooled, false},
	} {
		err := Check(tc.from, tc.to)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q, %q) = %v, want ok %v", tc.from, tc.to, err, tc.ok)
		}
		if err != nil && (!errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), tc.to)) {
			t.Errorf("Check(%q, %q) = %v, want a conflict naming both", tc.from, tc.to, err)
		}
	}
	if !Visible(api.StateRunning) || Visible(Pooled) || Visible(Building) || Visible(Prestarted) {
		t.Error("Visible disagrees with the table")
	}
}

// TestSources: the states a store is asked to accept a move from are
// exactly those Check allows, for a removal as for a state.
func TestSources(t *testing.T) {
	deletable := map[string]bool{}
	for _, s := range Sources(api.StateDeleted) {
		deletable[s] = true
	}
	for _, want := range []string{api.StateDeleting, api.StateCreating, Pooled, Prestarted, Building} {
		if !deletable[want] {
			t.Errorf("Sources(deleted) = %v, lacks %s", Sources(api.StateDeleted), want)
		}
	}
	for _, to := range append([]string{api.StateDeleted}, api.StateRunning, api.StateStopped, api.StateDeleting) {
		from := map[string]bool{}
		for _, s := range Sources(to) {
			from[s] = true
		}
		for _, st := range States {
			if allowed := st.Name != to && Check(st.Name, to) == nil; allowed != from[st.Name] {
				t.Errorf("%s → %s: Check allows it %v, Sources lists it %v", st.Name, to, allowed, from[st.Name])
			}
		}
	}
	if deletable[api.StateRunning] {
		t.Error("a running sandbox's record may be removed without going through deleting")
	}
}
