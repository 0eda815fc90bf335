package scheduler

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
)

// TestPlacementRecord: Place records its decision with the sandbox, as the
// store keeps it: the node chosen, the candidates, the nodes filtered out
// (counted, or named when explaining), the selector.
func TestPlacementRecord(t *testing.T) {
	u := database(t)
	ctx := context.Background()
	st := open(t, u)
	for name, zone := range map[string]string{"n1": "a", "n2": "b", "n3": "b"} {
		n := store.Node{Name: name, Runtimes: []string{"ns"}, Labels: map[string]string{"zone": zone},
			Capacity: store.Resources{CPU: 4, MemoryMiB: 4096, DiskGiB: 100, Sandboxes: 10}}
		if _, err := st.Join(ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	sch := New(Config{Store: st})
	defer sch.Close()
	for _, explain := range []bool{false, true} {
		sb := sandbox("rec"+map[bool]string{false: "plain", true: "explained"}[explain], 1)
		d, err := sch.Place(ctx, sb, Request{Selector: map[string]string{"zone": "b"}, Explain: explain})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := st.Placement(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		var rec Decision
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Node != sb.Node || rec.Node != d.Node || (rec.Node != "n2" && rec.Node != "n3") || rec.Passed != 2 ||
			rec.Excluded["selector"] != 1 || rec.Selector["zone"] != "b" || len(rec.Candidates) != 2 {
			t.Errorf("explain %v: record %s, decision %+v", explain, raw, d)
		}
		if explain && (len(rec.Filtered) != 1 || rec.Filtered[0].Node != "n1" || rec.Filtered[0].Reason != "selector zone=b") {
			t.Errorf("explained record names %+v, want n1 refused by the selector", rec.Filtered)
		}
	}
}
