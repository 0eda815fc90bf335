package main

import (
	"log/slog"
	"testing"
)

// TestServePprofLoopbackOnly: the profiles have no authentication, so
// --debug-pprof takes a loopback address and nothing else.
func TestServePprofLoopbackOnly(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:6060", "localhost:0", "nonsense"} {
		if stop, err := servePprof(addr, log); err == nil {
			stop()
			t.Errorf("--debug-pprof %s was accepted", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		stop, err := servePprof(addr, log)
		if err != nil {
			t.Errorf("--debug-pprof %s: %v", addr, err)
			continue
		}
		stop()
	}
}
