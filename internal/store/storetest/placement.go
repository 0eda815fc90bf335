package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// placementRecord is a placement record as a scheduler writes one: any JSON
// object, kept as written.
const placementRecord = `{"sandbox":"p1","node":"n1","candidates":[{"node":"n1","score":1.5,"parts":[{"term":"free","value":0.75,"weighted":0.75}]}],"passed":1,"filtered":[{"node":"n2","filter":"state","reason":"cordoned \u00e9"}]}`

// samePlacement fails t unless got is the JSON want is.
func samePlacement(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("placement record %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Fatalf("placement record (-want +got):\n%s", diff)
	}
}

// testPlacement: Create writes the placement record with the row, Placement
// reads it back, Update leaves it, a row without one has none, and what is
// not JSON is refused.
func testPlacement(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	sb := NewSandbox("p1")
	sb.Placement = json.RawMessage(placementRecord)
	if err := st.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	plain := NewSandbox("p2")
	if err := st.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Placement(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	samePlacement(t, rec, placementRecord)

	// Get does not read it, and an Update of what Get read keeps it.
	got, err := st.Get(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Placement != nil {
		t.Errorf("Get read the placement record: %s", got.Placement)
	}
	got.State = api.StateRunning
	if err := st.Update(ctx, &got, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	if rec, err = st.Placement(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	samePlacement(t, rec, placementRecord)

	if rec, err := st.Placement(ctx, "p2"); err != nil || rec != nil {
		t.Errorf("Placement of a sandbox never placed = %q, %v; want nil, nil", rec, err)
	}
	for _, id := range []string{"nope", "", "../p1", "p1\x00"} {
		if _, err := st.Placement(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Placement(%q) = %v, want ErrNotFound", id, err)
		}
	}
	bad := NewSandbox("p3")
	bad.Placement = json.RawMessage(`{"node":`)
	if err := st.Create(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Create with a placement record that is not JSON = %v, want ErrInvalid", err)
	}
}

// testPlacePlacement: Place writes the placement record with the row.
func testPlacePlacement(t *testing.T, c store.Cluster) {
	ctx := context.Background()
	join(t, c, NewNode("n1"))
	sb := NewSandbox("p1")
	sb.Node = "n1"
	sb.Placement = json.RawMessage(placementRecord)
	if errs := c.Place(ctx, []*store.Sandbox{sb}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	rec, err := c.Placement(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	samePlacement(t, rec, placementRecord)
}
