package atoll

import (
	"context"
	"net/url"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// CreateSandbox creates and starts a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: "/v1/sandboxes", json: req, busyRetry: true}, &sb)
	return sb, err
}

// GetPlacement returns how the cluster chose sandbox id's node. A single
// machine answers ErrConflict (nothing is placed there); a sandbox the
// scheduler did not place, ErrNotFound.
func (c *Client) GetPlacement(ctx context.Context, id string) (api.Placement, error) {
	var p api.Placement
	err := c.do(ctx, request{method: "GET", path: sandboxPath(id, "/placement")}, &p)
	return p, err
}

// GetSandbox returns the sandbox id.
func (c *Client) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "GET", path: sandboxPath(id)}, &sb)
	return sb, err
}

// ListOptions filters ListSandboxes. Zero fields don't filter.
type ListOptions struct {
	State  string            // e.g. api.StateRunning
	Labels map[string]string // all must match
}

// ListSandboxes returns the sandboxes that match opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Labels {
		q.Add("label", k+"="+v)
	}
	var l api.SandboxList
	err := c.do(ctx, request{method: "GET", path: "/v1/sandboxes", query: q}, &l)
	return l.Sandboxes, err
}

// Metrics returns sandbox id's samples of CPU, memory and disk use taken
// from start to end (both inclusive, to the second; a zero time leaves
// that end open), oldest first. The server samples running sandboxes every
// few seconds and keeps the last hour.
func (c *Client) Metrics(ctx context.Context, id string, start, end time.Time) ([]api.Metric, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(time.RFC3339))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(time.RFC3339))
	}
	var l api.MetricList
	err := c.do(ctx, request{method: "GET", path: sandboxPath(id, "/metrics"), query: q}, &l)
	return l.Metrics, err
}

// StopSandbox stops a running sandbox; its files stay.
func (c *Client) StopSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/stop")}, &sb)
	return sb, err
}

// StartSandbox starts a stopped sandbox.
func (c *Client) StartSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/start")}, &sb)
	return sb, err
}

// DeleteSandbox deletes a sandbox and everything in it.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: sandboxPath(id)}, nil)
}

// ArchiveSandbox moves a stopped sandbox's files to object storage;
// StartSandbox brings them back.
func (c *Client) ArchiveSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/archive")}, &sb)
	return sb, err
}

// PauseSandbox freezes a running sandbox's processes, keeping their memory.
// Commands and files of a paused sandbox answer ErrConflict until ResumeSandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/pause")}, &sb)
	return sb, err
}

// SuspendSandbox pauses a running sandbox to disk: its memory and processes
// are saved and it stops holding memory (state suspended), for runtimes
// whose capabilities include memory_snapshot. ResumeSandbox restores it.
func (c *Client) SuspendSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/pause"), json: api.PauseRequest{ToDisk: true}}, &sb)
	return sb, err
}

// ShelveSandbox pauses a running or paused sandbox without its memory
// (state shelved): its processes end, its files stay, and ResumeSandbox
// boots it again over them.
func (c *Client) ShelveSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	noMemory := false
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/pause"), json: api.PauseRequest{Memory: &noMemory}}, &sb)
	return sb, err
}

// ResumeSandbox thaws a paused sandbox, restores a suspended one, or boots a
// shelved one again.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/resume")}, &sb)
	return sb, err
}

// SetTimeout makes a running or paused sandbox stop timeout from now, replacing
// any earlier timeout; 0 removes it. The server counts whole seconds, so a
// fraction of a second is rounded up rather than down to "no timeout".
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) (api.Sandbox, error) {
	sec := int64(timeout / time.Second)
	if timeout%time.Second > 0 {
		sec++
	}
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/timeout"), json: api.TimeoutRequest{TimeoutSec: sec}}, &sb)
	return sb, err
}

// ForkSandbox creates req.Count sandboxes (1 when 0, at most 100) from the
// current files of sandbox id and returns them.
func (c *Client) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	var l api.SandboxList
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/fork"), json: req}, &l)
	return l.Sandboxes, err
}

// RestoreSandbox puts the files of req.Snapshot back into sandbox id; what was
// written since is lost.
func (c *Client) RestoreSandbox(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/restore"), json: req}, &sb)
	return sb, err
}

// CreateSnapshot takes a snapshot of sandbox id's files.
func (c *Client) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	var s api.Snapshot
	err := c.do(ctx, request{method: "POST", path: sandboxPath(id, "/snapshots"), json: req}, &s)
	return s, err
}

// ListSnapshots returns the snapshots taken of sandboxID, or all snapshots
// when sandboxID is "".
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandbox", sandboxID)
	}
	var l api.SnapshotList
	err := c.do(ctx, request{method: "GET", path: "/v1/snapshots", query: q}, &l)
	return l.Snapshots, err
}

// GetSnapshot returns the snapshot id.
func (c *Client) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	var s api.Snapshot
	err := c.do(ctx, request{method: "GET", path: snapshotPath(id)}, &s)
	return s, err
}

// DeleteSnapshot deletes a snapshot. It fails with ErrConflict while
// sandboxes created from it exist.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: snapshotPath(id)}, nil)
}

// ArchiveSnapshot moves a snapshot's files to the server's archive store,
// freeing local disk. Creating a sandbox from it, or restoring to it, brings
// them back.
func (c *Client) ArchiveSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	var sn api.Snapshot
	err := c.do(ctx, request{method: "POST", path: snapshotPath(id) + "/archive"}, &sn)
	return sn, err
}

func snapshotPath(id string) string {
	return "/v1/snapshots/" + url.PathEscape(id)
}

// GetNetwork returns sandbox id's addresses and egress policy. A server that
// runs sandboxes without networking answers with ErrUnavailable.
func (c *Client) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	var n api.SandboxNetwork
	err := c.do(ctx, request{method: "GET", path: sandboxPath(id, "/network")}, &n)
	return n, err
}

// SetNetwork replaces sandbox id's egress policy. A running sandbox gets it
// at once, and its connections the policy forbids are cut; a stopped one at
// its next start.
func (c *Client) SetNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.SandboxNetwork, error) {
	var n api.SandboxNetwork
	err := c.do(ctx, request{method: "PUT", path: sandboxPath(id, "/network"), json: p}, &n)
	return n, err
}
