// Package agentbin is the atoll-agent binary: the one place that maps its
// first argument to the role it plays (see package launch for the
// contract), shared by cmd/atoll-agent and by the atoll binary when it runs
// as its own agent, and the installing of the binary on a node.
package agentbin

import (
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
	"github.com/atoll-dev/atoll/internal/runtime/spawn"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// roles maps the binary's first argument to what it runs, given the
// arguments after it. None returns but by exiting, except Init's agent
// when it is told to stop.
var roles = map[string]func(args []string){
	launch.Init:    func([]string) { nsinit.Main(agent.Main) },
	launch.VMInit:  func([]string) { vminit.Init() },
	launch.VMAgent: func([]string) { vminit.AgentMain() },
	launch.VMProxy: channel.ProxyMain,
	launch.Spawn:   spawn.Main,
}

// init keeps the main goroutine of an ns sandbox's init on the process's
// main thread, which nsinit.Main makes the thread that starts every process
// (Go runs main on the main thread when an init function locks it).
func init() {
	if len(os.Args) > 1 && os.Args[1] == launch.Init && Is(os.Args[0]) {
		goruntime.LockOSThread()
	}
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
	agent.Main(nil, nil)
}

// Is reports whether a process started as argv0 is an agent: the node runs
// an installed copy named launch.Name-<hash> (see Install), or the binary
// built as cmd/atoll-agent.
func Is(argv0 string) bool {
	return strings.HasPrefix(filepath.Base(argv0), launch.Name)
}
