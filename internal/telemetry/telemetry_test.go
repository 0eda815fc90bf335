package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/telemetry"
)

// scrape GETs h's metrics in the text format and parses them with
// Prometheus's own parser.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	return mfs
}

// find returns the metric of family name whose labels include want.
func find(mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func TestScrapeParses(t *testing.T) {
	levels := telemetry.Levels{
		Sandboxes:  []telemetry.SandboxCount{{State: "running", Runtime: "ns", N: 3}, {State: "stopped", Runtime: "gvisor", N: 1}},
		Pooled:     map[string]int{"": 2},
		PoolTarget: 2, Prestarted: 1, PrestartTarget: 4,
		Capacity:  telemetry.Resources{CPU: 8, MemoryBytes: 16 << 30, DiskBytes: 100 << 30, Sandboxes: 500},
		Allocated: telemetry.Resources{CPU: 1.5, MemoryBytes: 3 << 30, Sandboxes: 3},
	}
	h := telemetry.Handler(func(context.Context) (telemetry.Levels, error) { return levels, nil })

	telemetry.Op(telemetry.OpCreate, time.Now().Add(-30*time.Millisecond), nil)
	telemetry.Op(telemetry.OpCreate, time.Now(), fmt.Errorf("%w: no such template", errdefs.ErrNotFound))
	telemetry.BlobOp("put", time.Now(), "ok")
	telemetry.BlobBytes("put", 1000)

	// Requests through Instrument, named by SetRoute as the server's
	// router does; the error's code comes from the error writer's header.
	inst := telemetry.Instrument("atoll", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		telemetry.SetRoute(w, "GET /v1/sandboxes/{id}")
		if r.URL.Path == "/v1/sandboxes/missing" {
			httpkit.Atoll.Error(w, 404, "not_found", "no sandbox")
			return
		}
		w.Write([]byte("{}"))
	}))
	for _, p := range []string{"/v1/sandboxes/a", "/v1/sandboxes/b", "/v1/sandboxes/missing"} {
		inst.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", p, nil))
	}

	mfs := scrape(t, h)
	gauge := func(name string, labels map[string]string) float64 {
		t.Helper()
		m := find(mfs, name, labels)
		if m == nil {
			t.Fatalf("no %s%v in the scrape", name, labels)
		}
		return m.GetGauge().GetValue()
	}
	if v := gauge("atoll_sandboxes", map[string]string{"state": "running", "runtime": "ns"}); v != 3 {
		t.Errorf("running ns sandboxes = %v, want 3", v)
	}
	if v := gauge("atoll_warm_pool_sandboxes", map[string]string{"template": ""}); v != 2 {
		t.Errorf("warm pool = %v, want 2", v)
	}
	if v := gauge("atoll_prestart_target", nil); v != 4 {
		t.Errorf("prestart target = %v", v)
	}
	if v := gauge("atoll_node_capacity", map[string]string{"resource": "memory"}); v != 16<<30 {
		t.Errorf("capacity memory = %v", v)
	}
	if v := gauge("atoll_node_allocated", map[string]string{"resource": "cpu"}); v != 1.5 {
		t.Errorf("allocated cpu = %v", v)
	}
	h1 := find(mfs, "atoll_operation_seconds", map[string]string{"op": "create", "result": "ok"})
	if h1 == nil || h1.GetHistogram().GetSampleCount() < 1 || h1.GetHistogram().GetSampleSum() < 0.03 {
		t.Errorf("create ok histogram = %v", h1)
	}
	if find(mfs, "atoll_operation_seconds", map[string]string{"op": "create", "result": "not_found"}) == nil {
		t.Error("no create not_found series")
	}
	if m := find(mfs, "atoll_http_requests_total", map[string]string{"api": "atoll", "route": "GET /v1/sandboxes/{id}", "status": "200"}); m == nil || m.GetCounter().GetValue() < 2 {
		t.Errorf("200s of the route = %v, want 2 (the path's IDs folded into the pattern)", m)
	}
	if m := find(mfs, "atoll_errors_total", map[string]string{"code": "not_found"}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("not_found errors = %v", m)
	}
	if m := find(mfs, "atoll_blob_bytes_total", map[string]string{"direction": "put"}); m == nil || m.GetCounter().GetValue() < 1000 {
		t.Errorf("blob bytes = %v", m)
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "atoll_blob_operation_seconds", "atoll_http_request_seconds"} {
		if mfs[name] == nil {
			t.Errorf("no %s in the scrape", name)
		}
	}
}

// A Source that fails leaves its levels out of the scrape, rather than
// showing zeros that look like an empty node; the rest is served.
func TestScrapeSourceFails(t *testing.T) {
	h := telemetry.Handler(func(context.Context) (telemetry.Levels, error) { return telemetry.Levels{}, errors.New("store down") })
	mfs := scrape(t, h)
	if mfs["atoll_sandboxes"] != nil || mfs["atoll_node_capacity"] != nil {
		t.Error("levels shown although their source failed")
	}
	if mfs["go_goroutines"] == nil {
		t.Error("the Go runtime's metrics are missing too")
	}
}

// BenchmarkInstrument is what Instrument adds to a request: a writer, a
// counter, a histogram.
func BenchmarkInstrument(b *testing.B) {
	h := telemetry.Instrument("atoll", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		telemetry.SetRoute(w, "GET /v1/sandboxes/{id}")
		w.WriteHeader(200)
	}))
	req := httptest.NewRequest("GET", "/v1/sandboxes/a", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, req)
	}
}
