package atoll

import (
	"context"
	"net/url"

	"github.com/atoll-dev/atoll/api"
)

// CreateKey issues an API key (admin keys only). The answer's Key is the
// only copy of the key there is.
func (c *Client) CreateKey(ctx context.Context, req api.CreateKeyRequest) (api.APIKey, error) {
	return call[api.APIKey](ctx, c, request{method: "POST", path: "/v1/keys", json: req})
}

// ListKeys lists the server's API keys, without the keys themselves
// (admin keys only).
func (c *Client) ListKeys(ctx context.Context) ([]api.APIKey, error) {
	l, err := call[api.APIKeyList](ctx, c, request{method: "GET", path: "/v1/keys"})
	return l.Keys, err
}

// DeleteKey revokes the key with ID id (admin keys only).
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	return c.do(ctx, request{method: "DELETE", path: "/v1/keys/" + url.PathEscape(id)}, nil)
}
