package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newCreateCmd(g *globals) *cobra.Command {
	var req api.CreateSandboxRequest
	var env, labels, selector, vaults []string
	var timeout, autoDelete, autoStop, autoArchive, checkpointEvery time.Duration
	var pol policyFlags
	var publicPorts bool
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create and start a sandbox",
		Long: `Create a sandbox, start it and print its ID. Unset limits take the server's defaults.
With --snapshot it starts from a snapshot's files and that snapshot's template.

--timeout stops the sandbox that long after it starts ("atoll timeout" moves it);
--ephemeral deletes it when it stops; --auto-delete deletes it that long after
it stops; --auto-stop stops it after that long without activity (no API call
about it and no process of its own running); --auto-archive moves its files to
the archive store that long after it stops (a start brings them back).
--checkpoint-every copies its files to object storage that often while it
runs (cluster mode): if its node is lost, a start restores it on another
node from the latest checkpoint.
--auto-resume wakes it when paused and a request reaches one of its ports or
its agent (the request waits), and makes --timeout pause it instead of
stopping it. Durations are at most a year.

--egress, --allow and --deny set its egress policy (default allow-all; see
"atoll network").

--vault NAME[:ro][=PATH] clones the memory vault NAME into the sandbox, at
/home/user/memory/NAME or PATH, before the create answers; git pull and git
push work there with a short-lived token for that vault and that sandbox (":ro":
pull only). Repeatable; see docs/vault.md.

In a cluster, --node-selector K=V puts it only on nodes carrying that label
(atoll serve --node-label), --spread KEY spreads sandboxes over the values of
a node label, and --explain prints how its node was chosen: the candidates
with their scores and the score's parts, why the chosen one won, and the
nodes filtered out with why ("atoll placement ID" shows it later).`,
		Example: `  atoll create --template host --cpu 2 --memory 2048 --env LANG=C.UTF-8 --label team=infra
  atoll create --snapshot 7h2k9x0q1w8e5r4t6y0u
  atoll create --timeout 30m --ephemeral
  atoll create --timeout 10m --auto-resume --public-ports
  atoll create --egress deny-all --allow pypi.org --allow '*.pythonhosted.org' --allow 10.0.0.0/8
  atoll create --node-selector zone=a --explain
  atoll create --vault notes --vault handbook:ro=/srv/handbook`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			for _, d := range []struct {
				flag string
				d    time.Duration
				sec  *int64
			}{
				{"--timeout", timeout, &req.TimeoutSec},
				{"--auto-delete", autoDelete, &req.AutoDeleteSec},
				{"--auto-stop", autoStop, &req.AutoStopSec},
				{"--auto-archive", autoArchive, &req.AutoArchiveSec},
				{"--checkpoint-every", checkpointEvery, &req.CheckpointEverySec},
			} {
				if *d.sec, err = seconds(d.flag, d.d); err != nil {
					return err
				}
			}
			for _, kv := range []struct {
				flag string
				kvs  []string
				m    *map[string]string
			}{
				{"--env", env, &req.Env},
				{"--label", labels, &req.Labels},
				{"--node-selector", selector, &req.NodeSelector},
			} {
				if *kv.m, err = keyValues(kv.flag, kv.kvs); err != nil {
					return err
				}
			}
			if req.Vaults, err = parseVaultFlags(vaults); err != nil {
				return err
			}
			req.Network = pol.policy()
			if publicPorts {
				req.Ports = &api.PortAccess{Public: true}
			}
			sb, err := request(g, cmd, func(ctx context.Context, c *atoll.Client) (api.Sandbox, error) {
				return c.CreateSandbox(ctx, req)
			})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			if req.Explain {
				renderExplain(cmd.OutOrStdout(), sb)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "", `template to start from: NAME, or NAME@VERSION for an older version (server default "host")`)
	f.StringVar(&req.Snapshot, "snapshot", "", "snapshot to start from (see \"atoll snapshot ls\")")
	f.StringVar(&req.Runtime, "runtime", "", `runtime: ns, gvisor or vm (server default "ns")`)
	f.Float64Var(&req.CPU, "cpu", 0, "CPU cores")
	f.Int64Var(&req.MemoryMiB, "memory", 0, "memory in MiB, without swap")
	f.Int64Var(&req.DiskGiB, "disk", 0, "disk quota of the writable layer in GiB")
	f.Int64Var(&req.PIDs, "pids", 0, "maximum number of processes")
	f.StringArrayVar(&env, "env", nil, "default environment variable K=V of every process (repeatable)")
	f.StringArrayVar(&labels, "label", nil, "label k=v (repeatable)")
	f.StringArrayVar(&vaults, "vault", nil, "clone memory vault NAME[:ro][=PATH] into the sandbox (repeatable; default path /home/user/memory/NAME)")
	f.DurationVar(&timeout, "timeout", 0, "stop the sandbox this long after it starts, e.g. 30m (default never)")
	f.BoolVar(&req.Ephemeral, "ephemeral", false, "delete the sandbox when it stops")
	f.DurationVar(&autoDelete, "auto-delete", 0, "delete the sandbox this long after it stops, e.g. 24h (default never)")
	f.DurationVar(&autoStop, "auto-stop", 0, "stop the sandbox after this long without activity, e.g. 15m (default never)")
	f.DurationVar(&autoArchive, "auto-archive", 0, "archive the sandbox this long after it stops, e.g. 1h (default never)")
	f.DurationVar(&checkpointEvery, "checkpoint-every", 0, "copy the running sandbox's files to object storage this often, e.g. 5m (cluster; default never)")
	f.BoolVar(&req.AutoResume, "auto-resume", false, "resume the sandbox when paused and traffic reaches it; its timeout pauses it instead of stopping it")
	f.StringArrayVar(&selector, "node-selector", nil, "in a cluster, run it only on a node carrying label k=v (repeatable)")
	f.StringVar(&req.Spread, "spread", "", "in a cluster, spread sandboxes over the values of this node label, e.g. zone")
	f.BoolVar(&req.Explain, "explain", false, "print how its node was chosen: candidates, scores, and the nodes filtered out")
	f.BoolVar(&publicPorts, "public-ports", false, "let anyone who can reach the port proxy open the sandbox's ports, without a token (see \"atoll port\")")
	pol.register(f)
	return cmd
}

// seconds converts the duration of flag to whole seconds for the API, rounding
// up so that a fraction of a second does not become 0, which means never.
func seconds(flag string, d time.Duration) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("%s %v: must not be negative", flag, d)
	}
	sec := int64(d / time.Second)
	if d%time.Second > 0 {
		sec++
	}
	return sec, nil
}

func newTimeoutCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set when a sandbox stops",
		Long: `Make a running or paused sandbox stop DURATION from now (e.g. 30m, 2h),
replacing any earlier timeout; 0 removes the timeout. At most a year.`,
		Example: `  atoll timeout 3k9x2m7q1w8e5r4t6y0u 1h
  atoll timeout 3k9x2m7q1w8e5r4t6y0u 0`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				return fmt.Errorf("duration %q: want e.g. 30m or 0", args[1])
			}
			if d < 0 {
				return fmt.Errorf("duration %v: must not be negative", d)
			}
			return printKey(g, cmd, func(ctx context.Context, c *atoll.Client) (api.Sandbox, error) {
				return c.SetTimeout(ctx, args[0], d)
			}, sandboxListing.key)
		},
	}
}

// keyValues parses K=V arguments of flag.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

func newLsCmd(g *globals) *cobra.Command {
	var opts atoll.ListOptions
	var labels []string
	cmd := sandboxListing.command(g, &cobra.Command{
		Use:   "ls [flags]",
		Short: "List sandboxes",
		Long:  `List sandboxes as a table, or as JSON with --json.`,
		Example: `  atoll ls --state running --label team=infra
  atoll ls -q | xargs atoll stop`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, args []string) error {
			var err error
			opts.Labels, err = keyValues("--label", labels)
			return err
		},
	}, "IDs", func(ctx context.Context, c *atoll.Client, _ []string) ([]api.Sandbox, error) {
		return c.ListSandboxes(ctx, opts)
	})
	f := cmd.Flags()
	f.StringVar(&opts.State, "state", "", "only sandboxes in this state (creating, starting, running, stopping, paused, suspended, shelved, stopped, archived, deleting, error)")
	f.StringArrayVar(&labels, "label", nil, "only sandboxes with label k=v (repeatable; all must match)")
	return cmd
}

var sandboxListing = listing[api.Sandbox]{
	json:  func(sbs []api.Sandbox) any { return api.SandboxList{Sandboxes: sbs} },
	key:   func(sb api.Sandbox) string { return sb.ID },
	table: renderList,
}

func newInspectCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:     "inspect ID",
		Short:   "Show a sandbox's details",
		Long:    `Show a sandbox's state, limits, times and labels; --json shows everything.`,
		Example: `  atoll inspect 3k9x2m7q1w8e5r4t6y0u --json`,
		Args:    cobra.ExactArgs(1),
	}, "print JSON", byID((*atoll.Client).GetSandbox), func(w io.Writer, sb api.Sandbox) error { return renderInspect(w, sb, time.Now()) })
}

// eachIDCmd is cmd, given its help, taking one or more IDs and running op
// on each through eachID.
func eachIDCmd(g *globals, cmd *cobra.Command, op func(c *atoll.Client, ctx context.Context, id string) error) *cobra.Command {
	cmd.Args = cobra.MinimumNArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return eachID(g, cmd, args, op) }
	return cmd
}

// discard is op without the value it answers, for eachIDCmd: the ID
// printed says that it was done.
func discard[T any](op func(c *atoll.Client, ctx context.Context, id string) (T, error)) func(*atoll.Client, context.Context, string) error {
	return func(c *atoll.Client, ctx context.Context, id string) error {
		_, err := op(c, ctx, id)
		return err
	}
}

// eachID runs op on every ID, printing each ID done and each error, like docker.
func eachID(g *globals, cmd *cobra.Command, ids []string, op func(c *atoll.Client, ctx context.Context, id string) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	failed := false
	for _, id := range ids {
		if err := op(c, cmd.Context(), id); err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "atoll: %s: %v\n", id, err)
			failed = true
			continue
		}
		fmt.Fprintln(cmd.OutOrStdout(), id)
	}
	if failed {
		return exitError{1}
	}
	return nil
}

func newStopCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:     "stop ID...",
		Short:   "Stop sandboxes, keeping their files",
		Long:    `Stop running sandboxes. Their files stay; "atoll start" runs them again.`,
		Example: `  atoll stop 3k9x2m7q1w8e5r4t6y0u`,
	}, discard((*atoll.Client).StopSandbox))
}

func newStartCmd(g *globals) *cobra.Command {
	var cmd *cobra.Command
	cmd = eachIDCmd(g, &cobra.Command{
		Use:   "start ID...",
		Short: "Start stopped sandboxes",
		Long: `Start stopped sandboxes with the files they had. An archived sandbox's files
come back from the archive store first; on a terminal its progress is shown.`,
		Example: `  atoll start 3k9x2m7q1w8e5r4t6y0u`,
	}, func(c *atoll.Client, ctx context.Context, id string) error {
		if isTerminal(cmd.ErrOrStderr()) {
			defer showProgress(ctx, c, id, cmd.ErrOrStderr())()
		}
		_, err := c.StartSandbox(ctx, id)
		return err
	})
	return cmd
}

func newRmCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes and their files",
		Long:    `Delete sandboxes, running or not, and everything in them. This cannot be undone.`,
		Example: `  atoll rm 3k9x2m7q1w8e5r4t6y0u
  atoll ls -q --label run=42 | xargs atoll rm`,
	}, (*atoll.Client).DeleteSandbox)
}

// showProgress redraws sandbox id's progress on w, a terminal, every half
// second until the returned function is called.
func showProgress(ctx context.Context, c *atoll.Client, id string, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		shown := false
		defer func() {
			if shown {
				fmt.Fprint(w, "\r\033[K")
			}
		}()
		every(ctx, 500*time.Millisecond, func() {
			sb, err := c.GetSandbox(ctx, id)
			if err != nil || sb.Progress == nil {
				return
			}
			fmt.Fprintf(w, "\r\033[K%s: %s", sb.Progress.Op, progressText(*sb.Progress))
			shown = true
		})
	}()
	return func() { cancel(); <-done }
}

// progressText is p as "120 MiB of 1.0 GiB (12%)", or the bytes alone when
// the total is not known.
func progressText(p api.Progress) string {
	if p.TotalBytes <= 0 {
		return formatBytes(p.DoneBytes)
	}
	return fmt.Sprintf("%s of %s (%d%%)", formatBytes(p.DoneBytes), formatBytes(p.TotalBytes), p.DoneBytes*100/p.TotalBytes)
}

// parseVaultFlags parses --vault's values, NAME[:ro|:rw][=PATH]; the server
// checks names and paths.
func parseVaultFlags(vals []string) ([]api.VaultMount, error) {
	var out []api.VaultMount
	for _, v := range vals {
		spec, path, _ := strings.Cut(v, "=")
		name, mode, colon := strings.Cut(spec, ":")
		m := api.VaultMount{Name: name, Path: path}
		switch {
		case !colon, mode == "rw":
		case mode == "ro":
			m.ReadOnly = true
		default:
			return nil, fmt.Errorf("--vault %q: want NAME[:ro][=PATH]", v)
		}
		out = append(out, m)
	}
	return out, nil
}
