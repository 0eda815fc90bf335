package store

import (
	"encoding/json"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// Sandbox is a sandbox's row: what the API shows plus what the node needs to
// find it again.
type Sandbox struct {
	api.Sandbox
	Slot      int    // index of its uid range and quota project; unique among its node's sandboxes
	PID       int    // of its init process while running
	StartTime uint64 // of PID
	Socket    string // agent socket while running
	// TimeoutSec is the hard TTL a start sets ExpiresAt from.
	TimeoutSec int64
	// FromSnapshot is the snapshot it was created from, if any.
	FromSnapshot string
	// Policy is its egress policy as the API shows it (egress.Policy.API);
	// empty is allow-all.
	Policy api.NetworkPolicy
	// Tenant owns it (package tenant); rows of older versions belong to
	// tenant.Default.
	Tenant string
	// LostFrom is the state it was in when its node was fenced and it
	// became api.StateLost (see Cluster.Expire).
	LostFrom string
	// Placement is the record of the scheduler's choice of its node (a
	// scheduler.Decision as JSON), nil if it was not placed (a single
	// machine's, a fork, a warm pool's, one from a snapshot). Create and
	// Place write it with the row; Update leaves it as it is, and Get and
	// List do not read it: it is a kilobyte or more that only the
	// placement endpoint reads (Sandboxes.Placement).
	Placement json.RawMessage
	// api.Sandbox.Node is the cluster node that runs it ("" on a single
	// machine); Slot is unique among that node's sandboxes.
	// api.Sandbox.TemplateVersion is the version of Template it was made
	// from, which it holds (see Templates).
}

// Transition is one recorded state change.
type Transition struct {
	From, To, Reason string
	At               time.Time
}

// Key is a stored API key: never the key itself, only its SHA-256 hash,
// whose first 20 hex digits are the key's ID.
type Key struct {
	ID        string
	Hash      string
	Name      string
	Tenant    string
	CreatedAt time.Time
}

// KeyID is the ID of the key whose hash is hash.
func KeyID(hash string) string {
	if len(hash) < 20 {
		return hash
	}
	return hash[:20]
}

// Snapshot is a snapshot's row.
type Snapshot struct {
	ID, Name, SandboxID, Template string
	TemplateVersion               string // the version of Template its sandbox was made from
	State                         string // api.SnapshotReady, ...
	Tenant                        string // who owns it: its sandbox's tenant
	CreatedAt                     time.Time
}

// VaultsJSON is a sandbox's vault mounts as the stores keep them: JSON,
// "" for none.
func VaultsJSON(ms []api.VaultMount) string {
	if len(ms) == 0 {
		return ""
	}
	b, _ := json.Marshal(ms)
	return string(b)
}

// ParseVaults reads what VaultsJSON wrote into ms.
func ParseVaults(s string, ms *[]api.VaultMount) error {
	if s == "" {
		*ms = nil
		return nil
	}
	return json.Unmarshal([]byte(s), ms)
}
