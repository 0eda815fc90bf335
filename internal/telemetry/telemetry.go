// Package telemetry is atoll's Prometheus metrics: what a server exposes at
// --metrics-listen and at GET /v1/metrics for a monitoring system to
// scrape. Two kinds of figure live here:
//
//   - events, counted or timed where they happen (an API request, a
//     create, a blob store call), in package-level collectors that any
//     package records into with one call (Op, Request, BlobOp);
//   - levels, read when scraped (sandboxes by state, the warm pools, the
//     node's capacity and what its sandboxes are given), from a Source the
//     server hands to Handler.
//
// Per-sandbox figures (CPU %, memory) are not here: one series per sandbox
// is the sampler's (package metrics) and the API's to serve, not a
// monitoring system's to store.
package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// namespace prefixes every series of atoll's own.
const namespace = "atoll"

// Operations timed by Op: the label values of atoll_operation_seconds.
const (
	OpCreate   = "create"
	OpStart    = "start"
	OpExec     = "exec"
	OpFork     = "fork"
	OpSnapshot = "snapshot"
	OpRestore  = "restore"
	OpPause    = "pause"
	OpResume   = "resume"
)

// Buckets of the latency histograms, in seconds: from a prestarted
// create's few milliseconds to a vm's cold start or a big snapshot.
var buckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

var (
	opSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "operation_seconds",
		Help:    "How long sandbox operations take (exec: until its process has started), by operation and result (ok or an error code).",
		Buckets: buckets,
	}, []string{"op", "result"})
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "http_requests_total",
		Help: "API requests answered, by API (atoll, e2b), route pattern, method and status.",
	}, []string{"api", "route", "method", "status"})
	requestSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "http_request_seconds",
		Help:    "Time to the first byte of an API answer (streams go on after it), by API and route pattern.",
		Buckets: buckets,
	}, []string{"api", "route"})
	errorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "errors_total",
		Help: "Error answers of the APIs, by error code (api.ErrorCodes).",
	}, []string{"code"})
	blobOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "blob_operations_total",
		Help: "Calls to the object store (archives, vaults), by operation and result (ok, not_found, error).",
	}, []string{"op", "result"})
	blobSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "blob_operation_seconds",
		Help:    "How long calls to the object store take, by operation.",
		Buckets: buckets,
	}, []string{"op"})
	blobBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "blob_bytes_total",
		Help: "Bytes written to (put) and read from (get) the object store.",
	}, []string{"direction"})

	// events holds the event collectors and the Go runtime's and the
	// process's own, shared by every Handler of the process.
	events = prometheus.NewRegistry()
)

func init() {
	events.MustRegister(opSeconds, requests, requestSeconds, errorsTotal, blobOps, blobSeconds, blobBytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// Op records that operation op took since start, ending with err (its
// code is the result; nil is "ok"). Call it deferred:
//
//	defer func(t time.Time) { telemetry.Op(telemetry.OpCreate, t, err) }(time.Now())
func Op(op string, start time.Time, err error) {
	opSeconds.WithLabelValues(op, Result(err)).Observe(time.Since(start).Seconds())
}

// Result is the result label of err: "ok", or its error code
// (api.ErrorCodes; "internal" for an error of no kind).
func Result(err error) string {
	if err == nil {
		return "ok"
	}
	return errdefs.Code(err)
}

// Request records an API answer: api names the API (atoll, e2b), route
// its route pattern (never the raw path, whose IDs would make a series
// per sandbox), status what was answered, ttfb the time to its first byte,
// and code the error code of an error answer ("" for none).
func Request(api, route, method string, status int, ttfb time.Duration, code string) {
	requests.WithLabelValues(api, route, method, strconv.Itoa(status)).Inc()
	requestSeconds.WithLabelValues(api, route).Observe(ttfb.Seconds())
	if code != "" {
		errorsTotal.WithLabelValues(code).Inc()
	}
}

// BlobOp records a call to the object store: op (put, get, stat, delete,
// list), how long since start, its result, and the bytes it moved.
func BlobOp(op string, start time.Time, result string) {
	blobOps.WithLabelValues(op, result).Inc()
	blobSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// BlobBytes counts n bytes put into (direction "put") or read from ("get")
// the object store.
func BlobBytes(direction string, n int64) {
	if n > 0 {
		blobBytes.WithLabelValues(direction).Add(float64(n))
	}
}

// Levels are the figures read at scrape time.
type Levels struct {
	// Sandboxes counts this node's sandboxes by state (pooled and
	// prestarted among them) and runtime.
	Sandboxes []SandboxCount
	// Pooled is the warm pools' ready sandboxes by template version ("":
	// the built-in template); PoolTarget each pool's size.
	Pooled     map[string]int
	PoolTarget int
	// Prestarted is how many sandbox processes are prestarted,
	// PrestartTarget how many the node aims to keep.
	Prestarted, PrestartTarget int
	// Capacity is what the node offers; Allocated what its sandboxes
	// that hold resources (those running, paused or starting) are given.
	Capacity, Allocated Resources
}

// SandboxCount is how many sandboxes are in State on Runtime.
type SandboxCount struct {
	State, Runtime string
	N              int
}

// Resources are amounts of what a node offers.
type Resources struct {
	CPU                    float64
	MemoryBytes, DiskBytes int64
	Sandboxes              int
}

// Source reads the levels; an error leaves them out of that scrape.
type Source func(ctx context.Context) (Levels, error)

// Handler serves the metrics in Prometheus's text format (or its protobuf,
// as the scraper asks): the process's events and src's levels.
func Handler(src Source) http.Handler {
	reg := prometheus.NewRegistry()
	if src != nil {
		reg.MustRegister(levelsCollector{src})
	}
	// A failing Source leaves its levels out, not the whole scrape: the
	// monitoring system still sees the process, and the missing series.
	return promhttp.HandlerFor(prometheus.Gatherers{events, reg}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

var (
	sandboxesDesc = prometheus.NewDesc(namespace+"_sandboxes", "This node's sandboxes by state and runtime.", []string{"state", "runtime"}, nil)
	pooledDesc    = prometheus.NewDesc(namespace+"_warm_pool_sandboxes", "Sandboxes ready in the warm pools, by template version (\"\": the built-in template).", []string{"template"}, nil)
	poolTarget    = prometheus.NewDesc(namespace+"_warm_pool_target", "How many sandboxes each warm pool is kept at (--warm-pool).", nil, nil)
	prestarted    = prometheus.NewDesc(namespace+"_prestarted_sandboxes", "Sandbox processes started ahead of demand.", nil, nil)
	prestartGoal  = prometheus.NewDesc(namespace+"_prestart_target", "How many prestarted processes the node aims to keep.", nil, nil)
	capacityDesc  = prometheus.NewDesc(namespace+"_node_capacity", "What this node offers sandboxes, by resource (cpu in cores, memory and disk in bytes, sandboxes).", []string{"resource"}, nil)
	allocatedDesc = prometheus.NewDesc(namespace+"_node_allocated", "What this node's sandboxes that hold resources are given, by resource.", []string{"resource"}, nil)
)

// levelsCollector reads a Source at each scrape.
type levelsCollector struct{ src Source }

func (c levelsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, pooledDesc, poolTarget, prestarted, prestartGoal, capacityDesc, allocatedDesc} {
		ch <- d
	}
}

func (c levelsCollector) Collect(ch chan<- prometheus.Metric) {
	// A scrape must not hang on a stuck store: its figures are left out.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.src(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	for _, n := range l.Sandboxes {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n.N), n.State, n.Runtime)
	}
	for tmpl, n := range l.Pooled {
		ch <- prometheus.MustNewConstMetric(pooledDesc, prometheus.GaugeValue, float64(n), tmpl)
	}
	ch <- prometheus.MustNewConstMetric(poolTarget, prometheus.GaugeValue, float64(l.PoolTarget))
	ch <- prometheus.MustNewConstMetric(prestarted, prometheus.GaugeValue, float64(l.Prestarted))
	ch <- prometheus.MustNewConstMetric(prestartGoal, prometheus.GaugeValue, float64(l.PrestartTarget))
	for _, r := range []struct {
		d   *prometheus.Desc
		res Resources
	}{{capacityDesc, l.Capacity}, {allocatedDesc, l.Allocated}} {
		ch <- prometheus.MustNewConstMetric(r.d, prometheus.GaugeValue, r.res.CPU, "cpu")
		ch <- prometheus.MustNewConstMetric(r.d, prometheus.GaugeValue, float64(r.res.MemoryBytes), "memory")
		ch <- prometheus.MustNewConstMetric(r.d, prometheus.GaugeValue, float64(r.res.DiskBytes), "disk")
		ch <- prometheus.MustNewConstMetric(r.d, prometheus.GaugeValue, float64(r.res.Sandboxes), "sandboxes")
	}
}

// Instrument records each request of next (Request) under api: its route
// is what next named with SetRoute, else the pattern its ServeMux matched
// (r.Pattern), else "unmatched"; an error answer's code is read from the
// X-Error-Code header the APIs' error writers set (httpkit.Surface.JSON).
func Instrument(api string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		tw := &timingWriter{ResponseWriter: w, start: start}
		// r itself, not a copy: the ServeMux writes the route it
		// matched into the request it is given (r.Pattern), which
		// Instrument and the middleware around it (the audit log) read.
		next.ServeHTTP(tw, r)
		status := tw.status
		if status == 0 {
			status = http.StatusOK
			tw.first = time.Since(start)
		}
		route := tw.route
		if route == "" {
			route = r.Pattern
		}
		if route == "" {
			route = "unmatched"
		}
		code := ""
		if status >= 400 {
			code = tw.Header().Get(ErrorCodeHeader)
			if code == "" {
				code = "http_" + strconv.Itoa(status)
			}
		}
		Request(api, route, r.Method, status, tw.first, code)
	})
}

// SetRoute names the route of the request w answers, for Instrument, when
// no ServeMux pattern does (an API's traffic to sandboxes). It finds
// Instrument's writer through the writers wrapping it (Unwrap).
func SetRoute(w http.ResponseWriter, route string) {
	for {
		if tw, ok := w.(*timingWriter); ok {
			tw.route = route
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// ErrorCodeHeader is set by the APIs' error writers to the error's code,
// for Instrument; clients may read it too.
const ErrorCodeHeader = httpkit.ErrorCodeHeader

// timingWriter notes the status and when the answer began.
type timingWriter struct {
	http.ResponseWriter
	start  time.Time
	status int
	first  time.Duration
	route  string // SetRoute's
}

func (w *timingWriter) WriteHeader(code int) {
	// 1xx answers (100 Continue, 101 Switching Protocols) are not the
	// answer's status, except 101, which is all a websocket gets.
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status, w.first = code, time.Since(w.start)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *timingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status, w.first = http.StatusOK, time.Since(w.start)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach Flush and Hijack.
func (w *timingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes flushes of streams on.
func (w *timingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
