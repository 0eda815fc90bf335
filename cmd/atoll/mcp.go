package main

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	atollmcp "github.com/atoll-dev/atoll/internal/mcp"
)

func newMCPCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve atoll's tools to an AI agent over MCP on stdin and stdout",
		Long: `Run a Model Context Protocol server on stdin and stdout, for desktop agents
and IDEs that start MCP servers as commands (Claude Desktop, Claude Code,
Cursor, VS Code). Its tools create, run and delete sandboxes, run commands
in them (output streamed as progress notifications), read and write their
files, move directories as tar, snapshot, fork and restore, give a port's
URL, and read, write and search memory vaults; a sandbox's files are also
resources (atoll://sandboxes/ID/files/PATH). The tools act with the API key
found as for every command, so they see that key's tenant only.

The server also serves MCP over streamable HTTP at /v1/mcp, with the API key
as a bearer token. See docs/mcp.md for clients' configuration.`,
		Example: `  atoll mcp
  ATOLL_URL=http://10.0.0.5:7070 ATOLL_API_KEY=... atoll mcp
  claude mcp add atoll -- atoll mcp`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			url, key, err := g.server()
			if err != nil {
				return err
			}
			s := atollmcp.New(atollmcp.Config{URL: url, Key: key, Version: version})
			return s.Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
}
