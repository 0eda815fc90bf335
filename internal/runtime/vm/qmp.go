package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// qmp is a connection to a QEMU's monitor: JSON lines over a unix socket,
// one command at a time. The protocol is small enough that a client of its
// own is simpler than a dependency (go-qemu wraps it in generated types for
// every command; this package uses five).
type qmp struct {
	conn net.Conn
	r    *bufio.Reader
}

// dialQMP connects to the monitor at path and leaves capability
// negotiation, so that commands may follow.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmp{conn: c, r: bufio.NewReader(c)}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(30 * time.Second))
	}
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading the QMP greeting: %w", err)
	}
	if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
		c.Close()
		return nil, fmt.Errorf("not a QMP greeting: %.100s", line)
	}
	if _, err := q.do("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) Close() error { return q.conn.Close() }

// do runs one command and returns its result, skipping events.
func (q *qmp) do(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s", cmd, resp.Error.Desc)
		default:
			return resp.Return, nil
		}
	}
}

// qmpRun runs one command on the monitor at path.
func qmpRun(ctx context.Context, path, cmd string, args any) (json.RawMessage, error) {
	q, err := dialQMP(ctx, path)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	return q.do(cmd, args)
}

// query runs query command cmd and decodes its answer into v.
func (q *qmp) query(cmd string, v any) error {
	out, err := q.do(cmd, nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// migrate saves the (stopped) VM's state to uri and waits until it is
// written.
func (q *qmp) migrate(ctx context.Context, uri string) error {
	if _, err := q.do("migrate", map[string]any{"uri": uri}); err != nil {
		return err
	}
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.query("query-migrate", &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_, _ = q.do("migrate_cancel", nil)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var errNotRunning = errors.New("the vm is not running")
