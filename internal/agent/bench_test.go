package agent

import (
	"context"
	"os/exec"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// BenchmarkExecTrue is an exec of true through an in-process agent, beside
// BenchmarkOSExecTrue, the same with os/exec and no agent: the difference is
// the agent's own cost.
func BenchmarkExecTrue(b *testing.B) {
	t := &testing.T{}
	env := startAgent(t, Config{})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := env.c.Exec(context.Background(), api.ExecRequest{Cmd: []string{"/usr/bin/true"}}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOSExecTrue(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if err := exec.Command("/usr/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
