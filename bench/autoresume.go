package main

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// autoResume measures what waking a paused ns sandbox adds to a request:
// the same GET through the port proxy (and the same exec through the API)
// to a running auto-resume sandbox, and to it paused, which the request
// resumes and waits for; and, as the peer a client has without the
// option, an explicit resume before the request.
func autoResume(r *report, work string, n int) {
	srv, client, proxyAddr, done := proxiedServer(work, "autoresume")
	defer done()
	defer srv.stop()
	c := srv.client()
	ctx := context.Background()
	sb, u := listening(srv, api.CreateSandboxRequest{AutoResume: true, Ports: &api.PortAccess{Public: true}}, proxyAddr)
	get := func() time.Duration {
		t0 := time.Now()
		resp, err := client.Get(u)
		check(err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fatal("GET through the port proxy: %s", resp.Status)
		}
		return time.Since(t0)
	}
	exec1 := func() time.Duration {
		t0 := time.Now()
		code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		check(err)
		if code != 0 {
			fatal("true exited %d", code)
		}
		return time.Since(t0)
	}
	pause := func() {
		_, err := c.PauseSandbox(ctx, sb.ID)
		check(err)
	}
	get() // warm: the proxy's first connection to the sandbox
	var running, woken, explicit, execRunning, execWoken []time.Duration
	for i := 0; i < n; i++ {
		running = append(running, get())
		pause()
		woken = append(woken, get())
		pause()
		t0 := time.Now()
		_, err := c.ResumeSandbox(ctx, sb.ID)
		check(err)
		get()
		explicit = append(explicit, time.Since(t0))
		execRunning = append(execRunning, exec1())
		pause()
		execWoken = append(execWoken, exec1())
	}
	r.add("GET through the port proxy, running auto-resume sandbox (peer)", "sequential", running)
	r.add("GET through the port proxy that wakes a paused auto-resume sandbox", "sequential", woken)
	r.add("resume (API), then GET through the port proxy (peer: the client wakes it)", "sequential", explicit)
	r.add("exec `true` (API), running auto-resume sandbox (peer)", "sequential", execRunning)
	r.add("exec `true` (API) that wakes a paused auto-resume sandbox", "sequential", execWoken)
	check(c.DeleteSandbox(ctx, sb.ID))
}
