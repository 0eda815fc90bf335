package api

// Placement is a sandbox's placement record: how the cluster's scheduler
// chose the node that runs it, as GET /v1/sandboxes/{id}/placement shows
// it. Every node is a candidate or filtered out: candidates passed every
// filter and are ranked by score, best first (the first few listed, Passed
// counting them all); the others are named in Filtered with why when the
// create asked to explain, and otherwise counted by filter in Excluded.
type Placement struct {
	Sandbox string `json:"sandbox"`
	// Node is the node chosen: the first candidate that had room when the
	// placement was recorded.
	Node string `json:"node"`
	// Warm says the sandbox was served from a warm sandbox of its
	// template waiting on Node, reserved with the placement; otherwise it
	// was started cold there.
	Warm       bool                 `json:"warm,omitempty"`
	Candidates []PlacementCandidate `json:"candidates"`
	Passed     int                  `json:"passed"`
	Filtered   []PlacementFiltered  `json:"filtered,omitempty"`
	Excluded   map[string]int       `json:"excluded,omitempty"`
	// Refused are candidates that were full by the time the placement got
	// to them (another API node filled them first), in the order tried.
	Refused []string `json:"refused,omitempty"`
	// Selector and Spread are the create's NodeSelector and Spread.
	Selector map[string]string `json:"selector,omitempty"`
	Spread   string            `json:"spread,omitempty"`
	// Draw is what seeded the draw among nearly equal nodes, if not the
	// sandbox's ID (a burst's placements share draws).
	Draw string `json:"draw,omitempty"`
}

// PlacementCandidate is a node that could take the sandbox: its score, the
// sum of its parts' weighted values.
type PlacementCandidate struct {
	Node  string          `json:"node"`
	Score float64         `json:"score"`
	Parts []PlacementPart `json:"parts"`
	// Window says its score was within 0.1 of the best, so its rank
	// among those was drawn (the power of two choices: several API nodes
	// placing at once spread instead of all taking the emptiest node);
	// Drawn marks the two drawn to compete for first.
	Window bool `json:"window,omitempty"`
	Drawn  bool `json:"drawn,omitempty"`
}

// PlacementPart is one term of a score: pool (a warm sandbox of the
// template waits there), locality (the node holds the template), free (the
// share of its scarcest resource left), spread (its spread group's load):
// Value is 0..1, Weighted its share of the score.
type PlacementPart struct {
	Term     string  `json:"term"`
	Value    float64 `json:"value"`
	Weighted float64 `json:"weighted"`
}

// PlacementFiltered is a node that could not take the sandbox: the filter
// that refused it (snapshot, state, lease, schedule, runtime, selector,
// avoid, room) and why, e.g. "cordoned" or "no room: cpu 2/2 + 1".
type PlacementFiltered struct {
	Node   string `json:"node"`
	Filter string `json:"filter"`
	Reason string `json:"reason"`
}
