package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
)

func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	s, err := a.prepare(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	p, sub, err := a.start(s, !s.bg)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.bg {
		writeJSON(w, http.StatusOK, p.info())
		return
	}
	defer p.unsubscribe(sub)
	stream, err := startNDJSON(w)
	if err == nil {
		err = stream.send(api.ExecEvent{Type: api.EventStart, PID: p.pid})
	}
	if err != nil {
		if !s.detach {
			p.kill()
		}
		return
	}
	// A foreground process lives as long as its client listens, unless it
	// was started detached.
	if !a.pump(r.Context(), sub, stream) && !s.detach {
		p.kill()
	}
}

// pump streams sub's events until the exit event (true) or until the client
// goes away (false).
func (a *Agent) pump(ctx context.Context, sub *subscriber, stream *ndjson) bool {
	for {
		select {
		case ev, ok := <-sub.ch:
			if !ok {
				return true
			}
			if err := stream.send(ev); err != nil {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

func (a *Agent) handleListProcesses(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.ProcessList{Processes: a.processes(r.URL.Query().Get("tag"))})
}

func (a *Agent) handleGetProcess(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.info())
}

func (a *Agent) handleAttach(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	sub, exit := p.subscribe()
	if sub != nil {
		defer p.unsubscribe(sub)
	}
	stream, err := startNDJSON(w)
	if err != nil {
		return
	}
	if exit != nil {
		stream.send(exit)
		return
	}
	a.pump(r.Context(), sub, stream)
}

func (a *Agent) handleStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err == nil {
		err = p.writeStdin(r.Body)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleStdinClose(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err == nil {
		err = p.closeStdin()
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleSignal(w http.ResponseWriter, r *http.Request) {
	p, req, ok := processRequest[api.SignalRequest](a, w, r)
	if !ok {
		return
	}
	sig, err := parseSignal(req.Signal)
	if err == nil {
		err = p.signal(sig)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// A process sent SIGKILL is gone when the answer comes, as callers
	// (and E2B's SDK tests, which check with kill -0 right after) expect;
	// without the wait it may still be dying, or a zombie not yet reaped.
	if sig == unix.SIGKILL {
		t := time.NewTimer(killWait)
		defer t.Stop()
		select {
		case <-p.reaped:
		case <-t.C:
		case <-r.Context().Done():
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// killWait bounds how long a SIGKILL's answer waits for the process to be
// reaped: one stuck in the kernel (uninterruptible I/O) is answered anyway.
const killWait = 5 * time.Second

// processRequest reads the process {pid} of r and r's JSON body, a Req;
// it answers a bad request itself, and ok is false.
func processRequest[Req any](a *Agent, w http.ResponseWriter, r *http.Request) (p *process, req Req, ok bool) {
	p, err := a.process(r.PathValue("pid"))
	if err == nil {
		err = decodeJSON(w, r, &req)
	}
	if err != nil {
		writeError(w, err)
		return nil, req, false
	}
	return p, req, true
}

func (a *Agent) handleResize(w http.ResponseWriter, r *http.Request) {
	p, size, ok := processRequest[api.PTYSize](a, w, r)
	if !ok {
		return
	}
	if err := p.resize(size); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wsControl is a text frame from a websocket client.
type wsControl struct {
	Type string `json:"type"` // "resize"
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

func (a *Agent) handleWebsocket(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	// Only the node can reach this socket, and it authenticates the caller:
	// browser origin checks belong there.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxJSONBody)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	sub, exit := p.subscribe()
	if exit != nil {
		a.wsExit(ctx, c, *exit)
		return
	}
	defer p.unsubscribe(sub)

	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if err := p.writeStdin(bytes.NewReader(data)); err != nil {
					a.log.Debug("websocket stdin", "pid", p.pid, "err", err)
				}
				continue
			}
			var ctl wsControl
			if err := json.Unmarshal(data, &ctl); err != nil || ctl.Type != "resize" {
				c.Close(websocket.StatusUnsupportedData, "unknown control message")
				return
			}
			if err := p.resize(api.PTYSize{Rows: ctl.Rows, Cols: ctl.Cols}); err != nil {
				a.log.Debug("websocket resize", "pid", p.pid, "err", err)
			}
		}
	}()
	defer func() {
		cancel()
		<-readDone
	}()

	for {
		select {
		case ev, ok := <-sub.ch:
			if !ok {
				return
			}
			if ev.Type == api.EventExit {
				a.wsExit(ctx, c, ev)
				return
			}
			if err := c.Write(ctx, websocket.MessageBinary, ev.Data); err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (a *Agent) wsExit(ctx context.Context, c *websocket.Conn, ev api.ExecEvent) {
	b, _ := json.Marshal(ev)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Write(wctx, websocket.MessageText, b); err != nil {
		return
	}
	c.Close(websocket.StatusNormalClosure, "")
}
