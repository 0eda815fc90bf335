package main

import (
	"os"

	"github.com/atoll-dev/atoll/internal/agentbin"
)

// runAsAgent lets the one atoll binary also be the in-sandbox agent: the server
// installs a copy of itself named atoll-agent-*, and sandboxes run that copy.
// It reports false when the binary was started as the CLI. Its roles are
// those of cmd/atoll-agent, from the one table in package agentbin.
func runAsAgent() bool {
	if !agentbin.Is(os.Args[0]) {
		return false
	}
	agentbin.Main()
	return true
}
