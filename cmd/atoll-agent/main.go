// Command atoll-agent is the PID 1 of every atoll sandbox; see
// docs/agent-protocol.md. Started as "atoll-agent init" it first sets up the
// ns runtime's sandbox from the inside, then goes on as the agent; under
// gvisor it starts bare and binds the socket $ATOLL_AGENT_LISTEN names. In a
// vm sandbox the kernel starts it as "vm-init" from the initramfs, and on
// the host it is also the vm runtime's channel proxy ("vm-proxy"). The roles
// and what each inherits are package launch's; package agentbin runs them.
package main

import "github.com/atoll-dev/atoll/internal/agentbin"

func main() { agentbin.Main() }
