package api

import "time"

// Usage steps (GET /v1/usage's step) and groupings (its group_by; a label
// grouping is UsageByLabel followed by the label's key).
const (
	UsageByMinute = "1m"
	UsageByHour   = "1h"
	UsageByDay    = "1d"

	UsageBySandbox  = "sandbox"
	UsageByTenant   = "tenant"
	UsageByTemplate = "template"
	UsageByLabel    = "label:"
)

// UsageQuery is what GET /v1/usage asks: the usage metered from From to
// To (half open), in buckets of Step, grouped by GroupBy, of Tenant ("":
// the asking key's; every tenant's for an admin key).
type UsageQuery struct {
	Tenant   string
	From, To time.Time
	Step     string
	GroupBy  string
}

// UsageReport is the body of GET /v1/usage.
type UsageReport struct {
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	Step    string    `json:"step"`
	GroupBy string    `json:"group_by"`
	// Usage is one entry per bucket and group that used anything, by
	// Start, then Group.
	Usage []UsageEntry `json:"usage"`
}

// UsageEntry is what one group used in one bucket.
type UsageEntry struct {
	// Start is the bucket's start.
	Start time.Time `json:"start"`
	// Group is the sandbox ID, tenant, template or label value (""
	// for sandboxes without the label) the entry sums.
	Group string `json:"group"`
	// CPUSeconds is CPU time; MemoryGiBSeconds the working set's GiB
	// times the seconds it was held.
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	// GiB-hours of the writable disk, of snapshots and of archives.
	DiskGiBHours     float64 `json:"disk_gib_hours"`
	SnapshotGiBHours float64 `json:"snapshot_gib_hours"`
	ArchiveGiBHours  float64 `json:"archive_gib_hours"`
	// Network bytes into and out of the sandboxes.
	NetInBytes  int64 `json:"network_in_bytes"`
	NetOutBytes int64 `json:"network_out_bytes"`
	// Seconds in each state.
	States UsageStates `json:"states"`
}

// UsageStates are seconds spent in each state.
type UsageStates struct {
	Running   float64 `json:"running"`
	Paused    float64 `json:"paused"`
	Suspended float64 `json:"suspended"`
	Stopped   float64 `json:"stopped"`
	Archived  float64 `json:"archived"`
}
