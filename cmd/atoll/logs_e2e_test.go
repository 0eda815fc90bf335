package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestLogsEndToEnd runs background commands in a real sandbox with
// `atoll exec -d` and reads what they print back: `atoll logs` (stdout
// and stderr to their own streams), a followed stream that sees a line
// printed after it opened, `--since`, E2B's v1 and v2 logs routes, and
// `atoll top`'s table. Foreground execs stay out of the log; bad
// parameters are 400s.
func TestLogsEndToEnd(t *testing.T) {
	d, _, c := startRooted(t, "--e2b", "--metrics-interval", "1s", "--warm-pool", "0")
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: "ns"})

	out, code := d.cli("exec", sb.ID, "-d", "--", "sh", "-c", "echo hello-out; echo hello-err >&2; printf 'no newline'")
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil || pid <= 0 {
		t.Fatalf("exec -d: %q (exit %d)", out, code)
	}
	if out, code := d.cli("exec", sb.ID, "-d", "-i", "--", "true"); code == 0 {
		t.Errorf("exec -d -i: exit 0, want a refusal: %q", out)
	}
	sh(t, c, sb.ID, "echo foreground-only")

	// The background process may take a moment to print.
	var lines []api.LogEntry
	deadline := time.Now().Add(20 * time.Second)
	for len(lines) < 3 && time.Now().Before(deadline) {
		lines = readLogs(t, c, sb.ID, atoll.LogOptions{})
		time.Sleep(100 * time.Millisecond)
	}
	got := map[string]api.LogEntry{}
	for _, l := range lines {
		got[l.Line] = l
	}
	if l, ok := got["hello-out"]; !ok || l.Stream != "stdout" || l.PID != pid || l.Seq < 1 {
		t.Errorf("hello-out: %+v in %+v", l, lines)
	}
	if l, ok := got["hello-err"]; !ok || l.Stream != "stderr" {
		t.Errorf("hello-err: %+v in %+v", l, lines)
	}
	if _, ok := got["no newline"]; !ok {
		t.Errorf("the unfinished last line is missing: %+v", lines)
	}
	if _, ok := got["foreground-only"]; ok {
		t.Errorf("a foreground exec's output is in the log: %+v", lines)
	}

	// The CLI: stdout's lines on stdout, stderr's on stderr (d.cli joins
	// them after each other).
	out, code = d.cli("logs", "--timestamps", sb.ID)
	if code != 0 || !strings.Contains(out, "hello-out") || !strings.Contains(out, "hello-err") || strings.Index(out, "hello-err") < strings.Index(out, "no newline") {
		t.Errorf("atoll logs: exit %d\n%s", code, out)
	}

	// Following: a line printed after the stream opened arrives on it.
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := lines[len(lines)-1].Seq
	s, err := c.Logs(fctx, sb.ID, atoll.LogOptions{Since: last, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "sleep 1; echo later", Tag: "job"}); err != nil {
		t.Fatal(err)
	}
	if !s.Next() {
		t.Fatalf("follow: no line: %v", s.Err())
	}
	if l := s.Event(); l.Line != "later" || l.Tag != "job" || l.Seq <= last {
		t.Errorf("followed line %+v", l)
	}
	s.Close()

	// E2B's routes: v1's lines and entries, v2's forward and backward.
	var v1 struct {
		Logs []struct {
			Timestamp time.Time `json:"timestamp"`
			Line      string    `json:"line"`
		} `json:"logs"`
		LogEntries []struct {
			Message string            `json:"message"`
			Level   string            `json:"level"`
			Fields  map[string]string `json:"fields"`
		} `json:"logEntries"`
	}
	e2bGet(t, d, "/sandboxes/"+sb.ID+"/logs?limit=100", 200, &v1)
	if len(v1.Logs) < 4 || len(v1.LogEntries) != len(v1.Logs) {
		t.Errorf("e2b v1 logs: %+v", v1)
	}
	levels := map[string]string{}
	for _, e := range v1.LogEntries {
		levels[e.Message] = e.Level
	}
	if levels["hello-out"] != "info" || levels["hello-err"] != "error" {
		t.Errorf("e2b levels: %v", levels)
	}
	var v2 struct {
		Logs []struct {
			Message string `json:"message"`
		} `json:"logs"`
	}
	e2bGet(t, d, "/v2/sandboxes/"+sb.ID+"/logs?direction=backward&limit=1", 200, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Message != "later" {
		t.Errorf("e2b v2 backward, limit 1: %+v", v2)
	}
	future := time.Now().Add(time.Hour).UnixMilli()
	e2bGet(t, d, fmt.Sprintf("/v2/sandboxes/%s/logs?cursor=%d", sb.ID, future), 200, &v2)
	if len(v2.Logs) != 0 {
		t.Errorf("e2b v2 from an hour ahead: %+v", v2)
	}
	for _, q := range []string{"?limit=-1", "?limit=x", "?start=-5", "?start=1e3"} {
		e2bGet(t, d, "/sandboxes/"+sb.ID+"/logs"+q, 400, nil)
	}
	e2bGet(t, d, "/v2/sandboxes/"+sb.ID+"/logs?direction=sideways", 400, nil)
	e2bGet(t, d, "/sandboxes/aaaaaaaaaaaaaaaaaaaa/logs", 404, nil)
	for _, q := range []string{"?since=-1", "?since=abc", "?follow=maybe"} {
		status, body := d.v1(t, "GET", "/v1/sandboxes/"+sb.ID+"/logs"+q, d.key, "")
		wantV1(t, "logs"+q, status, body, 400, "invalid")
	}

	// atoll top shows the sandbox once a sample is in.
	deadline = time.Now().Add(30 * time.Second)
	for {
		out, code = d.cli("top", "--once")
		if code == 0 && strings.Contains(out, sb.ID) && !strings.Contains(out, sb.ID+"  host  ns  -") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("atoll top --once: exit %d\n%s", code, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(out, "CPU %") || !strings.Contains(out, "NET RX") {
		t.Errorf("atoll top's header:\n%s", out)
	}

	// An error of the sandbox's agent, forwarded, names the request once,
	// in its header and its body.
	req, _ := http.NewRequest("GET", d.url+"/v1/sandboxes/"+sb.ID+"/files?path=/no/such/file", nil)
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("X-Request-Id", "agent-err-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if ids := resp.Header.Values("X-Request-Id"); resp.StatusCode != 404 || len(ids) != 1 || ids[0] != "agent-err-1" || e.RequestID != "agent-err-1" {
		t.Errorf("agent's 404: %s, X-Request-Id %q, body %+v", resp.Status, ids, e)
	}

	// A stopped sandbox has no agent to ask: 409 on atoll's API, no lines
	// on E2B's.
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	status, body := d.v1(t, "GET", "/v1/sandboxes/"+sb.ID+"/logs", d.key, "")
	wantV1(t, "logs of a stopped sandbox", status, body, 409, "conflict")
	e2bGet(t, d, "/sandboxes/"+sb.ID+"/logs", 200, &v1)
	if len(v1.Logs) != 0 {
		t.Errorf("e2b logs of a stopped sandbox: %+v", v1)
	}
}

// readLogs reads sandbox id's log once, not followed.
func readLogs(t *testing.T, c *atoll.Client, id string, opts atoll.LogOptions) []api.LogEntry {
	t.Helper()
	s, err := c.Logs(context.Background(), id, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []api.LogEntry
	for s.Next() {
		out = append(out, s.Event())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// e2bGet GETs path of the daemon's E2B API and decodes the answer into v.
func e2bGet(t *testing.T, d *daemon, path string, status int, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", d.url+path, nil)
	req.Header.Set("X-API-Key", d.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Errorf("GET %s: %d %s, want %d", path, resp.StatusCode, b, status)
		return
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Errorf("GET %s: %s: %v", path, b, err)
		}
	}
}

// TestMetricsNetwork: a sandbox's metrics count the bytes its network
// moves: 20 MB sent to a test host and 20 MB received from it show in its
// samples' network_tx_bytes and network_rx_bytes (± 5 %, headers and
// handshakes on top).
func TestMetricsNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	d := startDaemonIn(t, testenv.Dir(t), w.host, "--network", "on", "--network-bridge", w.id, "--dns-upstream", wInet4,
		"--metrics-interval", "1s", "--warm-pool", "0", "--prestart", "0", "--network-pool", "0")
	c := d.client()
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	latest := func() api.Metric {
		t.Helper()
		ms, err := c.Metrics(ctx, sb.ID, time.Time{}, time.Time{})
		if err != nil || len(ms) == 0 {
			t.Fatalf("metrics: %v %v", ms, err)
		}
		return ms[len(ms)-1]
	}
	waitSample := func(after time.Time) api.Metric {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			ms, _ := c.Metrics(ctx, sb.ID, time.Time{}, time.Time{})
			if len(ms) > 0 && ms[len(ms)-1].Time.After(after.Add(time.Second)) {
				return ms[len(ms)-1]
			}
			time.Sleep(200 * time.Millisecond)
		}
		return latest()
	}
	before := waitSample(time.Now())
	const n = 20_000_000
	bulkRate(t, c, sb.ID, wInet4, "up", n)
	bulkRate(t, c, sb.ID, wInet4, "down", n)
	after := waitSample(time.Now())
	tx, rx := after.NetworkTxBytes-before.NetworkTxBytes, after.NetworkRxBytes-before.NetworkRxBytes
	t.Logf("moved %d each way: tx %d, rx %d", n, tx, rx)
	if tx < n || tx > n*105/100 {
		t.Errorf("network_tx_bytes grew by %d, want %d + ≤ 5 %%", tx, n)
	}
	if rx < n || rx > n*105/100 {
		t.Errorf("network_rx_bytes grew by %d, want %d + ≤ 5 %%", rx, n)
	}
}
