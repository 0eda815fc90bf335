package atoll

import (
	"context"
	"net/url"
	"strconv"

	"github.com/atoll-dev/atoll/api"
)

// Usage returns the usage metered from q.From to q.To (zero: the last
// day until now), summed in buckets of q.Step (api.UsageByMinute,
// ByHour, ByDay; "": by the hour) per q.GroupBy (api.UsageBySandbox,
// ByTenant, ByTemplate, or api.UsageByLabel+key; "": by sandbox). A key
// sees its own tenant's; an admin key every tenant's, or q.Tenant's.
func (c *Client) Usage(ctx context.Context, q api.UsageQuery) (api.UsageReport, error) {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", strconv.FormatInt(q.From.Unix(), 10))
	}
	if !q.To.IsZero() {
		v.Set("to", strconv.FormatInt(q.To.Unix(), 10))
	}
	for k, s := range map[string]string{"step": q.Step, "group_by": q.GroupBy, "tenant": q.Tenant} {
		if s != "" {
			v.Set(k, s)
		}
	}
	var rep api.UsageReport
	err := c.do(ctx, request{method: "GET", path: "/v1/usage", query: v}, &rep)
	return rep, err
}
