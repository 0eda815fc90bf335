package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// The run_code tool: code in a stateful context of a code-interpreter
// sandbox (docs/code-interpreter.md), through the Go SDK's RunCode.

type runCodeIn struct {
	Sandbox    string            `json:"sandbox" jsonschema:"the sandbox's ID (made from the code-interpreter template)"`
	Code       string            `json:"code" jsonschema:"the code to run"`
	Language   string            `json:"language,omitempty" jsonschema:"python (default), bash, javascript or typescript: runs in that language's default context"`
	Context    string            `json:"context,omitempty" jsonschema:"a code context's ID, instead of language"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"environment variables for this run only"`
	TimeoutSec float64           `json:"timeout_sec,omitempty" jsonschema:"interrupt it after this many seconds (default 300, at most 3600); the context stays usable"`
}

// codeResult is one result of a run: a display, or the value of the
// code's last expression (main). Images (png, jpeg) come as MCP image
// content beside the structured result, and are named in formats.
type codeResult struct {
	Main     bool     `json:"main,omitempty" jsonschema:"the value of the code's last expression"`
	Text     string   `json:"text,omitempty"`
	HTML     string   `json:"html,omitempty"`
	Markdown string   `json:"markdown,omitempty"`
	SVG      string   `json:"svg,omitempty"`
	LaTeX    string   `json:"latex,omitempty"`
	JSON     any      `json:"json,omitempty"`
	Formats  []string `json:"formats" jsonschema:"every format the result has, e.g. text, html, png"`
}

type runCodeOut struct {
	Results        []codeResult `json:"results"`
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Truncated      bool         `json:"truncated,omitempty" jsonschema:"stdout or stderr was longer than 1 MiB and is cut"`
	ExecutionCount int          `json:"execution_count"`
}

// ExceptionMeta is the key in run_code's tool error's _meta of the
// exception the code raised: {"name", "value", "traceback", "stdout",
// "stderr"}.
const ExceptionMeta = "atoll.dev/exception"

// codeException is the exception the code raised: a tool error, so that a
// model sees its run failed, but one of the code, not of atoll, so it has
// no atoll error code (toolErrors formats it).
type codeException struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
}

func (e *codeException) Error() string { return e.Name + ": " + e.Value }

// text is what the model reads: the exception, its traceback, and the
// output before it.
func (e *codeException) text() string {
	var b strings.Builder
	b.WriteString(e.Error())
	for _, s := range []struct{ head, body string }{{"", e.Traceback}, {"stdout:\n", e.Stdout}, {"stderr:\n", e.Stderr}} {
		if s.body != "" {
			b.WriteString("\n\n" + s.head + s.body)
		}
	}
	return b.String()
}

// ansi matches the terminal colour codes IPython puts in tracebacks.
var ansi = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// runCodeTool adds run_code, whose result carries images as MCP image
// content beside the structured result, so it has its own handler rather
// than tool's.
func (t *tools) runCodeTool() adder {
	return func(s *mcp.Server) {
		mcp.AddTool(s, &mcp.Tool{Name: "run_code",
			Description: "Run Python, bash, JavaScript or TypeScript code in a stateful context of a code-interpreter sandbox (create_sandbox with template code-interpreter; variables and imports persist between calls). Output is streamed as progress; returns results (text, HTML, Markdown, SVG, LaTeX, JSON; images as image content) and the output. An exception is a tool error with its traceback.",
			Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false)}},
			func(ctx context.Context, req *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, runCodeOut, error) {
				out, images, err := t.runCode(ctx, req, in)
				if err != nil {
					var ce *codeException
					if errors.As(err, &ce) {
						return nil, runCodeOut{}, ce
					}
					return nil, runCodeOut{}, asToolError(err)
				}
				b, err := json.Marshal(out)
				if err != nil {
					return nil, runCodeOut{}, err
				}
				return &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: string(b)}}, images...)}, out, nil
			})
	}
}

func (t *tools) runCode(ctx context.Context, req *mcp.CallToolRequest, in runCodeIn) (runCodeOut, []mcp.Content, error) {
	if err := need("sandbox", in.Sandbox, "code", in.Code); err != nil {
		return runCodeOut{}, nil, err
	}
	if in.Language != "" && in.Context != "" {
		return runCodeOut{}, nil, invalid("give language or context, not both")
	}
	timeout, err := seconds("timeout_sec", in.TimeoutSec, maxExecTimeout)
	if err != nil {
		return runCodeOut{}, nil, err
	}
	if timeout == 0 {
		timeout = defaultExecTimeout
	}
	// Ending the request interrupts the execution; the context lives on.
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := progress{req: req}
	var stdout, stderr capped
	ex, err := t.c.RunCode(rctx, in.Sandbox, in.Code, atoll.RunCodeOptions{Context: in.Context, Language: in.Language, Envs: in.Env,
		OnStdout: func(s string) { stdout.Write([]byte(s)); p.send(ctx, []byte(s)) },
		OnStderr: func(s string) { stderr.Write([]byte(s)); p.send(ctx, []byte(s)) },
	})
	if rctx.Err() != nil && ctx.Err() == nil {
		return runCodeOut{}, nil, &toolError{Code: api.CodeUnavailable, Message: "the code ran past timeout_sec and was interrupted; its context stays usable"}
	}
	if err != nil {
		return runCodeOut{}, nil, err
	}
	if ex.Error != nil {
		return runCodeOut{}, nil, &codeException{Name: ex.Error.Name, Value: ex.Error.Value,
			Traceback: ansi.ReplaceAllString(ex.Error.Traceback, ""), Stdout: stdout.String(), Stderr: stderr.String()}
	}
	out, images := codeResults(ex.Results)
	out.Stdout, out.Stderr, out.Truncated, out.ExecutionCount = stdout.String(), stderr.String(), stdout.cut || stderr.cut, ex.ExecutionCount
	return out, images, nil
}

// codeResults turns an execution's results into the tool's, and its PNG
// and JPEG images into image content.
func codeResults(rs []api.CodeEvent) (runCodeOut, []mcp.Content) {
	out := runCodeOut{Results: []codeResult{}}
	var images []mcp.Content
	for _, r := range rs {
		cr := codeResult{Main: r.IsMainResult, Text: r.Text, HTML: r.HTML, Markdown: r.Markdown, SVG: r.SVG, LaTeX: r.LaTeX, Formats: []string{}}
		if len(r.JSON) > 0 && json.Unmarshal(r.JSON, &cr.JSON) != nil {
			cr.JSON = nil
		}
		for _, f := range []struct {
			name string
			set  bool
		}{{"text", r.Text != ""}, {"html", r.HTML != ""}, {"markdown", r.Markdown != ""}, {"svg", r.SVG != ""},
			{"latex", r.LaTeX != ""}, {"json", len(r.JSON) > 0}, {"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"pdf", r.PDF != ""}} {
			if f.set {
				cr.Formats = append(cr.Formats, f.name)
			}
		}
		for _, img := range []struct{ b64, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
			if img.b64 == "" {
				continue
			}
			if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(img.b64)); err == nil {
				images = append(images, &mcp.ImageContent{Data: b, MIMEType: img.mime})
			}
		}
		out.Results = append(out.Results, cr)
	}
	return out, images
}
