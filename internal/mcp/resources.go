package mcp

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// fileURIPrefix starts the URI of a sandbox's file: the sandbox's ID,
// "/files", then the file's absolute path, e.g.
// atoll://sandboxes/3k9x2m7q/files/etc/os-release.
const fileURIPrefix = "atoll://sandboxes/"

// FileURI is the resource URI of the file at path (absolute) of sandbox id.
func FileURI(id, path string) string {
	return fileURIPrefix + url.PathEscape(id) + "/files/" + strings.TrimPrefix(path, "/")
}

// addResources makes sandboxes' files MCP resources, through one resource
// template: a client (or its user) attaches a file to a conversation by
// its URI. Sandboxes come and go, so no fixed resources are listed.
func (t *tools) addResources(s *mcp.Server) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "A file in a sandbox",
		Description: "The contents of a file of a sandbox: text when it is UTF-8, else a blob.",
		URITemplate: fileURIPrefix + "{sandbox}/files/{+path}",
	}, t.readResource)
}

func (t *tools) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, path, ok := strings.Cut(strings.TrimPrefix(uri, fileURIPrefix), "/files/")
	if !strings.HasPrefix(uri, fileURIPrefix) || !ok || id == "" || path == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if u, err := url.PathUnescape(id); err == nil {
		id = u
	}
	if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	b, err := t.read(ctx, id, "/"+path)
	if errors.Is(err, atoll.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, asToolError(err)
	}
	c := &mcp.ResourceContents{URI: uri}
	if utf8.Valid(b) {
		c.MIMEType, c.Text = "text/plain; charset=utf-8", string(b)
	} else {
		c.MIMEType, c.Blob = "application/octet-stream", b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}
