package envd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/process"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// processService is E2B's process.Process over the atoll agent. E2B's
// processes outlive the streams that watch them, so every process is
// started detached; the RPC timeout (Connect-Timeout-Ms) kills it, as in
// envd.
type processService struct{ s *Server }

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	c := callFrom(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return invalid("process.cmd is required")
	}
	er := api.ExecRequest{
		Cmd:    append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:    cfg.GetEnvs(),
		User:   c.user,
		Tag:    m.GetTag(),
		Detach: true,
		// Absent means open: old SDKs always had stdin.
		KeepStdin: m.Stdin == nil || m.GetStdin(),
	}
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd, err := c.resolve(ctx, cfg.GetCwd())
		if err != nil {
			return err
		}
		er.Cwd = cwd
	}
	if m.Pty != nil {
		size := m.GetPty().GetSize()
		if size.GetRows() == 0 || size.GetCols() == 0 || size.GetRows() > math.MaxUint16 || size.GetCols() > math.MaxUint16 {
			return invalid("pty size must be 1 to 65535 rows and columns")
		}
		er.PTY = &api.PTYSize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}
	}
	er.TimeoutMs = timeoutMs(ctx, req.Header().Get("Connect-Timeout-Ms"))
	es, err := c.sb.Agent.ExecStream(ctx, er)
	if err != nil {
		return rpcError(err)
	}
	defer es.Close()
	return p.s.relay(ctx, es, er.PTY != nil, keepaliveInterval(req.Header()), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

// timeoutMs is how long the client lets the process run: E2B's envd kills
// a process when its Start call's deadline passes.
func timeoutMs(ctx context.Context, header string) int64 {
	if ms, err := strconv.ParseInt(header, 10, 64); err == nil && ms > 0 {
		return ms
	}
	if dl, ok := ctx.Deadline(); ok {
		return max(1, time.Until(dl).Milliseconds())
	}
	return 0
}

// relay turns an agent event stream into E2B process events: a start event
// (which the agent sends first), output, and the end event; keepalives in
// between while it is idle.
func (s *Server) relay(ctx context.Context, es *agent.EventStream, pty bool, keepalive time.Duration, send func(*process.ProcessEvent) error) error {
	type next struct {
		ev  api.ExecEvent
		err error
	}
	events := make(chan next)
	done, stopped := make(chan struct{}), make(chan struct{})
	defer func() {
		close(done)
		es.Close() // unblocks the reader
		<-stopped
	}()
	go func() {
		defer close(stopped)
		for {
			ev, err := es.Next()
			select {
			case events <- next{ev, err}:
			case <-done:
				return
			}
			if err != nil || ev.Type == api.EventExit {
				return
			}
		}
	}()
	var tick <-chan time.Time
	if keepalive > 0 {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		tick = t.C
	}
	for {
		var n next
		select {
		case <-ctx.Done():
			return rpcError(ctx.Err())
		case <-tick:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		case n = <-events:
		}
		if n.err != nil {
			if ctx.Err() != nil {
				return rpcError(ctx.Err())
			}
			if errors.Is(n.err, io.ErrUnexpectedEOF) {
				sandboxGone()
			}
			return rpcError(n.err)
		}
		ev, last := processEvent(n.ev, pty)
		if ev == nil {
			if n.ev.Type == api.EventError {
				return connect.NewError(connect.CodeInternal, errors.New(n.ev.Message))
			}
			continue
		}
		if err := send(ev); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// sandboxGone ends a stream whose sandbox stopped under it the way it
// ends on E2B, where envd goes down with its sandbox: the connection
// drops, with no end of stream. SDKs tell that from a network failure by
// asking envd's health, which then answers 502, and report "the sandbox
// was killed or reached its end of life"; an RPC error would be reported
// as a plain timeout instead.
func sandboxGone() {
	panic(http.ErrAbortHandler) // net/http drops the connection (HTTP/1) or resets the stream (HTTP/2)
}

// processEvent converts one agent event; last marks the end event.
func processEvent(ev api.ExecEvent, pty bool) (_ *process.ProcessEvent, last bool) {
	switch ev.Type {
	case api.EventStart:
		return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(ev.PID)}}}, false
	case api.EventStdout, api.EventStderr:
		d := &process.ProcessEvent_DataEvent{}
		switch {
		case pty:
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
		case ev.Type == api.EventStdout:
			d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
		default:
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
		}
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}, false
	case api.EventExit:
		return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(ev)}}, true
	}
	return nil, false
}

// endEvent says how a process ended in the words of Go's os.ProcessState,
// which is what envd reports ("exit status 1", "signal: killed"); SDKs show
// the error text in CommandExitError.
func endEvent(ev api.ExecEvent) *process.ProcessEvent_EndEvent {
	code := 0
	if ev.ExitCode != nil {
		code = *ev.ExitCode
	}
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: ev.Signal == ""}
	if ev.Signal != "" {
		name := ev.Signal
		if n := unix.SignalNum(ev.Signal); n != 0 {
			name = syscall.Signal(n).String()
		}
		end.Status = "signal: " + name
	} else {
		end.Status = fmt.Sprintf("exit status %d", code)
	}
	if code != 0 || ev.Signal != "" {
		msg := end.Status
		end.Error = &msg
	}
	return end
}

// pid finds the running process sel names: by pid, or the newest running
// one with the tag.
func (c *call) pid(ctx context.Context, sel *process.ProcessSelector) (api.Process, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if s.Pid == 0 || s.Pid > math.MaxInt32 {
			return api.Process{}, invalid("bad pid %d", s.Pid)
		}
		p, err := c.sb.Agent.Process(ctx, int(s.Pid))
		if isNotFound(err) || err == nil && !p.Running {
			return api.Process{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
		}
		return p, rpcError(err)
	case *process.ProcessSelector_Tag:
		if s.Tag == "" {
			return api.Process{}, invalid("empty process tag")
		}
		ps, err := c.sb.Agent.Processes(ctx, s.Tag)
		if err != nil {
			return api.Process{}, rpcError(err)
		}
		for i := len(ps) - 1; i >= 0; i-- { // oldest first
			if ps[i].Running {
				return ps[i], nil
			}
		}
		return api.Process{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return api.Process{}, invalid("process selector is required")
}

// exitedError answers a call on a process that may have just exited: the
// agent says conflict, E2B says not found.
func (c *call) exitedError(ctx context.Context, pid int, err error) error {
	if errors.Is(err, errdefs.ErrConflict) {
		if p, perr := c.sb.Agent.Process(ctx, pid); perr == nil && !p.Running || isNotFound(perr) {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
		}
	}
	if isNotFound(err) {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
	}
	return rpcError(err)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	c := callFrom(ctx)
	proc, err := c.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	es, err := c.sb.Agent.Attach(ctx, proc.PID)
	if err != nil {
		return c.exitedError(ctx, proc.PID, err)
	}
	defer es.Close()
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	// The agent's attach stream has no start event; E2B's begins with one.
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(proc.PID)}}}); err != nil {
		return err
	}
	return p.s.relay(ctx, es, proc.PTY, keepaliveInterval(req.Header()), send)
}

func (p *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	c := callFrom(ctx)
	ps, err := c.sb.Agent.Processes(ctx, "")
	if err != nil {
		return nil, rpcError(err)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].PID < ps[j].PID })
	out := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, p := range ps {
		if !p.Running || len(p.Cmd) == 0 {
			continue
		}
		info := &process.ProcessInfo{
			Pid: uint32(p.PID),
			// The agent does not report a process's environment or cwd.
			Config: &process.ProcessConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:], Envs: map[string]string{}},
		}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	c := callFrom(ctx)
	proc, err := c.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.write(ctx, proc.PID, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (c *call) write(ctx context.Context, pid int, in *process.ProcessInput) error {
	var data []byte
	switch i := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = i.Stdin
	case *process.ProcessInput_Pty:
		data = i.Pty
	default:
		return invalid("input is required")
	}
	if len(data) == 0 {
		return nil
	}
	if err := c.sb.Agent.WriteStdin(ctx, pid, bytes.NewReader(data)); err != nil {
		return c.exitedError(ctx, pid, err)
	}
	return nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	c := callFrom(ctx)
	pid := 0
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			proc, err := c.pid(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			pid = proc.PID
		case *process.StreamInputRequest_Data:
			if pid == 0 {
				return nil, invalid("the stream must start with a start event")
			}
			if err := c.write(ctx, pid, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	c := callFrom(ctx)
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, invalid("unsupported signal %v", req.Msg.GetSignal())
	}
	proc, err := c.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.sb.Agent.Signal(ctx, proc.PID, sig); err != nil {
		return nil, c.exitedError(ctx, proc.PID, err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	c := callFrom(ctx)
	proc, err := c.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.sb.Agent.CloseStdin(ctx, proc.PID); err != nil {
		return nil, c.exitedError(ctx, proc.PID, err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	c := callFrom(ctx)
	proc, err := c.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		size := req.Msg.GetPty().GetSize()
		if size.GetRows() == 0 || size.GetCols() == 0 || size.GetRows() > math.MaxUint16 || size.GetCols() > math.MaxUint16 {
			return nil, invalid("pty size must be 1 to 65535 rows and columns")
		}
		if err := c.sb.Agent.Resize(ctx, proc.PID, api.PTYSize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}); err != nil {
			return nil, c.exitedError(ctx, proc.PID, err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
