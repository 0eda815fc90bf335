package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
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
	// placement endpoint reads (Sandboxes.Placement). A Cluster's
	// Update writes it when set: a warm sandbox that serves a placement
	// takes its record.
	Placement json.RawMessage
	// Warm is a placement that takes a warm sandbox of its template
	// version waiting on its node (a pooled row there): Cluster.Place
	// reserves one for it, or refuses it with ErrNoWarm. Written with
	// the row; Get and List do not read it.
	Warm bool
	// api.Sandbox.Node is the cluster node that runs it ("" on a single
	// machine); Slot is unique among that node's sandboxes.
	// api.Sandbox.TemplateVersion is the version of Template it was made
	// from, which it holds (see Templates).
}

// SetJSON fills in sb's fields that both stores keep as JSON text, from
// their columns: env and labels (empty ones read as nil) and policy (an
// empty one is allow-all).
func (sb *Sandbox) SetJSON(env, labels, policy string) error {
	if policy != "" {
		if err := json.Unmarshal([]byte(policy), &sb.Policy); err != nil {
			return err
		}
	}
	if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(labels), &sb.Labels); err != nil {
		return err
	}
	if len(sb.Env) == 0 {
		sb.Env = nil
	}
	if len(sb.Labels) == 0 {
		sb.Labels = nil
	}
	return nil
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

// Only is the row a read by key (of what: "sandbox <id>") returned, with
// err: errdefs.ErrNotFound if it returned none. Both stores' Gets end so.
func Only[T any](rows []T, err error, what string) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	if len(rows) == 0 {
		return zero, fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	}
	return rows[0], nil
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
