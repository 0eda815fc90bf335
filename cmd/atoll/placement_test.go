package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/scheduler"
)

// TestPlacementRecordIsAPI: the scheduler's Decision, stored as the
// placement record, decodes into api.Placement field for field, so the
// record the API shows is the decision the scheduler made.
func TestPlacementRecordIsAPI(t *testing.T) {
	d := scheduler.Decision{Sandbox: "s", Draw: "d", Node: "n1", Passed: 2,
		Candidates: []scheduler.Candidate{{Node: "n1", Score: 1.6, Window: true, Drawn: true,
			Parts: []scheduler.Part{{Term: "free", Value: 0.6, Weighted: 0.6}, {Term: "locality", Value: 1, Weighted: 0.5}}},
			{Node: "n3", Score: 1.2, Parts: []scheduler.Part{{Term: "free", Value: 0.2, Weighted: 0.2}, {Term: "locality", Value: 1, Weighted: 0.5}}}},
		Filtered: []scheduler.Filtered{{Node: "n2", Filter: "schedule", Reason: "cordoned"}},
		Excluded: map[string]int{"schedule": 1}, Refused: []string{"n4"},
		Selector: map[string]string{"zone": "a"}, Spread: "zone", Snapshot: "snap1", SnapshotPull: true}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p api.Placement
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("decoding a Decision as api.Placement: %v", err)
	}
	back, _ := json.Marshal(p)
	var want, got any
	json.Unmarshal(b, &want)
	json.Unmarshal(back, &got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("api.Placement loses part of the decision (-decision +api):\n%s", diff)
	}
	var out strings.Builder
	renderPlacement(&out, p)
	for _, want := range []string{"placed on n1: 3 nodes, 2 candidates, 1 filtered out", "node selector: zone=a",
		"n1 won the draw", "n4", "n2  schedule  cordoned", "FREE", "LOCALITY", "snapshot: snap1, archived"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rendered placement lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	renderExplain(&out, api.Sandbox{ID: "s"})
	if !strings.Contains(out.String(), "single machine: one node") {
		t.Errorf("explain on a single machine: %q", out.String())
	}
}
