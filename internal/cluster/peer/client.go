package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Node is a node to call: its name, which its certificate must carry, and
// the address of its node-to-node listener.
type Node struct {
	Name    string
	Address string
}

// Client calls other nodes over mutual TLS, as this node under its
// current epoch. It keeps one connection pool a node.
type Client struct {
	id    *Identity
	epoch func() int64

	mu sync.Mutex
	// transports are by node name; a node that comes back at another
	// address gets a new one.
	transports map[string]*transport
}

type transport struct {
	address string
	rt      *http.Transport
}

// NewClient returns a Client that presents id's certificate and sends
// epoch() (the node's current epoch, which changes when it joins again)
// with every call.
func NewClient(id *Identity, epoch func() int64) *Client {
	return &Client{id: id, epoch: epoch, transports: make(map[string]*transport)}
}

// dialTimeout bounds connecting to a node: one that does not answer in
// that long is down, for the router's 503.
const dialTimeout = 5 * time.Second

// transport returns the pooled transport to node n.
func (c *Client) transport(n Node) *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.transports[n.Name]; ok {
		if t.address == n.Address {
			return t.rt
		}
		t.rt.CloseIdleConnections()
	}
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	rt := &http.Transport{
		DialContext:         d.DialContext,
		TLSClientConfig:     c.id.ClientTLS(n.Name, n.Address),
		TLSHandshakeTimeout: dialTimeout,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// Bodies pass as they come: an exec's output, a file, a tar.
		DisableCompression: true,
	}
	c.transports[n.Name] = &transport{address: n.Address, rt: rt}
	return rt
}

// prepare points req at node n and marks it as this node's, under its epoch.
func (c *Client) prepare(n Node, req *http.Request) {
	req.URL.Scheme = "https"
	req.URL.Host = n.Address
	stripPeerHeaders(req.Header)
	req.Header.Set(HeaderEpoch, strconv.FormatInt(c.epoch(), 10))
}

// Do sends req to node n: req's path, query, method, headers and body go
// as they are, to n's node-to-node listener. The response is the caller's
// to close.
func (c *Client) Do(ctx context.Context, n Node, req *http.Request) (*http.Response, error) {
	req = req.Clone(ctx)
	req.RequestURI = "" // a server's request, passed on as it is
	c.prepare(n, req)
	resp, err := c.transport(n).RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("calling node %s: %w: %w", n.Name, errdefs.ErrUnavailable, err)
	}
	return resp, nil
}

// Call is Do for a JSON call: in (if not nil) as the body, the answer
// decoded into out (if not nil). An error answer comes back as an error of
// its kind (errdefs.FromCode), with the node's message.
func (c *Client) Call(ctx context.Context, n Node, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+n.Address+path, body)
	if err != nil {
		return fmt.Errorf("calling node %s: %w: %w", n.Name, errdefs.ErrInvalid, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(ctx, n, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e api.Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Code == "" {
			e = api.Error{Code: api.CodeInternal, Message: http.StatusText(resp.StatusCode)}
		}
		kind := errdefs.FromCode(e.Code)
		if kind == nil {
			return fmt.Errorf("node %s: %s %s: %d %s", n.Name, method, path, resp.StatusCode, e.Message)
		}
		return fmt.Errorf("node %s: %w: %s", n.Name, kind, e.Message)
	}
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("node %s: %s %s: reading the answer: %w", n.Name, method, path, err)
	}
	return nil
}

// Close closes the idle connections to every node.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.transports {
		t.rt.CloseIdleConnections()
	}
}
