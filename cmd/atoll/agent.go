package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/runtime/ns/nsinit"
)

// runAsAgent lets the one atoll binary also be the in-sandbox agent: the server
// installs a copy of itself named atoll-agent-*, and sandboxes run that copy.
// It reports false when the binary was started as the CLI.
func runAsAgent() bool {
	if !strings.HasPrefix(filepath.Base(os.Args[0]), "atoll-agent") {
		return false
	}
	var ready func()
	if len(os.Args) > 1 && os.Args[1] == nsinit.Arg {
		ready = nsinit.Setup()
	}
	agent.Main(ready)
	return true
}
