package httpkit

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// StatusWriter remembers the status a handler wrote, for logs and for the
// panic handler, which must not start a second answer.
type StatusWriter struct {
	http.ResponseWriter
	status int
}

// Record returns w as a StatusWriter: w itself if it is one already, so
// that stacked middleware share one.
func Record(w http.ResponseWriter) *StatusWriter {
	if sw, ok := w.(*StatusWriter); ok {
		return sw
	}
	return &StatusWriter{ResponseWriter: w}
}

// Status is the status written so far; 0 before the handler wrote anything.
func (w *StatusWriter) Status() int { return w.status }

func (w *StatusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach Flush and Hijack, which streaming
// and websocket forwarding need.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush lets streams (NDJSON, Connect) flush event by event through code that
// asks for an http.Flusher.
func (w *StatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// LogRequests logs each request at debug level as msg, with its status and
// how long it took.
func LogRequests(log *slog.Logger, msg string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := Record(w)
		next.ServeHTTP(sw, r)
		status := sw.Status()
		if status == 0 {
			status = http.StatusOK
		}
		log.LogAttrs(r.Context(), slog.LevelDebug, msg,
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", status), slog.Int64("ms", time.Since(start).Milliseconds()))
	})
}

// Recover turns a panic in next into a logged 500 in the surface's shape, or
// only the log if next had begun its answer. http.ErrAbortHandler, the
// standard way to abort an answer, goes on to net/http, which handles it
// quietly.
func (s Surface) Recover(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := Record(w)
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			log.ErrorContext(r.Context(), "panic in handler", "method", r.Method, "path", r.URL.Path,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if sw.Status() == 0 {
				s.Error(sw, http.StatusInternalServerError, api.CodeInternal, "internal error")
			}
		}()
		next.ServeHTTP(sw, r)
	})
}
