package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/atoll-dev/atoll/internal/telemetry"
)

// metricsHandler serves this node's Prometheus metrics: the process's
// events and, read at each scrape, its sandboxes' levels and its capacity
// (--node-capacity, or the host's figures).
func (s *serving) metricsHandler() http.Handler {
	return telemetry.Handler(func(ctx context.Context) (telemetry.Levels, error) {
		l, err := s.svc.Levels(ctx)
		if err != nil {
			return l, err
		}
		c := s.cluster.capacity
		if s.cluster.member == nil {
			if c, err = nodeCapacity(s.cfg.cluster.capacity, s.dir.Layers()); err != nil {
				return l, err
			}
		}
		l.Capacity = telemetry.Resources{CPU: c.CPU, MemoryBytes: c.MemoryMiB << 20, DiskBytes: c.DiskGiB << 30, Sandboxes: c.Sandboxes}
		return l, nil
	})
}

// serveMetrics serves h at http://ADDR/metrics (--metrics-listen), without
// authentication: an address for the monitoring system alone to reach.
// GET /v1/metrics serves the same to admin keys on the API's listener.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: time.Minute}
	go hs.Serve(ln)
	log.Info("serving Prometheus metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() { hs.Close() }, nil
}
