package ns_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// BenchmarkStartExecStop measures the runtime alone: start to agent ready, one
// exec of true, stop. The API-level figures come from bench/.
func BenchmarkStartExecStop(b *testing.B) {
	rt, env := benchRuntime(b)
	limits := runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sb := runtimetest.Start(b, rt, env, limits, 1<<30)
		if _, err := sb.Client.Exec(context.Background(), api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		if err := rt.Stop(context.Background(), sb.ID, sb.Inst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExec measures an exec of true through the agent socket alone.
func BenchmarkExec(b *testing.B) {
	rt, env := benchRuntime(b)
	sb := runtimetest.Start(b, rt, env, runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, PIDs: 64}, 1<<30)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := sb.Client.Exec(context.Background(), api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRuntime(b *testing.B) (*ns.Runtime, runtimetest.Env) {
	testenv.RequireRoot(b)
	dir := testenv.Dir(b)
	ls := testenv.Layers(b, dir)
	runRoot := filepath.Join(dir, "run")
	rt, err := ns.New(ns.Config{RunRoot: runRoot})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unmountAll(runRoot) })
	return rt, runtimetest.Env{Layers: ls, AgentPath: testenv.AgentBinary(b)}
}
