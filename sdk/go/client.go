// Package atoll is the Go client of atoll's HTTP API: sandboxes, commands,
// processes, terminals, files, snapshots and templates.
//
//	c := atoll.New("http://localhost:7070", os.Getenv("ATOLL_API_KEY"))
//	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "host"})
//	if err != nil {
//		return err
//	}
//	defer c.DeleteSandbox(ctx, sb.ID)
//	code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "uname -a"}, os.Stdout, os.Stderr)
//
// Errors from the server are *Error values; match their kind with errors.Is
// and the sentinels (ErrNotFound, ErrConflict, …) or read them with errors.As.
package atoll

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// Client talks to an atoll server, or to any of the nodes of a cluster. It
// is safe for concurrent use.
type Client struct {
	// bases are the servers' URLs, without trailing slashes; requests go
	// to bases[cur] until it cannot be reached.
	bases     []string
	cur       atomic.Int32
	key       string
	hc        *http.Client
	userAgent string
	// busyRetries is how many times a create the server refused as busy
	// is sent again, after the wait its Retry-After asks for.
	busyRetries int
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc. It must not have a
// Timeout shorter than the longest stream the caller reads; use contexts instead.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithBusyRetries sets how many times the Client sends a create again that
// the server refused for being busy (503 or 429 with Retry-After), waiting as
// long as the server asks each time (default 30; 0 returns the first refusal
// as an *Error with RetryAfter set). Such a create did nothing on the
// server, so sending it again cannot make two sandboxes.
func WithBusyRetries(n int) Option { return func(c *Client) { c.busyRetries = n } }

// defaultBusyRetries at the server's Retry-After of 1 s ride out about half a
// minute of overload.
const defaultBusyRetries = 30

// New returns a Client of the server at baseURL (e.g. "http://localhost:7070")
// authenticating with apiKey. baseURL may name several servers, separated by
// commas: the nodes of a cluster, each of which answers the whole API. The
// Client uses one until it cannot connect to it, then the next: a request
// that could not connect (so never reached a server) is sent to the next
// one, unless its body is a stream already handed over.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{key: apiKey, hc: http.DefaultClient, userAgent: "atoll-go",
		busyRetries: defaultBusyRetries}
	for _, b := range strings.Split(baseURL, ",") {
		if b = strings.TrimRight(strings.TrimSpace(b), "/"); b != "" {
			c.bases = append(c.bases, b)
		}
	}
	if len(c.bases) == 0 {
		c.bases = []string{""}
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// request is one API call.
type request struct {
	method string
	path   string // under the base URL, already escaped
	query  url.Values
	body   io.Reader
	ctype  string
	json   any // marshalled as the body when set
	// busyRetry: a busy answer (Retry-After) means the server did nothing,
	// so the request is sent again after the wait (see WithBusyRetries).
	busyRetry bool
}

func (c *Client) newRequest(ctx context.Context, r request) (*http.Request, error) {
	body := r.body
	ctype := r.ctype
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("encoding request: %w", err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	u := c.base() + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	c.authorize(req.Header)
	return req, nil
}

func (c *Client) authorize(h http.Header) {
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	if c.userAgent != "" {
		h.Set("User-Agent", c.userAgent)
	}
}

// send sends r and returns the response if its status is 2xx; otherwise the
// error the body describes.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	for try := 0; ; try++ {
		resp, err := c.sendOnce(ctx, r)
		var e *Error
		if !r.busyRetry || try >= c.busyRetries || !errors.As(err, &e) || e.RetryAfter <= 0 {
			return resp, err
		}
		// A little jitter spreads the clients that were refused together.
		wait := e.RetryAfter + time.Duration(rand.Int64N(int64(e.RetryAfter/4)+1))
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// base is the URL of the server requests go to now.
func (c *Client) base() string { return c.bases[int(c.cur.Load())%len(c.bases)] }

// unreachable reports whether err is a failure to connect: the request
// never reached a server, so it can go to another.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (c *Client) sendOnce(ctx context.Context, r request) (*http.Response, error) {
	var resp *http.Response
	for try := 0; ; try++ {
		cur := c.cur.Load()
		req, err := c.newRequest(ctx, r)
		if err != nil {
			return nil, err
		}
		resp, err = c.hc.Do(req)
		if err == nil {
			break
		}
		if try+1 >= len(c.bases) || r.body != nil || !unreachable(err) || ctx.Err() != nil {
			return nil, err
		}
		// The next server, unless another request moved on already.
		c.cur.CompareAndSwap(cur, (cur+1)%int32(len(c.bases)))
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, errorFrom(resp)
	}
	return resp, nil
}

// do sends r and decodes a JSON answer into out, if out is not nil.
// call sends r and decodes the answer into a T: the body of every method
// that returns what the server answers.
func call[T any](ctx context.Context, c *Client, r request) (T, error) {
	var v T
	err := c.do(ctx, r, &v)
	return v, err
}

func (c *Client) do(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s %s answer: %w", r.method, r.path, err)
	}
	return nil
}

func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

func processPath(id string, pid int, rest string) string {
	return sandboxPath(id, fmt.Sprintf("/processes/%d", pid), rest)
}

// Health reports whether the server is up. It needs no API key.
func (c *Client) Health(ctx context.Context) (api.Health, error) {
	return call[api.Health](ctx, c, request{method: "GET", path: "/v1/health"})
}

// Runtimes lists the server's sandbox runtimes with their capabilities,
// and those it cannot offer, with why.
func (c *Client) Runtimes(ctx context.Context) ([]api.Runtime, error) {
	l, err := call[api.RuntimeList](ctx, c, request{method: "GET", path: "/v1/runtimes"})
	return l.Runtimes, err
}
