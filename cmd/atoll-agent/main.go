// Command atoll-agent is the PID 1 of every atoll sandbox; see
// docs/agent-protocol.md. Started as "atoll-agent init" it first sets up the
// ns runtime's sandbox from the inside, then goes on as the agent; under
// gvisor it starts bare and binds the socket $ATOLL_AGENT_LISTEN names. In a
// vm sandbox the kernel starts it as "vm-init" from the initramfs, and on
// the host it is also the vm runtime's channel proxy ("vm-proxy").
package main

import (
	"os"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

func main() {
	var ready func()
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case nsinit.Arg:
			ready = nsinit.Setup()
		case vminit.InitArg:
			vminit.Init()
		case vminit.AgentArg:
			vminit.AgentMain()
			return
		case channel.ProxyArg:
			channel.ProxyMain(os.Args[2:])
			return
		}
	}
	agent.Main(ready)
}
