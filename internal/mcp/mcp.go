// Package mcp serves atoll as a Model Context Protocol server: tools that
// create and drive sandboxes, their files, snapshots, ports and the memory
// vaults, and sandbox files as resources. The tools act through the Go SDK
// (sdk/go), so an MCP client can do exactly what the key it connects with
// may do over the REST API, nothing more: `atoll mcp` serves them on stdio
// for desktop agents and IDEs, and the server at /v1/mcp over streamable
// HTTP (docs/mcp.md).
package mcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// Config says which server the tools act on, and as whom.
type Config struct {
	// URL is the atoll server's URL (several nodes' separated by commas).
	URL string
	// Key is the API key the tools act with; the vault_write tool pushes
	// to the vault's git URL with it.
	Key string
	// HTTPClient, if set, sends the SDK's requests.
	HTTPClient *http.Client
	// Version is reported to clients as the server's version.
	Version string
}

// New returns an MCP server whose tools act on the server cfg names.
func New(cfg Config) *mcp.Server {
	opts := []atoll.Option{atoll.WithUserAgent("atoll-mcp")}
	if cfg.HTTPClient != nil {
		opts = append(opts, atoll.WithHTTPClient(cfg.HTTPClient))
	}
	t := &tools{c: atoll.New(cfg.URL, cfg.Key, opts...), key: cfg.Key}
	s := mcp.NewServer(&mcp.Implementation{Name: "atoll", Title: "atoll sandboxes", Version: cfg.Version},
		&mcp.ServerOptions{Instructions: instructions})
	for _, add := range t.table() {
		add(s)
	}
	t.addResources(s)
	s.AddReceivingMiddleware(toolErrors)
	return s
}

const instructions = `atoll runs isolated, stateful Linux sandboxes. Create one with create_sandbox, ` +
	`run commands in it with exec, move files with write_file/read_file or upload_dir/download_dir ` +
	`(tar, base64), snapshot, fork and restore it, and delete it when done. ` +
	`Files are also resources: atoll://sandboxes/{sandbox}/files/{path}. ` +
	`Errors carry atoll's error code (invalid, not_found, conflict, unavailable, quota_exceeded, ...).`

// toolError is a tool's failure as the client sees it: atoll's error code
// (api.ErrorCodes) and a message.
type toolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *toolError) Error() string { return e.Code + ": " + e.Message }

// invalid is a refused argument.
func invalid(format string, args ...any) error {
	return &toolError{Code: api.CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

// asToolError gives err atoll's code: the server's own for its answers.
func asToolError(err error) *toolError {
	var te *toolError
	var ae *atoll.Error
	switch {
	case errors.As(err, &te):
		return te
	case errors.As(err, &ae):
		code := ae.Code
		if code == "" {
			code = api.CodeOf(ae.StatusCode)
		}
		// The server's messages often start with their kind ("conflict:
		// sandbox … is stopped"), which the text puts first already.
		msg := strings.TrimPrefix(ae.Error(), code+": ")
		msg = strings.TrimPrefix(msg, strings.ReplaceAll(code, "_", " ")+": ")
		return &toolError{Code: code, Message: msg}
	default:
		// The server could not be reached, or answered too late.
		return &toolError{Code: api.CodeUnavailable, Message: err.Error()}
	}
}

// ErrorMeta is the key in a tool error's _meta of the error's
// {"code", "message"}.
const ErrorMeta = "atoll.dev/error"

// toolErrors makes every failed tool call an MCP tool error (isError)
// whose text is "CODE: message" with atoll's error code, and whose _meta
// holds the two under ErrorMeta, never a JSON-RPC error: a model reads tool
// errors and can correct itself. The SDK's own refusals (arguments that do
// not match the tool's input schema) come as errors of no code: invalid.
func toolErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		r, ok := res.(*mcp.CallToolResult)
		if method != "tools/call" || err != nil || !ok || !r.IsError {
			return res, err
		}
		var ce *codeException
		if errors.As(r.GetError(), &ce) {
			// The code's exception: no atoll code, its own text and _meta.
			r.Content = []mcp.Content{&mcp.TextContent{Text: ce.text()}}
			r.StructuredContent = nil
			r.Meta = mcp.Meta{ExceptionMeta: ce}
			return r, nil
		}
		var te *toolError
		if e := r.GetError(); !errors.As(e, &te) {
			msg := "bad arguments"
			if e != nil {
				msg = "bad arguments: " + e.Error()
			}
			te = &toolError{Code: api.CodeInvalid, Message: msg}
		}
		r.Content = []mcp.Content{&mcp.TextContent{Text: te.Error()}}
		// Not structured content: clients check that against the tool's
		// output schema, errors or not.
		r.StructuredContent = nil
		if r.Meta == nil {
			r.Meta = mcp.Meta{}
		}
		r.Meta[ErrorMeta] = te
		return r, nil
	}
}
