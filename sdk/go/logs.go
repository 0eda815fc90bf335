package atoll

import (
	"context"
	"net/url"
	"strconv"

	"github.com/atoll-dev/atoll/api"
)

// LogOptions select a sandbox's log lines (Client.Logs).
type LogOptions struct {
	// Since skips the lines up to this seq (0: from the oldest kept).
	Since int64
	// Follow keeps the stream open for lines to come, until ctx ends or
	// the stream is closed.
	Follow bool
}

// Logs streams what the sandbox's start command and background processes
// printed, as kept by its agent (the newest MiB), and with opts.Follow
// what they print from now on.
func (c *Client) Logs(ctx context.Context, id string, opts LogOptions) (*Stream[api.LogEntry], error) {
	q := url.Values{}
	if opts.Since > 0 {
		q.Set("since", strconv.FormatInt(opts.Since, 10))
	}
	if opts.Follow {
		q.Set("follow", "true")
	}
	resp, err := c.send(ctx, request{method: "GET", path: sandboxPath(id, "/logs"), query: q})
	if err != nil {
		return nil, err
	}
	return newStream[api.LogEntry](resp.Body), nil
}
