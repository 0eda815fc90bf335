package e2b

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// maxMetricsIDs is how many sandboxes GET /sandboxes/metrics asks about.
const maxMetricsIDs = 100

// metrics answers GET /sandboxes/{id}/metrics: the sandbox's samples from
// start to end, unix seconds, both optional (E2B's default range is the
// sandbox's life, which is all atoll keeps).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	var bounds [2]time.Time
	for i, name := range []string{"start", "end"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		// E2B's API takes them as int64 of at least 0; years past 9999
		// have no timestamp to answer with.
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 253402300799 {
			s.writeErr(w, r, bad("%s %q: want unix seconds", name, truncate(v)))
			return
		}
		bounds[i] = time.Unix(n, 0)
	}
	start, end := bounds[0], bounds[1]
	if !start.IsZero() && !end.IsZero() && start.After(end) {
		s.writeErr(w, r, bad("invalid time range for metrics: start is after end"))
		return
	}
	// Not through Get, which counts as use (auto-stop): watching a
	// sandbox's metrics does not keep it from stopping.
	ms, err := s.cfg.Sandboxes.Metrics(r.Context(), id, start, end)
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	out := make([]sandboxMetric, len(ms))
	for i, m := range ms {
		out[i] = wireMetric(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// latestMetrics answers GET /sandboxes/metrics?sandbox_ids=a,b: the newest
// sample of each of the caller's sandboxes among them that has one.
func (s *Server) latestMetrics(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query().Get("sandbox_ids")
	if v == "" {
		s.writeErr(w, r, bad("sandbox_ids is required: a comma-separated list of sandbox IDs"))
		return
	}
	parts := strings.Split(v, ",")
	if len(parts) > maxMetricsIDs {
		s.writeErr(w, r, bad("too many sandboxes requested, maximum is %d", maxMetricsIDs))
		return
	}
	ids := make([]string, 0, len(parts))
	for _, p := range parts {
		// E2B's IDs may carry the client ID after a dash.
		id, _, _ := strings.Cut(strings.TrimSpace(p), "-")
		if !api.ValidSandboxID(id) {
			s.writeErr(w, r, bad("invalid sandbox ID %q", truncate(p)))
			return
		}
		ids = append(ids, id)
	}
	ms, err := s.cfg.Sandboxes.LatestMetrics(r.Context(), ids)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := sandboxesWithMetrics{Sandboxes: make(map[string]sandboxMetric, len(ms))}
	for id, m := range ms {
		out.Sandboxes[id] = wireMetric(m)
	}
	writeJSON(w, http.StatusOK, out)
}

func wireMetric(m api.Metric) sandboxMetric {
	return sandboxMetric{
		Timestamp: m.Time, TimestampUnix: m.Time.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemoryUsedBytes, MemTotal: m.MemoryTotalBytes, MemCache: m.MemoryCacheBytes,
		DiskUsed: m.DiskUsedBytes, DiskTotal: m.DiskTotalBytes,
	}
}
