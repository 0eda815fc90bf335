package atoll

import (
	"context"
	"net/http"
	"net/url"

	"github.com/atoll-dev/atoll/api"
)

// The code interpreter: stateful code contexts (Jupyter kernels) in a
// sandbox made from the code-interpreter template, as E2B's code-interpreter
// SDK has them (docs/code-interpreter.md).

// RunCodeOptions are the options of RunCode. Context and Language exclude
// each other; with neither the code runs in the default Python context.
// The callbacks see the execution's events as they come.
type RunCodeOptions struct {
	Context  string            // a context's ID
	Language string            // "python", "bash", "javascript" or "typescript" (js, ts): that language's default context
	Envs     map[string]string // environment variables for this execution only

	OnStdout func(text string)
	OnStderr func(text string)
	OnResult func(api.CodeEvent)
	OnError  func(ExecutionError)
}

// Execution is what an execution produced.
type Execution struct {
	// Results are its results: displays, and the value of its last
	// expression (IsMainResult).
	Results []api.CodeEvent
	Stdout  []string
	Stderr  []string
	// Error is the exception it raised, if any.
	Error          *ExecutionError
	ExecutionCount int
}

// Text is the text of the execution's main result, if it has one.
func (e Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// ExecutionError is an exception the code raised (in bash, a non-zero exit
// status).
type ExecutionError struct {
	Name, Value, Traceback string
}

func (e *ExecutionError) Error() string { return e.Name + ": " + e.Value }

// RunCode runs code in sandbox id and returns what it produced. Ending ctx
// ends the request, which interrupts the execution; the context stays
// usable. An exception in the code is Execution.Error, not an error.
func (c *Client) RunCode(ctx context.Context, id, code string, opts RunCodeOptions) (Execution, error) {
	resp, err := c.send(ctx, request{method: "POST", path: sandboxPath(id, "/code/execute"), json: api.RunCodeRequest{
		Code: code, ContextID: opts.Context, Language: opts.Language, EnvVars: opts.Envs,
	}})
	if err != nil {
		return Execution{}, err
	}
	s := newStream[api.CodeEvent](resp.Body)
	defer s.Close()
	var ex Execution
	for ev := range s.All() {
		switch ev.Type {
		case api.CodeStdout:
			ex.Stdout = append(ex.Stdout, ev.Text)
			if opts.OnStdout != nil {
				opts.OnStdout(ev.Text)
			}
		case api.CodeStderr:
			ex.Stderr = append(ex.Stderr, ev.Text)
			if opts.OnStderr != nil {
				opts.OnStderr(ev.Text)
			}
		case api.CodeResult:
			ex.Results = append(ex.Results, ev)
			if opts.OnResult != nil {
				opts.OnResult(ev)
			}
		case api.CodeError:
			ex.Error = &ExecutionError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
			if opts.OnError != nil {
				opts.OnError(*ex.Error)
			}
		case api.CodeCount:
			ex.ExecutionCount = ev.ExecutionCount
		case api.CodeEnd:
			return ex, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return ex, err
	}
	if err := s.Err(); err != nil {
		return ex, err
	}
	// The stream ended without its last event: the execution was cut off.
	return ex, &Error{StatusCode: http.StatusBadGateway, Code: api.CodeUnavailable, Message: "the code execution's stream ended before its end"}
}

// CreateCodeContext starts a new code context in sandbox id.
func (c *Client) CreateCodeContext(ctx context.Context, id string, req api.CreateCodeContextRequest) (api.CodeContext, error) {
	return call[api.CodeContext](ctx, c, request{method: "POST", path: sandboxPath(id, "/code/contexts"), json: req})
}

// ListCodeContexts lists sandbox id's code contexts, the default ones
// included.
func (c *Client) ListCodeContexts(ctx context.Context, id string) ([]api.CodeContext, error) {
	return call[[]api.CodeContext](ctx, c, request{method: "GET", path: sandboxPath(id, "/code/contexts")})
}

// RestartCodeContext restarts a context's kernel: its state is lost.
func (c *Client) RestartCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: "POST", path: sandboxPath(id, "/code/contexts/", url.PathEscape(contextID), "/restart")}, nil)
}

// RemoveCodeContext stops and removes a code context.
func (c *Client) RemoveCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: "DELETE", path: sandboxPath(id, "/code/contexts/", url.PathEscape(contextID))}, nil)
}
