package api

// VaultCompactRequest is the body of POST /v1/vaults/{name}/compact.
type VaultCompactRequest struct {
	// Before is a date, YYYY-MM-DD: the daily timeline files of days
	// before it are rolled up. Default: the Monday that starts the
	// current ISO week (UTC).
	Before string `json:"before,omitempty"`
}

// VaultCompaction is the answer of POST /v1/vaults/{name}/compact: the
// commit it made ("" if there was nothing to roll up) and, by week file
// (timeline/weekly/YYYY-Www.md), the day files rolled into it.
type VaultCompaction struct {
	Commit string              `json:"commit,omitempty"`
	Weeks  map[string][]string `json:"weeks"`
}
