package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	atollmcp "github.com/atoll-dev/atoll/internal/mcp"
)

// codeMCP calls the MCP run_code tool on a code-interpreter sandbox: state
// across calls, output streamed as progress, the main result, an exception
// as a tool error, a matplotlib figure as image content, bash, JavaScript,
// a timeout the context survives.
func codeMCP(t *testing.T, ci *codeInterpreter) {
	var mu sync.Mutex
	var progress []string
	cs := mcpSession(t, ci.d, ci.d.key, func(p *mcp.ProgressNotificationParams) {
		mu.Lock()
		defer mu.Unlock()
		if p.ProgressToken == "code-1" {
			progress = append(progress, p.Message)
		}
	})
	sb := toolOK[struct{ ID string }](t, cs, "create_sandbox", args{"template": "code-interpreter"})
	defer toolOK[any](t, cs, "delete_sandbox", args{"sandbox": sb.ID})
	type ran struct {
		Results []struct {
			Main    bool
			Text    string
			Formats []string
		}
		Stdout, Stderr string
		ExecutionCount int `json:"execution_count"`
	}
	main := func(r ran) string {
		for _, x := range r.Results {
			if x.Main {
				return x.Text
			}
		}
		return ""
	}
	r := toolOK[ran](t, cs, "run_code", args{"sandbox": sb.ID, "code": "x = 20\nprint('hi')\nx + 1"}, mcp.Meta{"progressToken": "code-1"})
	if main(r) != "21" || r.Stdout != "hi\n" || r.ExecutionCount < 1 {
		t.Errorf("run_code: %+v", r)
	}
	mu.Lock()
	// The client may drop the last notification (docs/mcp.md): at most
	// the one chunk, and never a wrong one.
	if p := strings.Join(progress, ""); p != "hi\n" && p != "" {
		t.Errorf("run_code's progress: %q", progress)
	}
	mu.Unlock()
	if r := toolOK[ran](t, cs, "run_code", args{"sandbox": sb.ID, "code": "x * 2"}); main(r) != "40" {
		t.Errorf("run_code of x * 2 after x = 20: %+v", r)
	}

	res := callTool(t, cs, "run_code", args{"sandbox": sb.ID, "code": "print('before')\n1/0"})
	var ex struct{ Name, Value, Traceback, Stdout string }
	b, _ := json.Marshal(res.Meta[atollmcp.ExceptionMeta])
	json.Unmarshal(b, &ex)
	text := toolText(res)
	if !res.IsError || ex.Name != "ZeroDivisionError" || ex.Stdout != "before\n" || !strings.HasPrefix(text, "ZeroDivisionError: division by zero\n\n") ||
		!strings.Contains(text, "1/0") || strings.Contains(text, "\x1b[") || !strings.HasSuffix(text, "stdout:\nbefore\n") {
		t.Errorf("run_code of 1/0: isError %v, _meta %+v, text %q", res.IsError, ex, text)
	}

	res = callTool(t, cs, "run_code", args{"sandbox": sb.ID, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"})
	var png bool
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok && img.MIMEType == "image/png" && bytes.HasPrefix(img.Data, []byte("\x89PNG\r\n\x1a\n")) {
			png = true
		}
	}
	if res.IsError || !png {
		t.Errorf("run_code of a matplotlib figure: no PNG image content: %.500s", toolText(res))
	}
	if r := toolOK[ran](t, cs, "run_code", args{"sandbox": sb.ID, "language": "bash", "code": "echo $((2 + 3))"}); r.Stdout != "5\n" {
		t.Errorf("run_code in bash: %+v", r)
	}
	if r := toolOK[ran](t, cs, "run_code", args{"sandbox": sb.ID, "language": "javascript", "code": "const y = 4\nconsole.log('js')\ny * 10"}); main(r) != "40" || r.Stdout != "js\n" {
		t.Errorf("run_code in javascript: %+v", r)
	}
	toolErr(t, cs, "unavailable", "run_code", args{"sandbox": sb.ID, "code": "import time\ntime.sleep(60)", "timeout_sec": 1})
	if r := toolOK[ran](t, cs, "run_code", args{"sandbox": sb.ID, "code": "x"}); main(r) != "20" {
		t.Errorf("run_code after a timeout: %+v", r)
	}
}
