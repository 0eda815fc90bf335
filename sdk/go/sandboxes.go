package atoll

import (
	"context"
	"net/url"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// CreateSandbox creates and starts a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: "/v1/sandboxes", json: req, busyRetry: true})
}

// GetPlacement returns how the cluster chose sandbox id's node. A single
// machine answers ErrConflict (nothing is placed there); a sandbox the
// scheduler did not place, ErrNotFound.
func (c *Client) GetPlacement(ctx context.Context, id string) (api.Placement, error) {
	return call[api.Placement](ctx, c, request{method: "GET", path: sandboxPath(id, "/placement")})
}

// GetSandbox returns the sandbox id.
func (c *Client) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "GET", path: sandboxPath(id)})
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
	l, err := call[api.SandboxList](ctx, c, request{method: "GET", path: "/v1/sandboxes", query: q})
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
	l, err := call[api.MetricList](ctx, c, request{method: "GET", path: sandboxPath(id, "/metrics"), query: q})
	return l.Metrics, err
}

// StopSandbox stops a running sandbox; its files stay.
func (c *Client) StopSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/stop")})
}

// StartSandbox starts a stopped sandbox.
func (c *Client) StartSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/start")})
}

// DeleteSandbox deletes a sandbox and everything in it.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: sandboxPath(id)}, nil)
}

// ArchiveSandbox moves a stopped sandbox's files to object storage;
// StartSandbox brings them back.
func (c *Client) ArchiveSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/archive")})
}

// PauseSandbox freezes a running sandbox's processes, keeping their memory.
// Commands and files of a paused sandbox answer ErrConflict until ResumeSandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/pause")})
}

// SuspendSandbox pauses a running sandbox to disk: its memory and processes
// are saved and it stops holding memory (state suspended), for runtimes
// whose capabilities include memory_snapshot. ResumeSandbox restores it.
func (c *Client) SuspendSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/pause"), json: api.PauseRequest{ToDisk: true}})
}

// ShelveSandbox pauses a running or paused sandbox without its memory
// (state shelved): its processes end, its files stay, and ResumeSandbox
// boots it again over them.
func (c *Client) ShelveSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	noMemory := false
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/pause"), json: api.PauseRequest{Memory: &noMemory}})
}

// ResumeSandbox thaws a paused sandbox, restores a suspended one, or boots a
// shelved one again.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/resume")})
}

// SetTimeout makes a running or paused sandbox stop timeout from now, replacing
// any earlier timeout; 0 removes it. The server counts whole seconds, so a
// fraction of a second is rounded up rather than down to "no timeout".
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) (api.Sandbox, error) {
	sec := int64(timeout / time.Second)
	if timeout%time.Second > 0 {
		sec++
	}
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/timeout"), json: api.TimeoutRequest{TimeoutSec: sec}})
}

// ForkSandbox creates req.Count sandboxes (1 when 0, at most 100) from the
// current files of sandbox id and returns them.
func (c *Client) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	l, err := call[api.SandboxList](ctx, c, request{method: "POST", path: sandboxPath(id, "/fork"), json: req})
	return l.Sandboxes, err
}

// RestoreSandbox puts the files of req.Snapshot back into sandbox id; what was
// written since is lost.
func (c *Client) RestoreSandbox(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "POST", path: sandboxPath(id, "/restore"), json: req})
}

// CreateSnapshot takes a snapshot of sandbox id's files.
func (c *Client) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	return call[api.Snapshot](ctx, c, request{method: "POST", path: sandboxPath(id, "/snapshots"), json: req})
}

// ListSnapshots returns the snapshots taken of sandboxID, or all snapshots
// when sandboxID is "".
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandbox", sandboxID)
	}
	l, err := call[api.SnapshotList](ctx, c, request{method: "GET", path: "/v1/snapshots", query: q})
	return l.Snapshots, err
}

// GetSnapshot returns the snapshot id.
func (c *Client) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return call[api.Snapshot](ctx, c, request{method: "GET", path: snapshotPath(id)})
}

// DeleteSnapshot deletes a snapshot. Sandboxes created from it keep their
// own copies of its files; it fails with ErrConflict while the snapshot is
// being archived.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: snapshotPath(id)}, nil)
}

// ArchiveSnapshot moves a snapshot's files to the server's archive store,
// freeing local disk. Creating a sandbox from it, or restoring to it, brings
// them back.
func (c *Client) ArchiveSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return call[api.Snapshot](ctx, c, request{method: "POST", path: snapshotPath(id) + "/archive"})
}

func snapshotPath(id string) string {
	return "/v1/snapshots/" + url.PathEscape(id)
}

// GetNetwork returns sandbox id's addresses and egress policy. A server that
// runs sandboxes without networking answers with ErrUnavailable.
func (c *Client) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	return call[api.SandboxNetwork](ctx, c, request{method: "GET", path: sandboxPath(id, "/network")})
}

// SetNetwork replaces sandbox id's egress policy. A running sandbox gets it
// at once, and its connections the policy forbids are cut; a stopped one at
// its next start.
func (c *Client) SetNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.SandboxNetwork, error) {
	return call[api.SandboxNetwork](ctx, c, request{method: "PUT", path: sandboxPath(id, "/network"), json: p})
}
