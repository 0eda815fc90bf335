package atoll

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/atoll-dev/atoll/api"
)

// Terminal is an interactive connection to a PTY process over a websocket.
// Read its output until io.EOF, then Wait for its exit code.
type Terminal struct {
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	pr     *io.PipeReader
	done   chan struct{} // closed when the reader goroutine ends

	// set by the reader goroutine before done is closed
	exit    *api.ExecEvent
	readErr error

	closeOnce sync.Once
}

// Terminal connects to the PTY process pid of sandbox id, started with
// StartProcess and an api.ExecRequest.PTY size.
func (c *Client) Terminal(ctx context.Context, id string, pid int) (*Terminal, error) {
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, c.base()+processPath(id, pid, "/ws"), &websocket.DialOptions{
		HTTPClient: c.hc,
		HTTPHeader: h,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, errorFrom(resp)
		}
		return nil, err
	}
	conn.SetReadLimit(4 << 20)
	pr, pw := io.Pipe()
	tctx, cancel := context.WithCancel(context.Background())
	t := &Terminal{conn: conn, ctx: tctx, cancel: cancel, pr: pr, done: make(chan struct{})}
	go t.read(pw)
	return t, nil
}

// read copies output frames into pw until the exit frame or an error.
func (t *Terminal) read(pw *io.PipeWriter) {
	defer close(t.done)
	for {
		typ, b, err := t.conn.Read(t.ctx)
		if err != nil {
			t.readErr = err
			pw.CloseWithError(io.EOF)
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := pw.Write(b); err != nil {
				return // Close was called
			}
			continue
		}
		var ev api.ExecEvent
		if json.Unmarshal(b, &ev) == nil && (ev.Type == api.EventExit || ev.Type == api.EventError) {
			t.exit = &ev
			pw.Close()
			t.conn.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

// Read reads the terminal's output. It returns io.EOF when the process has exited.
func (t *Terminal) Read(p []byte) (int, error) { return t.pr.Read(p) }

// Write sends p to the terminal as typed input.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize changes the terminal's size.
func (t *Terminal) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(struct {
		Type string `json:"type"`
		Rows uint16 `json:"rows"`
		Cols uint16 `json:"cols"`
	}{"resize", rows, cols})
	return t.conn.Write(t.ctx, websocket.MessageText, b)
}

// Wait waits for the process to exit and returns its exit code (-1 if a signal
// ended it). Output not yet read is discarded.
func (t *Terminal) Wait() (int, error) {
	io.Copy(io.Discard, t.pr)
	<-t.done
	switch {
	case t.exit == nil:
		if t.readErr != nil {
			return -1, t.readErr
		}
		return -1, errors.New("terminal closed before the process exited")
	case t.exit.Type == api.EventError:
		return -1, errors.New(t.exit.Message)
	case t.exit.ExitCode == nil:
		return -1, nil
	}
	return *t.exit.ExitCode, nil
}

// Close disconnects from the terminal; the process keeps running.
func (t *Terminal) Close() error {
	t.closeOnce.Do(func() {
		t.pr.Close()
		t.cancel()
		t.conn.CloseNow()
	})
	<-t.done
	return nil
}
