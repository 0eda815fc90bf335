package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
)

// The tools against a real server are tested in cmd/atoll
// (mcp_e2e_test.go); these need none.

// session connects a client in memory to a server whose tools act on url.
func session(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := New(Config{URL: url, Key: "k"}).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestToolTable checks what every tool shows a model: a description, an
// input schema that refuses unknown arguments, an output schema, hints.
func TestToolTable(t *testing.T) {
	cs := session(t, "http://127.0.0.1:1")
	l, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Tools) != len((&tools{}).table()) {
		t.Errorf("%d tools listed, %d in the table", len(l.Tools), len((&tools{}).table()))
	}
	for _, tl := range l.Tools {
		in, _ := tl.InputSchema.(map[string]any)
		if tl.Description == "" || in == nil || tl.OutputSchema == nil || tl.Annotations == nil {
			t.Errorf("%s: description %q, input schema %v, output schema %v, annotations %v", tl.Name, tl.Description, in != nil, tl.OutputSchema != nil, tl.Annotations)
			continue
		}
		if ap, ok := in["additionalProperties"]; !ok || ap == true {
			t.Errorf("%s: its input schema takes unknown arguments (%v)", tl.Name, ap)
		}
		if strings.HasPrefix(tl.Name, "delete_") && (tl.Annotations.DestructiveHint == nil || !*tl.Annotations.DestructiveHint) {
			t.Errorf("%s is not marked destructive", tl.Name)
		}
	}
}

// TestToolErrors: every failure is a tool error with atoll's code, in its
// text and _meta; never a JSON-RPC error.
func TestToolErrors(t *testing.T) {
	// A server that is not there: a listener closed at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	cs := session(t, url)
	for _, c := range []struct {
		tool string
		args map[string]any
		code string
		text string
	}{
		{"inspect_sandbox", map[string]any{"sandbox": "abc"}, "unavailable", "connection refused"},
		{"inspect_sandbox", map[string]any{}, "invalid", `missing properties: ["sandbox"]`},
		{"inspect_sandbox", map[string]any{"sandbox": ""}, "invalid", "sandbox must not be empty"},
		{"inspect_sandbox", map[string]any{"sandbox": 7}, "invalid", "sandbox"},
		{"read_file", map[string]any{"sandbox": "abc", "file": "/x"}, "invalid", "unexpected additional properties"},
		{"exec", map[string]any{"sandbox": "abc"}, "invalid", "give either command"},
		{"exec", map[string]any{"sandbox": "abc", "command": "x", "timeout_sec": -1}, "invalid", "timeout_sec must be between 0 and 3600"},
		{"write_file", map[string]any{"sandbox": "abc", "path": "/x", "content": "x", "mode": "9"}, "invalid", "octal"},
		{"write_file", map[string]any{"sandbox": "abc", "path": "/x", "content": "!", "encoding": "base64"}, "invalid", "not base64"},
		{"run_code", map[string]any{"sandbox": "abc", "code": ""}, "invalid", "code must not be empty"},
		{"run_code", map[string]any{"sandbox": "abc", "code": "1", "language": "python", "context": "c"}, "invalid", "language or context"},
		{"run_code", map[string]any{"sandbox": "abc", "code": "1", "timeout_sec": 4000}, "invalid", "timeout_sec must be between 0 and 3600"},
		{"run_code", map[string]any{"sandbox": "abc", "code": "1"}, "unavailable", "connection refused"},
		{"port_url", map[string]any{"sandbox": "abc", "port": 0}, "invalid", "port must be between 1 and 65535"},
		{"fork_sandbox", map[string]any{"sandbox": "abc", "count": 500}, "invalid", "count"},
		{"vault_write", map[string]any{"vault": "v", "path": "/etc/passwd", "content": "x"}, "invalid", "relative path"},
		{"vault_write", map[string]any{"vault": "v", "path": "a/../../b", "content": "x"}, "invalid", "relative path"},
	} {
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %v: a protocol error: %v", c.tool, c.args, err)
			continue
		}
		text := ""
		if len(r.Content) == 1 {
			text = r.Content[0].(*mcp.TextContent).Text
		}
		e, _ := r.Meta[ErrorMeta].(map[string]any)
		if !r.IsError || !strings.HasPrefix(text, c.code+": ") || !strings.Contains(text, c.text) || e["code"] != c.code || r.StructuredContent != nil {
			t.Errorf("%s %v: isError %v, %q, _meta %v, structured %v; want %s: …%s…", c.tool, c.args, r.IsError, text, r.Meta, r.StructuredContent, c.code, c.text)
		}
	}
}

// TestCodeResults: run_code's results as a model gets them, images as
// image content; and an exception as a tool error with its traceback, no
// colour codes. (Against a real code-interpreter sandbox:
// TestCodeInterpreter in cmd/atoll.)
func TestCodeResults(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nrest")
	out, images := codeResults([]api.CodeEvent{
		{Type: api.CodeResult, Text: "<Figure>", PNG: base64.StdEncoding.EncodeToString(png)},
		{Type: api.CodeResult, IsMainResult: true, Text: "df", HTML: "<table></table>", JSON: json.RawMessage(`{"a":1}`)},
	})
	b, _ := json.Marshal(out.Results)
	if want := `[{"text":"\u003cFigure\u003e","formats":["text","png"]},{"main":true,"text":"df","html":"\u003ctable\u003e\u003c/table\u003e","json":{"a":1},"formats":["text","html","json"]}]`; string(b) != want {
		t.Errorf("results %s, want %s", b, want)
	}
	if len(images) != 1 || images[0].(*mcp.ImageContent).MIMEType != "image/png" || string(images[0].(*mcp.ImageContent).Data) != string(png) {
		t.Errorf("images %v", images)
	}

	ce := &codeException{Name: "ZeroDivisionError", Value: "division by zero", Traceback: ansi.ReplaceAllString("\x1b[0;31mZeroDivisionError\x1b[0m: division by zero", ""), Stdout: "hi\n"}
	r := &mcp.CallToolResult{}
	r.SetError(ce)
	res, err := toolErrors(func(context.Context, string, mcp.Request) (mcp.Result, error) { return r, nil })(context.Background(), "tools/call", nil)
	if err != nil {
		t.Fatal(err)
	}
	r = res.(*mcp.CallToolResult)
	text := r.Content[0].(*mcp.TextContent).Text
	if want := "ZeroDivisionError: division by zero\n\nZeroDivisionError: division by zero\n\nstdout:\nhi\n"; !r.IsError || text != want || r.Meta[ExceptionMeta] != ce {
		t.Errorf("exception: isError %v, %q, _meta %v; want %q", r.IsError, text, r.Meta, want)
	}
}
