package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// e2bSDK measures Sandbox.create and commands.run('true') through the
// official e2b JS SDK (cmd/atoll/testdata/e2b/bench.mjs) and the same two
// through atoll's Go SDK on the same server. The E2B SDK runs every command
// as `/bin/bash -l -c CMD`, so the Go SDK runs that too, beside plain `true`.
func e2bSDK(r *report, srv *server, n int) {
	dir, err := filepath.Abs("cmd/atoll/testdata/e2b")
	check(err)
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		r.missing("node and npm (the e2b JS SDK)")
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		ci := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		ci.Dir = dir
		if out, err := ci.CombinedOutput(); err != nil {
			r.failed("e2b JS SDK", fmt.Sprintf("npm ci: %v: %s", err, out))
			return
		}
	}
	c := srv.client()
	ctx := context.Background()
	// atoll's Go SDK first, with what the E2B API asks of atoll for a create.
	req := api.CreateSandboxRequest{TimeoutSec: 300, Ephemeral: true, Labels: map[string]string{"bench": "go"}}
	var create, run, login []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		check(err)
		create = append(create, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
	}
	sb, err := c.CreateSandbox(ctx, req)
	check(err)
	execTimes := func(cmd ...string) (ds []time.Duration) {
		for i := 0; i < n*5+5; i++ {
			t0 := time.Now()
			code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}, io.Discard, io.Discard)
			check(err)
			if code != 0 {
				fatal("%v exited %d", cmd, code)
			}
			if i >= 5 {
				ds = append(ds, time.Since(t0))
			}
		}
		return ds
	}
	run = execTimes("true")
	login = execTimes("/bin/bash", "-l", "-c", "true")
	check(c.DeleteSandbox(ctx, sb.ID))

	cmd := exec.Command(node, "bench.mjs", fmt.Sprint(n))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+srv.url, "E2B_SANDBOX_URL="+srv.url, "E2B_API_KEY="+srv.key)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		r.failed("e2b JS SDK", fmt.Sprintf("node bench.mjs: %v", err))
		return
	}
	var js struct{ Create, Run []float64 }
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &js); err != nil {
		r.failed("e2b JS SDK", fmt.Sprintf("bench.mjs printed %q", out))
		return
	}
	r.add("E2B JS SDK `Sandbox.create()`", "sequential", millis(js.Create))
	r.add("atoll Go SDK `CreateSandbox` (same request)", "sequential", create)
	r.add("E2B JS SDK `commands.run('true')`", "sequential", millis(js.Run))
	r.add("atoll Go SDK `Exec` of `/bin/bash -l -c true`", "sequential", login)
	r.add("atoll Go SDK `Exec` of `true`", "sequential", run)
}

// millis turns milliseconds, as a JavaScript benchmark prints them, into
// durations.
func millis(ms []float64) []time.Duration {
	ds := make([]time.Duration, len(ms))
	for i, m := range ms {
		ds[i] = time.Duration(m * float64(time.Millisecond))
	}
	return ds
}
