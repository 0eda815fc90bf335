// Package agentbin is the atoll-agent binary: the one place that maps its
// first argument to the role it plays (see package launch for the
// contract), shared by cmd/atoll-agent and by the atoll binary when it runs
// as its own agent, and the installing of the binary on a node.
package agentbin

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// roles maps the binary's first argument to what it runs, given the
// arguments after it. None returns but by exiting, except Init's agent
// when it is told to stop.
var roles = map[string]func(args []string){
	launch.Init:    func([]string) { agent.Main(nsinit.Setup()) },
	launch.VMInit:  func([]string) { vminit.Init() },
	launch.VMAgent: func([]string) { vminit.AgentMain() },
	launch.VMProxy: channel.ProxyMain,
}

// Main runs the role os.Args names, or the agent alone (gvisor's start)
// when it names none.
func Main() {
	if len(os.Args) > 1 {
		if run, ok := roles[os.Args[1]]; ok {
			run(os.Args[2:])
			return
		}
	}
	agent.Main(nil)
}

// Is reports whether a process started as argv0 is an agent: the node runs
// an installed copy named launch.Name-<hash> (see Install), or the binary
// built as cmd/atoll-agent.
func Is(argv0 string) bool {
	return strings.HasPrefix(filepath.Base(argv0), launch.Name)
}
