package server

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// wantListed GETs path, a list of L whose items are its field named
// field: it must answer 200 with want of them (count), as an array even
// when there are none.
func wantListed[L any](t *testing.T, f *fixture, path, field string, want int, count func(L) int) {
	t.Helper()
	resp, body := f.do("GET", path, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("list %s: %d %s", path, resp.StatusCode, body)
	}
	if got := count(decode[L](t, body)); got != want {
		t.Errorf("list %s: %d %s, want %d", path, got, field, want)
	}
	if !bytes.Contains(body, []byte(`"`+field+`":[`)) {
		t.Errorf("list %s: body %s: want an array, never null", path, body)
	}
}

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
		wantListed(t, f, "/v1/sandboxes/"+id+"/metrics"+tc.query, "metrics", tc.want, func(l api.MetricList) int { return len(l.Metrics) })
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
