package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// runAsAgent lets the one atoll binary also be the in-sandbox agent: the server
// installs a copy of itself named atoll-agent-*, and sandboxes run that copy.
// It reports false when the binary was started as the CLI. Its roles are
// those of cmd/atoll-agent.
func runAsAgent() bool {
	if !strings.HasPrefix(filepath.Base(os.Args[0]), "atoll-agent") {
		return false
	}
	var ready func()
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case nsinit.Arg:
			ready = nsinit.Setup()
		case vminit.InitArg:
			vminit.Init()
		case vminit.AgentArg:
			vminit.AgentMain()
			return true
		case channel.ProxyArg:
			channel.ProxyMain(os.Args[2:])
			return true
		}
	}
	agent.Main(ready)
	return true
}
