package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/telemetry"
)

// TestRequestIDs: every answer names its request; a sane ID from the
// client is kept, anything else replaced; error bodies and the server's
// log lines carry the same ID.
func TestRequestIDs(t *testing.T) {
	var logs bytes.Buffer
	sbs := &memSandboxes{sbs: map[string]api.Sandbox{}}
	s, err := New(Config{Sandboxes: sbs, Auth: keyAuth(testKey),
		Logger: slog.New(httpkit.LogHandler(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))})
	if err != nil {
		t.Fatal(err)
	}
	// In front, as atoll serve puts it.
	ts := httptest.NewServer(httpkit.RequestID(s.Handler()))
	t.Cleanup(ts.Close)
	f := &fixture{t: t, s: s, url: ts.URL}

	resp, body := f.do("GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", nil, "X-Request-Id", "trace-4bf92f35.77")
	e := wantError(t, resp, body, 404, "not_found")
	if got := resp.Header.Get("X-Request-Id"); got != "trace-4bf92f35.77" {
		t.Errorf("X-Request-Id = %q, want the client's", got)
	}
	if e.RequestID != "trace-4bf92f35.77" {
		t.Errorf("error body's request_id = %q", e.RequestID)
	}
	if !strings.Contains(logs.String(), "request_id=trace-4bf92f35.77") {
		t.Errorf("the request's log line lacks its ID:\n%s", logs.String())
	}
	for _, bad := range []string{"", "a b", "x\ty", strings.Repeat("a", 129), "<script>"} {
		resp, body := f.do("GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", nil, "X-Request-Id", bad)
		e := wantError(t, resp, body, 404, "not_found")
		got := resp.Header.Get("X-Request-Id")
		if got == "" || got == bad || !httpkit.RequestIDOK(got) || e.RequestID != got {
			t.Errorf("sent %q: header %q, body %q", bad, got, e.RequestID)
		}
	}
	// Successes are named too, and two requests differently.
	r1, _ := f.do("GET", "/v1/sandboxes", nil)
	r2, _ := f.do("GET", "/v1/sandboxes", nil)
	if a, b := r1.Header.Get("X-Request-Id"), r2.Header.Get("X-Request-Id"); a == "" || a == b {
		t.Errorf("request IDs %q and %q", a, b)
	}
}

// TestMetricsRoute: GET /v1/metrics is for admin keys, in Prometheus's
// text format, and counts the requests before it by route pattern.
func TestMetricsRoute(t *testing.T) {
	keys, admin := adminKeys(t)
	ctx := context.Background()
	other, err := keys.Create(ctx, api.CreateKeyRequest{Name: "team", Tenant: "team"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keys, Keys: keys,
		Metrics: telemetry.Handler(func(context.Context) (telemetry.Levels, error) {
			return telemetry.Levels{Sandboxes: []telemetry.SandboxCount{{State: "running", Runtime: "ns", N: 7}}}, nil
		}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	f := &fixture{t: t, s: s, url: ts.URL}

	resp, body := f.do("GET", "/v1/metrics", nil, "X-API-Key", other.Key)
	wantError(t, resp, body, 403, "forbidden")
	resp, body = f.do("GET", "/v1/metrics", nil, "X-API-Key", "")
	wantError(t, resp, body, 401, "unauthorized")
	f.do("GET", "/v1/sandboxes/bbbbbbbbbbbbbbbbbbbb", nil, "X-API-Key", admin)
	resp, body = f.do("GET", "/v1/metrics", nil, "X-API-Key", admin)
	if resp.StatusCode != 200 {
		t.Fatalf("metrics: %d %s", resp.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing: %v\n%s", err, body)
	}
	if g := mfs["atoll_sandboxes"]; g == nil || g.Metric[0].GetGauge().GetValue() != 7 {
		t.Errorf("atoll_sandboxes = %v", g)
	}
	found := false
	for _, m := range mfs["atoll_http_requests_total"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.Label {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["route"] == "GET /v1/sandboxes/{id}" && l["status"] == "404" && l["api"] == "atoll" {
			found = true
		}
		if strings.Contains(l["route"], "bbbbbbbbbbbbbbbbbbbb") {
			t.Errorf("a route label names a sandbox: %v", l)
		}
	}
	if !found {
		t.Error("the 404 of GET /v1/sandboxes/{id} is not counted")
	}

	// Without a handler the route is unavailable, not missing.
	s2, _ := New(Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ts2 := httptest.NewServer(s2.Handler())
	t.Cleanup(ts2.Close)
	f2 := &fixture{t: t, s: s2, url: ts2.URL}
	resp, body = f2.do("GET", "/v1/metrics", nil, "X-API-Key", admin)
	wantError(t, resp, body, 503, "unavailable")
}
