package e2b

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// E2B's sandbox logs: v1's lines and entries, v2's entries.
type (
	sandboxLog struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	sandboxLogEntry struct {
		Timestamp time.Time         `json:"timestamp"`
		Message   string            `json:"message"`
		Level     string            `json:"level"` // debug, info, warn, error
		Fields    map[string]string `json:"fields"`
	}
	sandboxLogsV1 struct {
		Logs       []sandboxLog      `json:"logs"`
		LogEntries []sandboxLogEntry `json:"logEntries"`
	}
	sandboxLogsV2 struct {
		Logs []sandboxLogEntry `json:"logs"`
	}
)

// Limits of a logs request: E2B's default and a bound of atoll's (the
// agent keeps a MiB of lines).
const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
)

// logs answers GET /sandboxes/{id}/logs?start=MS&limit=N: the lines of the
// sandbox's start command and background processes from start (unix
// milliseconds) on, oldest first. A sandbox that is not running has no
// agent to ask: its logs are empty.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	q, ok := s.logsQuery(w, r, "start")
	if !ok {
		return
	}
	start, limit, lines := q.from, q.limit, q.lines
	out := sandboxLogsV1{Logs: []sandboxLog{}, LogEntries: []sandboxLogEntry{}}
	for _, l := range lines {
		if len(out.Logs) == limit {
			break
		}
		if !start.IsZero() && l.Time.Before(start) {
			continue
		}
		out.Logs = append(out.Logs, sandboxLog{Timestamp: l.Time, Line: l.Line})
		out.LogEntries = append(out.LogEntries, sandboxEntry(l))
	}
	writeJSON(w, http.StatusOK, out)
}

// logsV2 answers GET /v2/sandboxes/{id}/logs?cursor=MS&limit=N&direction=
// forward|backward: from cursor (unix milliseconds) on, oldest first, or
// back from it (default now), newest first.
func (s *Server) logsV2(w http.ResponseWriter, r *http.Request) {
	dir := r.URL.Query().Get("direction")
	if dir != "" && dir != "forward" && dir != "backward" {
		s.writeErr(w, r, bad("direction %q: want forward or backward", truncate(dir)))
		return
	}
	q, ok := s.logsQuery(w, r, "cursor")
	if !ok {
		return
	}
	cursor, limit, lines := q.from, q.limit, q.lines
	keep := func(l api.LogEntry) bool { return cursor.IsZero() || !l.Time.Before(cursor) }
	if dir == "backward" {
		slices.Reverse(lines)
		keep = func(l api.LogEntry) bool { return cursor.IsZero() || !l.Time.After(cursor) }
	}
	out := sandboxLogsV2{Logs: []sandboxLogEntry{}}
	for _, l := range lines {
		if len(out.Logs) == limit {
			break
		}
		if keep(l) {
			out.Logs = append(out.Logs, sandboxEntry(l))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// logsQuery is what both logs routes read: the sandbox's lines, the time
// in query parameter param and the limit.
type logsQuery struct {
	from  time.Time
	limit int
	lines []api.LogEntry
}

// logsQuery reads a logs request, or answers its error and returns false.
func (s *Server) logsQuery(w http.ResponseWriter, r *http.Request, param string) (logsQuery, bool) {
	id, ok := sandboxID(w, r)
	if !ok {
		return logsQuery{}, false
	}
	var q logsQuery
	var err error
	if q.from, err = msParam(r, param); err == nil {
		q.limit, err = limitParam(r)
	}
	if err != nil {
		s.writeErr(w, r, err)
		return logsQuery{}, false
	}
	if q.lines, err = s.sandboxLogs(r, id); err != nil {
		s.sandboxErr(w, r, id, err)
		return logsQuery{}, false
	}
	return q, true
}

// sandboxLogs reads all the lines sandbox id's agent keeps; none if it is
// not running.
func (s *Server) sandboxLogs(r *http.Request, id string) ([]api.LogEntry, error) {
	dial, err := s.cfg.Sandboxes.AgentDialer(r.Context(), id)
	if errors.Is(err, errdefs.ErrConflict) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c := agent.NewClient(dial)
	defer c.HTTPClient().CloseIdleConnections()
	st, err := c.Logs(r.Context(), 0, false)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var lines []api.LogEntry
	for {
		l, err := st.Next()
		if err == io.EOF {
			return lines, nil
		}
		if err != nil {
			return nil, err
		}
		lines = append(lines, l)
	}
}

// sandboxEntry is line l as E2B's entry: stderr is an error's level.
func sandboxEntry(l api.LogEntry) sandboxLogEntry {
	level := "info"
	if l.Stream == api.EventStderr {
		level = "error"
	}
	f := map[string]string{"pid": strconv.Itoa(l.PID), "stream": l.Stream}
	if l.Tag != "" {
		f["tag"] = l.Tag
	}
	return sandboxLogEntry{Timestamp: l.Time, Message: l.Line, Level: level, Fields: f}
}

// msParam reads query parameter name in unix milliseconds, 0 or more; the
// zero time if absent.
func msParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 253402300799999 {
		return time.Time{}, bad("%s %q: want unix milliseconds", name, truncate(v))
	}
	return time.UnixMilli(n), nil
}

func limitParam(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return defaultLogLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxLogLimit {
		return 0, bad("limit %q: want 0 to %d", truncate(v), maxLogLimit)
	}
	return n, nil
}
