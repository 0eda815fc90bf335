package api

import "time"

// VaultCompactRequest is the body of POST /v1/vaults/{name}/compact.
type VaultCompactRequest struct {
	// Before is a date, YYYY-MM-DD: the daily timeline files of days
	// before it are rolled into their weeks' files. Default: the Monday
	// that starts the current ISO week (UTC).
	Before string `json:"before,omitempty"`
	// WeeksBefore is a date, YYYY-MM-DD: the week files of weeks that
	// ended before it are rolled into their months' files. Default: the
	// first day of Before's month.
	WeeksBefore string `json:"weeks_before,omitempty"`
	// Summarizer is a shell command run in a sandbox of the tenant's for
	// each file rolled up, given the file on stdin: what it prints is
	// the file's section. Default: the vault's summarizer, if it has one,
	// else the deterministic one (docs/vault.md).
	Summarizer string `json:"summarizer,omitempty"`
}

// VaultCompaction is the answer of POST /v1/vaults/{name}/compact: the
// commit it made ("" if there was nothing to roll up), by week file
// (timeline/weekly/YYYY-Www.md) the day files rolled into it, and by
// month file (timeline/monthly/YYYY-MM.md) the week files rolled into it.
type VaultCompaction struct {
	Commit string              `json:"commit,omitempty"`
	Weeks  map[string][]string `json:"weeks"`
	Months map[string][]string `json:"months,omitempty"`
}

// Vault compaction schedules (VaultUpdate.Compact).
const (
	VaultCompactDaily  = "daily"  // every day at 00:00 UTC
	VaultCompactWeekly = "weekly" // every Monday at 00:00 UTC
	VaultCompactOff    = "off"
)

// VaultUpdate is the body of PATCH /v1/vaults/{name}: the fields given
// are changed, the others kept.
type VaultUpdate struct {
	// Compact is the compaction schedule: VaultCompactDaily,
	// VaultCompactWeekly or VaultCompactOff.
	Compact *string `json:"compact,omitempty"`
	// Summarizer is the command of the vault's compactions, scheduled or
	// not; "" for the deterministic summarizer.
	Summarizer *string `json:"summarizer,omitempty"`
}

// VaultEvent is one thing that happened to a vault outside a push: a
// compaction made (Commit), with nothing to do, or failed (Error).
type VaultEvent struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // "compact"
	// Trigger is who asked: "api" (vault compact) or "schedule".
	Trigger string `json:"trigger"`
	Commit  string `json:"commit,omitempty"`
	Error   string `json:"error,omitempty"`
	// Detail says what was rolled up.
	Detail string `json:"detail,omitempty"`
}

// VaultEvents is the body of GET /v1/vaults/{name}/events.
type VaultEvents struct {
	Events []VaultEvent `json:"events"`
}
