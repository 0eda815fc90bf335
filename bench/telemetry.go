package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// telemetryIdle is how many running sandboxes the telemetry part's server
// holds, for its scrapes to count.
const telemetryIdle = 20

// telemetry measures what observability costs and how fast it is: a
// Prometheus scrape of a server holding telemetryIdle running sandboxes
// (the store read at each scrape included), and the time from a
// background command's echo to its line on a followed logs stream.
func telemetry(r *report, work string, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	addr := ln.Addr().String()
	ln.Close()
	s := startServer(work, "telemetry", 0, 0, "--metrics-listen", addr)
	defer s.stop()
	c := s.client()
	ctx := context.Background()
	var ids []string
	for range telemetryIdle {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		check(err)
		ids = append(ids, sb.ID)
	}
	var scrapes []time.Duration
	var size int64
	for range n {
		t0 := time.Now()
		resp, err := http.Get("http://" + addr + "/metrics")
		check(err)
		size, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		check(err)
		scrapes = append(scrapes, time.Since(t0))
	}
	r.add("GET /metrics (Prometheus scrape)", fmt.Sprintf("%d sandboxes running", telemetryIdle), scrapes)
	r.note(fmt.Sprintf("Telemetry: a scrape is %d bytes of text.", size))

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Logs(fctx, ids[0], atoll.LogOptions{Follow: true})
	check(err)
	defer st.Close()
	var lines []time.Duration
	for i := range n {
		mark := fmt.Sprintf("mark-%d", i)
		t0 := time.Now()
		_, err := c.StartProcess(ctx, ids[0], api.ExecRequest{Cmd: []string{"echo", mark}})
		check(err)
		for st.Next() {
			if st.Event().Line == mark {
				break
			}
		}
		check(st.Err())
		lines = append(lines, time.Since(t0))
	}
	r.add("background `echo` → its line on a followed logs stream", "exec -d, then GET …/logs?follow=true", lines)
	for _, id := range ids {
		check(c.DeleteSandbox(ctx, id))
	}
}
