package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/atoll-dev/atoll/api"
)

// freePort is a loopback address no one listens on, for a flag.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// scrapeMetrics GETs url with key (none: "") and parses the answer with
// Prometheus's text parser.
func scrapeMetrics(t *testing.T, url, key string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scraping %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the scrape of %s: %v", url, err)
	}
	return mfs
}

// metric returns family name's first series whose labels include want
// (name, value pairs); nil for none.
func metric(mfs map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
next:
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		return m
	}
	return nil
}

// series returns the value of family name's series whose labels include
// want (a counter's or gauge's value, a histogram's count); -1 for none.
func series(mfs map[string]*dto.MetricFamily, name string, want ...string) float64 {
	m := metric(mfs, name, want...)
	switch {
	case m == nil:
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// TestPrometheusEndToEnd runs a real server with --metrics-listen, drives
// a sandbox through create, exec, fork, snapshot and an archive to the
// object store, a stop and a start, and scrapes both the metrics listener
// and GET /v1/metrics: each is in Prometheus's text format, and the
// figures follow what was done; the prestarted processes (--prestart 2)
// reach their target. The request it sends with an X-Request-Id is found by that ID in
// the server's log.
func TestPrometheusEndToEnd(t *testing.T) {
	addr := freePort(t)
	d, _, c := startRooted(t, "--metrics-listen", addr, "--warm-pool", "1", "--prestart", "2", "--debug")
	ctx := context.Background()
	metricsURL := "http://" + addr + "/metrics"

	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: "ns"})
	if out, code := sh(t, c, sb.ID, "echo hi"); code != 0 || strings.TrimSpace(out) != "hi" {
		t.Fatalf("exec: %d %q", code, out)
	}
	kids, err := c.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ArchiveSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	// A start is timed as one, once; a create's own start is not.
	starts := max(series(scrapeMetrics(t, metricsURL, ""), "atoll_operation_seconds", "op", "start", "result", "ok"), 0)
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// A request a user might report, by its ID.
	req, _ := http.NewRequest("GET", d.url+"/v1/sandboxes/zzzzzzzzzzzzzzzzzzzz", nil)
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("X-Request-Id", "report-1234")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get("X-Request-Id") != "report-1234" || e.RequestID != "report-1234" {
		t.Errorf("404 with an ID: %s, header %q, body %+v", resp.Status, resp.Header.Get("X-Request-Id"), e)
	}

	mfs := scrapeMetrics(t, metricsURL, "")
	if n := series(mfs, "atoll_sandboxes", "state", "running", "runtime", "ns"); n < 2 {
		t.Errorf("running ns sandboxes = %v, want ≥ 2 (the sandbox and its fork)", n)
	}
	for _, op := range []string{"create", "exec", "fork", "snapshot"} {
		if n := series(mfs, "atoll_operation_seconds", "op", op, "result", "ok"); n < 1 {
			t.Errorf("atoll_operation_seconds{op=%q,result=ok} count = %v, want ≥ 1", op, n)
		}
	}
	if n := series(mfs, "atoll_operation_seconds", "op", "start", "result", "ok"); n != starts+1 {
		t.Errorf("atoll_operation_seconds{op=start,result=ok} count = %v, want %v (one more after a stop and start)", n, starts+1)
	}
	if h := metric(mfs, "atoll_operation_seconds", "op", "start", "result", "ok").GetHistogram(); h == nil || h.GetSampleSum() <= 0 || len(h.Bucket) == 0 ||
		h.Bucket[len(h.Bucket)-1].GetCumulativeCount() != h.GetSampleCount() {
		t.Errorf("start latency histogram: %v", h)
	}
	if n := series(mfs, "atoll_http_requests_total", "api", "atoll", "route", "POST /v1/sandboxes", "status", "201"); n < 1 {
		t.Errorf("creates counted = %v", n)
	}
	if n := series(mfs, "atoll_errors_total", "code", "not_found"); n < 1 {
		t.Errorf("not_found errors = %v", n)
	}
	if n := series(mfs, "atoll_blob_operations_total", "op", "put", "result", "ok"); n < 1 {
		t.Errorf("object store puts = %v, want ≥ 1 (the archived snapshot)", n)
	}
	if n := series(mfs, "atoll_warm_pool_target"); n != 1 {
		t.Errorf("warm pool target = %v, want 1", n)
	}
	if n := series(mfs, "atoll_node_capacity", "resource", "cpu"); n < 1 {
		t.Errorf("capacity cpu = %v", n)
	}
	if n := series(mfs, "atoll_node_allocated", "resource", "sandboxes"); n < 2 {
		t.Errorf("allocated sandboxes = %v, want ≥ 2", n)
	}
	if n := series(mfs, "go_goroutines"); n < 1 {
		t.Errorf("go_goroutines = %v", n)
	}
	// The warm pool fills in the background.
	deadline := time.Now().Add(60 * time.Second)
	for series(mfs, "atoll_warm_pool_sandboxes") < 1 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		mfs = scrapeMetrics(t, metricsURL, "")
	}
	if n := series(mfs, "atoll_warm_pool_sandboxes"); n < 1 {
		t.Errorf("warm pool sandboxes = %v, want 1", n)
	}
	// So do the prestarted processes, to --prestart.
	if n := series(mfs, "atoll_prestart_target"); n != 2 {
		t.Errorf("prestart target = %v, want 2", n)
	}
	for series(mfs, "atoll_prestarted_sandboxes") != 2 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		mfs = scrapeMetrics(t, metricsURL, "")
	}
	if n := series(mfs, "atoll_prestarted_sandboxes"); n != 2 {
		t.Errorf("prestarted sandboxes = %v, want 2", n)
	}

	// The same behind an admin key on the API's listener.
	v1 := scrapeMetrics(t, d.url+"/v1/metrics", d.key)
	if n := series(v1, "atoll_sandboxes", "state", "running", "runtime", "ns"); n < 2 {
		t.Errorf("/v1/metrics: running ns sandboxes = %v", n)
	}
	status, body := d.v1(t, "POST", "/v1/keys", d.key, `{"name":"team","tenant":"team"}`)
	wantV1(t, "create key", status, body, 201, "")
	var other api.APIKey
	json.Unmarshal(body, &other)
	status, body = d.v1(t, "GET", "/v1/metrics", other.Key, "")
	wantV1(t, "metrics with a tenant's key", status, body, 403, "forbidden")

	// Deleting shows in the next scrape.
	for _, k := range kids {
		c.DeleteSandbox(ctx, k.ID)
	}
	c.DeleteSandbox(ctx, sb.ID)
	mfs = scrapeMetrics(t, metricsURL, "")
	if n := series(mfs, "atoll_sandboxes", "state", "running", "runtime", "ns"); n > 0 {
		t.Errorf("running ns sandboxes after deleting them = %v", n)
	}

	if !strings.Contains(d.out.String(), "request_id=report-1234") {
		t.Errorf("the server's log has no line with request_id=report-1234")
	}
}
