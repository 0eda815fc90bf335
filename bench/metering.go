package main

import (
	"context"
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// meteringIdle is how many running sandboxes each server of the metering
// part holds beside the measured ones, for its meter to sample each tick.
const meteringIdle = 20

// metering measures create and exec with usage metering on and off in
// one run: two servers, one metering every second (the shortest interval,
// ten times the default's work) and one with --no-usage, each holding
// meteringIdle running sandboxes, measured in turns so that the machine's
// noise falls on both alike.
func metering(r *report, work string, n int) {
	on := startServer(work, "metering-on", 0, 0, "--usage-interval", "1s")
	defer on.stop()
	off := startServer(work, "metering-off", 0, 0, "--no-usage")
	defer off.stop()
	ctx := context.Background()
	type side struct {
		name         string
		c            *atoll.Client
		create, exec []time.Duration
		idle         []string
	}
	sides := []*side{{name: "metering every 1 s", c: on.client()}, {name: "metering off", c: off.client()}}
	for _, s := range sides {
		for range meteringIdle {
			sb, err := s.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
			check(err)
			s.idle = append(s.idle, sb.ID)
		}
	}
	for i := range n {
		for j := range sides {
			s := sides[(i+j)%2] // alternate which goes first
			t0 := time.Now()
			sb, err := s.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
			check(err)
			s.create = append(s.create, time.Since(t0))
			s.exec = append(s.exec, execTrues(ctx, s.c, sb.ID, 5)...)
			check(s.c.DeleteSandbox(ctx, sb.ID))
		}
	}
	for _, s := range sides {
		mode := fmt.Sprintf("%s, %d sandboxes running", s.name, meteringIdle)
		r.add("atoll create → ready (API), cold", mode, s.create)
		r.add("atoll exec `true` round trip (API)", mode, s.exec)
	}
	// What the meter wrote, as a check that it ran.
	rep, err := sides[0].c.Usage(ctx, api.UsageQuery{Step: api.UsageByDay})
	check(err)
	var rows int
	var cpu float64
	for _, e := range rep.Usage {
		rows++
		cpu += e.CPUSeconds
	}
	r.note(fmt.Sprintf("Metering: the metered server's usage report holds %d sandboxes, %.1f CPU-seconds in all.", rows, cpu))
	for _, s := range sides {
		for _, id := range s.idle {
			check(s.c.DeleteSandbox(ctx, id))
		}
	}
}
