package atoll

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// PortURL returns where the server's port proxy serves port of sandbox id.
// With signedFor > 0 it also signs a URL that opens the port, with no
// header, for that long (rounded down to whole seconds).
func (c *Client) PortURL(ctx context.Context, id string, port int, signedFor time.Duration) (api.PortURL, error) {
	q := url.Values{}
	if signedFor > 0 {
		q.Set("ttl_sec", strconv.FormatInt(int64(signedFor/time.Second), 10))
	}
	return call[api.PortURL](ctx, c, request{method: "GET", path: sandboxPath(id, "/ports/", strconv.Itoa(port)), query: q})
}

// SetPorts changes who may open sandbox id's ports through the port proxy.
func (c *Client) SetPorts(ctx context.Context, id string, access api.PortAccess) (api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, request{method: "PUT", path: sandboxPath(id, "/ports"), json: access})
}
