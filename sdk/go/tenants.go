package atoll

import (
	"context"
	"net/url"

	"github.com/atoll-dev/atoll/api"
)

// ListTenants lists every tenant with its quota and use (admin keys only).
func (c *Client) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	var l api.TenantList
	err := c.do(ctx, request{method: "GET", path: "/v1/tenants"}, &l)
	return l.Tenants, err
}

// GetTenant returns a tenant's quota and what its sandboxes hold against
// it: the key's own tenant, or with an admin key any.
func (c *Client) GetTenant(ctx context.Context, name string) (api.Tenant, error) {
	var t api.Tenant
	err := c.do(ctx, request{method: "GET", path: "/v1/tenants/" + url.PathEscape(name)}, &t)
	return t, err
}

// SetQuota replaces a tenant's quota (admin keys only); a zero field is no
// limit. Over a quota, creates and starts fail with ErrQuota, and the
// *Error's Quota says which.
func (c *Client) SetQuota(ctx context.Context, name string, q api.TenantQuota) (api.Tenant, error) {
	var t api.Tenant
	err := c.do(ctx, request{method: "PUT", path: "/v1/tenants/" + url.PathEscape(name) + "/quota", json: q}, &t)
	return t, err
}
