package atoll

import (
	"context"
	"net/url"

	"github.com/atoll-dev/atoll/api"
)

// CreateSandbox creates and starts a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, request{method: "POST", path: "/v1/sandboxes", json: req}, &sb)
	return sb, err
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
