package atoll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"

	"github.com/atoll-dev/atoll/api"
)

// Stream is an NDJSON stream of events: exec output, attach, watch.
//
//	for s.Next() {
//		ev := s.Event()
//		…
//	}
//	if err := s.Err(); err != nil { … }
type Stream[T any] struct {
	body io.ReadCloser
	dec  *json.Decoder
	ev   T
	err  error
}

func newStream[T any](body io.ReadCloser) *Stream[T] {
	return &Stream[T]{body: body, dec: json.NewDecoder(body)}
}

// Next reads the next event and reports whether there was one.
func (s *Stream[T]) Next() bool {
	if s.err != nil {
		return false
	}
	var ev T
	if err := s.dec.Decode(&ev); err != nil {
		if err != io.EOF {
			s.err = fmt.Errorf("reading stream: %w", err)
		}
		return false
	}
	s.ev = ev
	return true
}

// Event is the event Next read.
func (s *Stream[T]) Event() T { return s.ev }

// Err is the error that ended the stream early, if any.
func (s *Stream[T]) Err() error { return s.err }

// All iterates over the remaining events; check Err afterwards.
func (s *Stream[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for s.Next() {
			if !yield(s.Event()) {
				return
			}
		}
	}
}

// Close ends the stream.
func (s *Stream[T]) Close() error { return s.body.Close() }

// Exec runs a command in sandbox id, copying its output to stdout and stderr
// (either may be nil), and returns its exit code: -1 if a signal ended it.
// err is about running it, not about the code.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (exitCode int, err error) {
	s, err := c.ExecStream(ctx, id, req)
	if err != nil {
		return -1, err
	}
	defer s.Close()
	return copyEvents(s, stdout, stderr)
}

// copyEvents writes a stream's output to stdout and stderr and returns the exit code.
func copyEvents(s *Stream[api.ExecEvent], stdout, stderr io.Writer) (int, error) {
	for s.Next() {
		ev := s.Event()
		var w io.Writer
		switch ev.Type {
		case api.EventStdout:
			w = stdout
		case api.EventStderr:
			w = stderr
		case api.EventExit:
			if ev.ExitCode == nil {
				return -1, nil
			}
			return *ev.ExitCode, nil
		case api.EventError:
			return -1, fmt.Errorf("exec: %s", ev.Message)
		}
		if w != nil {
			if _, err := w.Write(ev.Data); err != nil {
				return -1, err
			}
		}
	}
	if err := s.Err(); err != nil {
		return -1, err
	}
	return -1, errors.New("exec: stream ended before the process exited")
}

// ExecStream runs a command in sandbox id and returns its events as they
// happen: start, stdout and stderr, then exit or error.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest) (*Stream[api.ExecEvent], error) {
	if req.Background {
		return nil, &Error{StatusCode: 400, Code: "invalid", Message: "ExecStream: use StartProcess for background processes"}
	}
	resp, err := c.send(ctx, request{method: "POST", path: sandboxPath(id, "/exec"), json: req})
	if err != nil {
		return nil, err
	}
	return newStream[api.ExecEvent](resp.Body), nil
}

// StartProcess starts a command in the background and returns it at once.
// Follow it with Attach, Terminal, SendStdin, Signal, GetProcess.
func (c *Client) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	req.Background = true
	return call[api.Process](ctx, c, request{method: "POST", path: sandboxPath(id, "/exec"), json: req})
}

// ListProcesses returns the processes the sandbox's agent started.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	l, err := call[api.ProcessList](ctx, c, request{method: "GET", path: sandboxPath(id, "/processes")})
	return l.Processes, err
}

// GetProcess returns process pid of sandbox id.
func (c *Client) GetProcess(ctx context.Context, id string, pid int) (api.Process, error) {
	return call[api.Process](ctx, c, request{method: "GET", path: processPath(id, pid, "")})
}

// Attach streams a process's output from now on, then its exit.
func (c *Client) Attach(ctx context.Context, id string, pid int) (*Stream[api.ExecEvent], error) {
	resp, err := c.send(ctx, request{method: "GET", path: processPath(id, pid, "/attach")})
	if err != nil {
		return nil, err
	}
	return newStream[api.ExecEvent](resp.Body), nil
}

// SendStdin writes r to the process's stdin (started with KeepStdin or a PTY).
func (c *Client) SendStdin(ctx context.Context, id string, pid int, r io.Reader) error {
	return c.do(ctx, request{method: "POST", path: processPath(id, pid, "/stdin"), body: r, ctype: "application/octet-stream"}, nil)
}

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, id string, pid int) error {
	return c.do(ctx, request{method: "POST", path: processPath(id, pid, "/stdin/close")}, nil)
}

// Signal sends a signal ("SIGTERM", "TERM" or a number) to the process.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	return c.do(ctx, request{method: "POST", path: processPath(id, pid, "/signal"), json: api.SignalRequest{Signal: signal}}, nil)
}

// Resize resizes a PTY process's terminal.
func (c *Client) Resize(ctx context.Context, id string, pid int, size api.PTYSize) error {
	return c.do(ctx, request{method: "POST", path: processPath(id, pid, "/resize"), json: size}, nil)
}
