package agent

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Limits of a sandbox's log: what its start command and background
// processes print, kept for GET /logs. Foreground execs are not kept:
// their client has their output.
const (
	// logBytes bounds the lines kept; the oldest go first.
	logBytes = 1 << 20
	// maxLogLine splits longer lines (a program printing without
	// newlines must not hold a line open forever).
	maxLogLine = 16 << 10
)

// logRing keeps the newest lines, up to max bytes of them.
type logRing struct {
	mu      sync.Mutex
	entries []api.LogEntry // oldest first
	bytes   int
	max     int
	seq     int64
	// wake is closed and replaced at each line, waking followers.
	wake chan struct{}
}

func newLogRing(max int) *logRing { return &logRing{max: max, wake: make(chan struct{})} }

func (r *logRing) add(pid int, tag, stream, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.entries = append(r.entries, api.LogEntry{Seq: r.seq, Time: time.Now().UTC(), PID: pid, Tag: tag, Stream: stream, Line: line})
	r.bytes += len(line)
	drop := 0
	for r.bytes > r.max && drop < len(r.entries)-1 {
		r.bytes -= len(r.entries[drop].Line)
		drop++
	}
	if drop > 0 {
		// Copied down rather than resliced, so the dropped lines'
		// memory is not kept.
		r.entries = append(r.entries[:0], r.entries[drop:]...)
	}
	close(r.wake)
	r.wake = make(chan struct{})
}

// since returns the lines after seq and a channel closed at the next line.
func (r *logRing) since(seq int64) ([]api.LogEntry, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := len(r.entries)
	for i > 0 && r.entries[i-1].Seq > seq {
		i--
	}
	return append([]api.LogEntry(nil), r.entries[i:]...), r.wake
}

// lineSplitter cuts one output stream of a process into lines for the log.
type lineSplitter struct {
	pending []byte
	emit    func(string)
}

func (s *lineSplitter) write(p []byte) {
	s.pending = append(s.pending, p...)
	for {
		i := bytes.IndexByte(s.pending, '\n')
		if i < 0 {
			break
		}
		s.emit(strings.TrimSuffix(string(s.pending[:i]), "\r"))
		s.pending = s.pending[i+1:]
	}
	for len(s.pending) >= maxLogLine {
		s.emit(string(s.pending[:maxLogLine]))
		s.pending = s.pending[maxLogLine:]
	}
	if len(s.pending) == 0 {
		s.pending = nil
	}
}

// flush emits an unfinished last line.
func (s *lineSplitter) flush() {
	if len(s.pending) > 0 {
		s.emit(strings.TrimSuffix(string(s.pending), "\r"))
		s.pending = nil
	}
}

// handleLogs answers GET /logs: the kept lines after ?since=SEQ as NDJSON
// LogEntries, and with ?follow=true the lines to come, until the client
// goes away.
func (a *Agent) handleLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since int64
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, errorf(errdefs.ErrInvalid, "since %.40q: want a line's seq, 0 or more", v))
			return
		}
		since = n
	}
	follow, err := boolParam(q.Get("follow"))
	if err != nil {
		writeError(w, errorf(errdefs.ErrInvalid, "follow: %v", err))
		return
	}
	stream, err := startNDJSON(w)
	if err != nil {
		return
	}
	for {
		lines, wake := a.logs.since(since)
		for _, l := range lines {
			if err := stream.send(l); err != nil {
				return
			}
			since = l.Seq
		}
		if !follow {
			return
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		case <-a.closing:
			return
		}
	}
}

// boolParam reads a boolean query parameter: "" is false.
func boolParam(v string) (bool, error) {
	if v == "" {
		return false, nil
	}
	return strconv.ParseBool(v)
}
