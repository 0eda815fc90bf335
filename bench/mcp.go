package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
)

// mcpBench measures MCP tool calls (create_sandbox, exec of `true`) over
// stdio (`atoll mcp`) and over the server's /v1/mcp, with the Go MCP SDK's
// client, beside the Go SDK's own calls on the same server: what MCP's
// framing and the extra hop cost.
func mcpBench(r *report, srv *server, n int) {
	ctx := context.Background()
	c := srv.client()
	var create, run []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		create = append(create, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	check(err)
	for i := 0; i < n*5+5; i++ {
		t0 := time.Now()
		code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		check(err)
		if code != 0 {
			fatal("true exited %d", code)
		}
		if i >= 5 {
			run = append(run, time.Since(t0))
		}
	}
	check(c.DeleteSandbox(ctx, sb.ID))
	r.add("atoll Go SDK `CreateSandbox`", "sequential", create)
	r.add("atoll Go SDK `Exec` of `true`", "sequential", run)

	stdio := exec.Command(srv.bin, "mcp")
	stdio.Env = append(os.Environ(), "ATOLL_URL="+srv.url, "ATOLL_API_KEY="+srv.key)
	hc := &http.Client{Transport: bearer{srv.key, http.DefaultTransport}}
	for _, tr := range []struct {
		name string
		t    mcp.Transport
	}{
		{"stdio (`atoll mcp`)", &mcp.CommandTransport{Command: stdio}},
		{"HTTP (`/v1/mcp`)", &mcp.StreamableClientTransport{Endpoint: srv.url + "/v1/mcp", HTTPClient: hc}},
	} {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, tr.t, nil)
		if err != nil {
			r.failed("MCP over "+tr.name, err.Error())
			continue
		}
		call := func(name string, args map[string]any) map[string]any {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
			check(err)
			if res.IsError {
				fatal("%s: %v", name, res.Content)
			}
			return res.StructuredContent.(map[string]any)
		}
		var create, run []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			sb := call("create_sandbox", map[string]any{})
			create = append(create, time.Since(t0))
			call("delete_sandbox", map[string]any{"sandbox": sb["id"]})
		}
		id := call("create_sandbox", map[string]any{})["id"]
		for i := 0; i < n*5+5; i++ {
			t0 := time.Now()
			out := call("exec", map[string]any{"sandbox": id, "argv": []string{"true"}})
			if out["exit_code"] != float64(0) {
				fatal("exec true over MCP: %v", out)
			}
			if i >= 5 {
				run = append(run, time.Since(t0))
			}
		}
		call("delete_sandbox", map[string]any{"sandbox": id})
		cs.Close()
		r.add(fmt.Sprintf("MCP over %s `create_sandbox`", tr.name), "sequential", create)
		r.add(fmt.Sprintf("MCP over %s `exec` of `true`", tr.name), "sequential", run)
	}
}

// bearer sends key with every request.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}
