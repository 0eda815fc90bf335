// Command atoll is atoll's one binary: `atoll serve` runs the server, and the
// other commands are the CLI, a client of the server's HTTP API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func main() {
	if runAsAgent() {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err))
}

// exitCode prints err as "atoll: <message>" and returns the process's exit code.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "atoll:", err)
	return 1
}

// exitError ends the CLI with a code and no message: a command's own exit
// code, or 1 after the command printed its errors itself.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// globals are the connection flags every client command shares.
type globals struct {
	url, apiKey, data string
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "atoll",
		Short: "Isolated, stateful Linux sandboxes for AI agents",
		Long: `atoll runs isolated, stateful Linux sandboxes that start in milliseconds.
"atoll serve" runs the server; the other commands talk to a server over its HTTP API.

The server is found from --url and --api-key, else $ATOLL_URL and $ATOLL_API_KEY,
else the files url and api-key that a local "atoll serve" writes into its data
directory (--data). For a cluster, the URL may list several nodes, separated by
commas: a node that cannot be reached is skipped.`,
		Example: `  id=$(atoll create --template host --label project=demo)
  atoll exec $id -- uname -a
  atoll cp ./src $id:/work/src
  atoll shell $id
  atoll snapshot create $id --name clean
  atoll fork $id -n 4
  atoll rm $id
  atoll template import docker.io/library/python:3.12-slim --name python
  atoll vault create notes --layout agent`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", "", "server URL, or several nodes' URLs separated by commas (default $ATOLL_URL, else <data>/url)")
	pf.StringVar(&g.apiKey, "api-key", "", "API key (default $ATOLL_API_KEY, else <data>/api-key)")
	pf.StringVar(&g.data, "data", "/var/lib/atoll", "data directory of the local server")

	root.AddGroup(&cobra.Group{ID: "sandboxes", Title: "Sandboxes:"}, &cobra.Group{ID: "inside", Title: "Inside a sandbox:"})
	for _, c := range []*cobra.Command{newCreateCmd(g), newLsCmd(g), newInspectCmd(g), newStopCmd(g), newStartCmd(g), newPauseCmd(g), newResumeCmd(g), newArchiveCmd(g), newTimeoutCmd(g), newPlacementCmd(g), newNetworkCmd(g), newPortCmd(g), newLogsCmd(g), newTopCmd(g), newRmCmd(g)} {
		c.GroupID = "sandboxes"
		root.AddCommand(c)
	}
	root.AddGroup(&cobra.Group{ID: "snapshots", Title: "Snapshots and forks:"})
	for _, c := range []*cobra.Command{newSnapshotCmd(g), newForkCmd(g), newRestoreCmd(g)} {
		c.GroupID = "snapshots"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newExecCmd(g), newShellCmd(g), newCpCmd(g), newGitCmd(g), newMCPCmd(g), newRunCodeCmd(g), newCodeContextCmd(g)} {
		c.GroupID = "inside"
		root.AddCommand(c)
	}
	root.AddGroup(&cobra.Group{ID: "templates", Title: "Templates:"})
	tpl := newTemplateCmd(g)
	tpl.GroupID = "templates"
	root.AddCommand(tpl)
	root.AddGroup(&cobra.Group{ID: "vaults", Title: "Memory:"})
	vlt := newVaultCmd(g)
	vlt.GroupID = "vaults"
	root.AddCommand(vlt)
	root.AddGroup(&cobra.Group{ID: "server", Title: "Server:"})
	serve := newServeCmd()
	serve.GroupID = "server"
	root.AddCommand(serve)
	rts := newRuntimesCmd(g)
	rts.GroupID = "server"
	root.AddCommand(rts)
	key := newKeyCmd(g)
	key.GroupID = "server"
	root.AddCommand(key)
	tn := newTenantCmd(g)
	tn.GroupID = "server"
	root.AddCommand(tn)
	use := newUsageCmd(g)
	use.GroupID = "server"
	root.AddCommand(use)
	node := newNodeCmd(g)
	node.GroupID = "server"
	root.AddCommand(node)
	for _, c := range []*cobra.Command{newAuditCmd(g), newEventsCmd(g), newWebhookCmd(g)} {
		c.GroupID = "server"
		root.AddCommand(c)
	}
	return root
}

// client returns a client of the server the flags, environment or data
// directory name.
func (g *globals) client() (*atoll.Client, error) {
	url, key, err := g.server()
	if err != nil {
		return nil, err
	}
	return atoll.New(url, key, atoll.WithUserAgent("atoll-cli")), nil
}

// server is the URL and API key of the server the flags, environment or
// data directory name.
func (g *globals) server() (url, key string, err error) {
	url, err = setting(g.url, "ATOLL_URL", dataDir(g.data).URL())
	if err != nil {
		return "", "", err
	}
	if url == "" {
		return "", "", errors.New("no server: set --url or ATOLL_URL, or run \"atoll serve\" (which writes " + dataDir(g.data).URL() + ")")
	}
	key, err = setting(g.apiKey, "ATOLL_API_KEY", dataDir(g.data).APIKey())
	return url, key, err
}

// setting is flag, else $env, else the contents of file, else "".
func setting(flag, env, file string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	b, err := os.ReadFile(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading %s (set %s instead): %w", file, env, err)
	}
	return strings.TrimSpace(string(b)), nil
}
