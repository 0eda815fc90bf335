package atoll

import (
	"context"
	"net/url"

	"github.com/atoll-dev/atoll/api"
)

// ListNodes lists a cluster's nodes with their capacity, what is committed
// on them and their leases (admin keys only; 409 from a single machine).
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	l, err := call[api.NodeList](ctx, c, request{method: "GET", path: "/v1/nodes"})
	return l.Nodes, err
}

// CordonNode stops placing new sandboxes on node name.
func (c *Client) CordonNode(ctx context.Context, name string) error {
	return c.do(ctx, request{method: "POST", path: "/v1/nodes/" + url.PathEscape(name) + "/cordon"}, nil)
}

// UncordonNode lets node name take new sandboxes again.
func (c *Client) UncordonNode(ctx context.Context, name string) error {
	return c.do(ctx, request{method: "POST", path: "/v1/nodes/" + url.PathEscape(name) + "/uncordon"}, nil)
}

// DrainNode cordons node name and moves its sandboxes to other nodes.
func (c *Client) DrainNode(ctx context.Context, name string) error {
	return c.do(ctx, request{method: "POST", path: "/v1/nodes/" + url.PathEscape(name) + "/drain"}, nil)
}
