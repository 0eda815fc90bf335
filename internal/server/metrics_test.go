package server

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// TestSandboxMetrics checks GET /v1/sandboxes/{id}/metrics's parameters and
// errors; the figures themselves come from the service (see
// cmd/atoll's TestMetricsEndToEnd).
func TestSandboxMetrics(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("POST", "/v1/sandboxes", nil)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	id := decode[api.Sandbox](t, body).ID
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"", 3},
		{"?start=1005", 2},
		{"?end=1005", 2},
		{"?start=1001&end=1009", 1},
		{"?start=1970-01-01T00:16:45Z&end=1970-01-01T00:16:45Z", 1}, // 1005
		{"?start=2000&end=3000", 0},
	} {
		resp, body := f.do("GET", "/v1/sandboxes/"+id+"/metrics"+tc.query, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("metrics%s: %d %s", tc.query, resp.StatusCode, body)
		}
		if got := decode[api.MetricList](t, body); len(got.Metrics) != tc.want {
			t.Errorf("metrics%s: %d samples, want %d", tc.query, len(got.Metrics), tc.want)
		}
		if !bytes.Contains(body, []byte(`"metrics":[`)) {
			t.Errorf("metrics%s: body %s: want an array, never null", tc.query, body)
		}
	}
	for _, tc := range []struct {
		path   string
		status int
		code   string
	}{
		{"/v1/sandboxes/" + id + "/metrics?start=yesterday", 400, "invalid"},
		{"/v1/sandboxes/" + id + "/metrics?end=1.5", 400, "invalid"},
		{"/v1/sandboxes/" + id + "/metrics?start=-1", 400, "invalid"},
		{"/v1/sandboxes/" + id + "/metrics?end=99999999999999999999", 400, "invalid"},
		{"/v1/sandboxes/" + id + "/metrics?start=1010&end=1000", 400, "invalid"},
		{"/v1/sandboxes/nosuchsandbox0000000/metrics", 404, "not_found"},
		{"/v1/sandboxes/NOT-AN-ID/metrics", 400, "invalid"},
	} {
		resp, body := f.do("GET", tc.path, nil)
		wantError(t, resp, body, tc.status, tc.code)
	}
	resp, body = f.do("GET", "/v1/sandboxes/"+id+"/metrics", nil, "X-API-Key", "wrong")
	wantError(t, resp, body, 401, "unauthorized")
}
