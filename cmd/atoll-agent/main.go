// Command atoll-agent is the PID 1 of every atoll sandbox; see
// docs/agent-protocol.md. Started as "atoll-agent init" it first sets up the
// ns runtime's sandbox from the inside, then goes on as the agent; under
// gvisor it starts bare and binds the socket $ATOLL_AGENT_LISTEN names.
package main

import (
	"os"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
)

func main() {
	var ready func()
	if len(os.Args) > 1 && os.Args[1] == nsinit.Arg {
		ready = nsinit.Setup()
	}
	agent.Main(ready)
}
