package server

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// getMetrics answers a sandbox's samples between the start and end query
// parameters, each optional, in unix seconds (as E2B's API has them) or
// RFC 3339.
func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	start, end, err := timeRange(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ms, err := s.cfg.Sandboxes.Metrics(r.Context(), id, start, end)
	if ms == nil {
		ms = []api.Metric{}
	}
	s.respond(w, r, http.StatusOK, api.MetricList{Metrics: ms}, err)
}

// serveMetrics serves the Prometheus metrics (Config.Metrics).
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Metrics == nil {
		s.writeError(w, r, fmt.Errorf("%w: this server keeps no Prometheus metrics", errdefs.ErrUnavailable))
		return
	}
	s.cfg.Metrics.ServeHTTP(w, r)
}

// timeRange reads the start and end query parameters of r (timeParam),
// either zero if absent; start must not be after end.
func timeRange(r *http.Request) (start, end time.Time, err error) {
	return timeRangeOf(r, "start", "end")
}

// timeRangeOf is timeRange of the parameters named first and last.
func timeRangeOf(r *http.Request, first, last string) (start, end time.Time, err error) {
	if start, err = timeParam(r, first); err != nil {
		return start, end, err
	}
	if end, err = timeParam(r, last); err != nil {
		return start, end, err
	}
	if !start.IsZero() && !end.IsZero() && start.After(end) {
		return start, end, fmt.Errorf("%w: %s is after %s", errdefs.ErrInvalid, first, last)
	}
	return start, end, nil
}

// timeParam parses query parameter name of r, unix seconds or RFC 3339;
// the zero time if it is absent.
func timeParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		// Past year 9999 a time has no RFC 3339 form to answer with.
		if n < 0 || n > 253402300799 {
			return time.Time{}, fmt.Errorf("%w: %s: unix seconds out of range", errdefs.ErrInvalid, name)
		}
		return time.Unix(n, 0), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s %q: want unix seconds or an RFC 3339 time", errdefs.ErrInvalid, name, truncate(v))
	}
	return t, nil
}
