package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// metricsLoad holds 128 MiB and spins on a core for 8 s, in the background.
const metricsLoad = `nohup python3 -c "import time; b = b'x' * (128 << 20); t = time.process_time(); exec('while time.process_time() - t < 8: pass'); time.sleep(600)" >/dev/null 2>&1 &`

// TestMetricsEndToEnd checks sandbox metrics through atoll's API and E2B's
// on a real server sampling every second, for a sandbox of each runtime
// that spins a core and takes memory: the samples show the CPU and the
// memory going up, within the sandbox's own limits; time ranges filter
// them; another tenant's sandbox is not found; bad ranges are 400s.
func TestMetricsEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	runtimes := []string{"ns", "gvisor", "vm"}
	linkVMCache(t, data)
	d := startDaemon(t, data, "--metrics-interval", "1s", "--warm-pool", "0")
	status, body := d.v1(t, "POST", "/v1/keys", d.key, `{"name":"other-team"}`)
	wantV1(t, "create key", status, body, 201, "")
	var other api.APIKey
	json.Unmarshal(body, &other)

	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			switch rt {
			case "gvisor":
				testenv.RequireCommand(t, "runsc")
			case "vm":
				requireVM(t)
			}
			testMetrics(t, d, other.Key, rt)
		})
	}
}

func testMetrics(t *testing.T, d *daemon, otherKey, rt string) {
	status, body := d.v1(t, "POST", "/v1/sandboxes", d.key, fmt.Sprintf(`{"runtime":%q,"cpu":1,"memory_mib":512,"disk_gib":2}`, rt))
	wantV1(t, "create", status, body, 201, "")
	var sb api.Sandbox
	json.Unmarshal(body, &sb)
	created := time.Now()
	path := "/v1/sandboxes/" + sb.ID + "/metrics"
	get := func(query string) []api.Metric {
		t.Helper()
		status, body := d.v1(t, "GET", path+query, d.key, "")
		wantV1(t, "metrics"+query, status, body, 200, "")
		var list api.MetricList
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("metrics%s: %s: %v", query, body, err)
		}
		return list.Metrics
	}
	// waitFor polls until a sample satisfies ok, and returns it.
	waitFor := func(what string, ok func(api.Metric) bool) api.Metric {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			ms := get("")
			for _, m := range ms {
				if ok(m) {
					return m
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no sample %s in 90 s: %+v", what, ms)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	idle := waitFor("at all", func(api.Metric) bool { return true })
	t.Logf("idle: %+v", idle)
	if idle.CPUCount != 1 || idle.MemoryTotalBytes != 512<<20 || idle.DiskTotalBytes <= 1<<30 || idle.DiskTotalBytes > 2<<30 {
		t.Errorf("limits in a sample: %+v, want 1 core, 512 MiB, a 2 GiB disk", idle)
	}
	if out, code := sh(t, d.client(), sb.ID, metricsLoad); code != 0 {
		t.Fatalf("starting the load: %s", out)
	}
	loaded := time.Now()
	busy := waitFor("with the load's CPU and memory", func(m api.Metric) bool {
		return !m.Time.Before(loaded.Truncate(time.Second)) && m.CPUUsedPct > 10 && m.MemoryUsedBytes >= idle.MemoryUsedBytes+100<<20
	})
	t.Logf("busy: %+v", busy)
	if busy.CPUUsedPct > 100 || busy.MemoryUsedBytes > busy.MemoryTotalBytes+64<<20 {
		t.Errorf("a sample beyond the sandbox's limits: %+v", busy)
	}

	// The disk: a file written and synced shows in a sample (btrfs counts
	// a quota group's use at its next commit, which the sync makes).
	if out, code := sh(t, d.client(), sb.ID, "head -c 16M /dev/urandom > /root/disk-use && sync"); code != 0 {
		t.Fatalf("writing a file: %s", out)
	}
	written := waitFor("with the file on the disk", func(m api.Metric) bool {
		return m.DiskUsedBytes >= idle.DiskUsedBytes+16<<20
	})
	if written.DiskUsedBytes > written.DiskTotalBytes {
		t.Errorf("disk used beyond its size: %+v", written)
	}

	// Time ranges, in unix seconds and RFC 3339, both inclusive.
	all := get("")
	for _, m := range all {
		if m.Time.Before(created.Truncate(time.Second)) || m.Time.After(time.Now()) {
			t.Errorf("sample at %s: the sandbox was created at %s", m.Time, created)
		}
	}
	sec := busy.Time.Unix()
	for _, q := range []string{
		fmt.Sprintf("?start=%d&end=%d", sec, sec),
		"?start=" + busy.Time.Truncate(time.Second).Format(time.RFC3339) + "&end=" + busy.Time.Truncate(time.Second).Format(time.RFC3339),
	} {
		got := get(q)
		if len(got) == 0 {
			t.Errorf("metrics%s: none, want the busy sample", q)
		}
		for _, m := range got {
			if m.Time.Unix() != sec {
				t.Errorf("metrics%s: a sample at %s", q, m.Time)
			}
		}
	}
	// The Go SDK's, the same.
	if got, err := d.client().Metrics(context.Background(), sb.ID, busy.Time, busy.Time); err != nil || len(got) == 0 || got[0].Time.Unix() != sec {
		t.Errorf("Client.Metrics of the busy sample's second: %+v, %v", got, err)
	}
	if got := get(fmt.Sprintf("?start=%d", sec+1)); len(got) >= len(all) {
		t.Errorf("start after the busy sample: %d samples of %d", len(got), len(all))
	}
	if got := get(fmt.Sprintf("?start=%d&end=%d", created.Add(-time.Hour).Unix(), created.Add(-30*time.Minute).Unix())); len(got) != 0 {
		t.Errorf("an hour before the sandbox: %+v", got)
	}

	// Bad ranges and other tenants, on atoll's API.
	for _, q := range []string{"?start=soon", "?end=-5", fmt.Sprintf("?start=%d&end=%d", sec, sec-1)} {
		status, body := d.v1(t, "GET", path+q, d.key, "")
		wantV1(t, "metrics"+q, status, body, 400, "invalid")
	}
	status, body = d.v1(t, "GET", path, otherKey, "")
	wantV1(t, "another tenant's metrics", status, body, 404, "not_found")

	// E2B's API: the same samples in its shapes.
	ans := d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + sb.ID + "/metrics", key: d.key})
	ans.want(t, "E2B metrics", 200)
	var e2bMs []map[string]any
	if err := json.Unmarshal(ans.body, &e2bMs); err != nil || len(e2bMs) == 0 {
		t.Fatalf("E2B metrics: %s", ans.body)
	}
	for _, f := range []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"} {
		if _, ok := e2bMs[0][f]; !ok {
			t.Errorf("E2B metric without %s: %v", f, e2bMs[0])
		}
	}
	ans = d.e2b(t, e2bReq{method: "GET", path: fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", sb.ID, sec, sec), key: d.key})
	ans.want(t, "E2B metrics in a range", 200)
	var ranged []struct {
		TimestampUnix int64   `json:"timestampUnix"`
		CPUUsedPct    float64 `json:"cpuUsedPct"`
	}
	json.Unmarshal(ans.body, &ranged)
	if len(ranged) == 0 || ranged[0].TimestampUnix != sec {
		t.Errorf("E2B metrics of second %d: %s", sec, ans.body)
	}
	for _, c := range []struct {
		path   string
		key    string
		status int
	}{
		{"/sandboxes/" + sb.ID + "/metrics?start=x", d.key, 400},
		{"/sandboxes/" + sb.ID + "/metrics?start=-1", d.key, 400},
		{fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", sb.ID, sec, sec-1), d.key, 400},
		{"/sandboxes/" + sb.ID + "/metrics", otherKey, 404},
		{"/sandboxes/metrics", d.key, 400},
		{"/sandboxes/metrics?sandbox_ids=" + strings.Repeat(sb.ID+",", 100) + sb.ID, d.key, 400},
		{"/sandboxes/metrics?sandbox_ids=../etc", d.key, 400},
	} {
		d.e2b(t, e2bReq{method: "GET", path: c.path, key: c.key}).want(t, "E2B "+c.path, c.status)
	}
	for _, c := range []struct {
		key  string
		want int
	}{{d.key, 1}, {otherKey, 0}} {
		ans := d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/metrics?sandbox_ids=" + sb.ID + ",aaaaaaaaaaaaaaaaaaaa", key: c.key})
		ans.want(t, "E2B latest metrics", 200)
		var latest struct {
			Sandboxes map[string]json.RawMessage `json:"sandboxes"`
		}
		if err := json.Unmarshal(ans.body, &latest); err != nil || len(latest.Sandboxes) != c.want || c.want == 1 && latest.Sandboxes[sb.ID] == nil {
			t.Errorf("E2B latest metrics: %s, want %d sandboxes", ans.body, c.want)
		}
	}

	// Deleted: its samples go with it.
	status, body = d.v1(t, "DELETE", "/v1/sandboxes/"+sb.ID, d.key, "")
	wantV1(t, "delete", status, body, 204, "")
	status, body = d.v1(t, "GET", path, d.key, "")
	wantV1(t, "a deleted sandbox's metrics", status, body, 404, "not_found")
}
