package ns_test

import (
	"path/filepath"
	"testing"

	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// BenchmarkStartExecStop measures the runtime alone: start to agent ready, one
// exec of true, stop. The API-level figures come from bench/.
func BenchmarkStartExecStop(b *testing.B) { runtimetest.BenchStartExecStop(b, benchRuntime) }

// BenchmarkExec measures an exec of true through the agent socket alone.
func BenchmarkExec(b *testing.B) { runtimetest.BenchExec(b, benchRuntime) }

func benchRuntime(b testing.TB) (*ns.Runtime, runtimetest.Env) {
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
