package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// maxForks is the server's limit on children per fork, checked here too for a
// clearer message before any request.
const maxForks = 100

func newPauseCmd(g *globals) *cobra.Command {
	var toDisk, noMemory bool
	cmd := eachIDCmd(g, &cobra.Command{
		Use:   "pause ID... [--to-disk | --no-memory]",
		Short: "Freeze sandboxes' processes, keeping their memory",
		Long: `Pause running sandboxes: their processes stop being scheduled but keep their
memory, open files and network state. Commands and file access answer "conflict"
until "atoll resume" thaws them.

With --to-disk, the sandbox's memory and processes are saved to disk and it
stops (state suspended): it holds no memory or CPU, survives a restart of the
server or the host, and "atoll resume" restores it with its processes going on.
Only runtimes with the memory_snapshot capability can (gvisor, vm).

With --no-memory, the sandbox's processes end and its files stay (state
shelved, E2B's pause without keepMemory): "atoll resume" boots it again over
its files. Any runtime can.`,
		Example: `  atoll pause 3k9x2m7q1w8e5r4t6y0u
  atoll pause --to-disk 3k9x2m7q1w8e5r4t6y0u
  atoll pause --no-memory 3k9x2m7q1w8e5r4t6y0u
  atoll ls -q --label team=infra | xargs atoll pause`,
	}, func(c *atoll.Client, ctx context.Context, id string) error {
		var err error
		switch {
		case toDisk:
			_, err = c.SuspendSandbox(ctx, id)
		case noMemory:
			_, err = c.ShelveSandbox(ctx, id)
		default:
			_, err = c.PauseSandbox(ctx, id)
		}
		return err
	})
	cmd.Flags().BoolVar(&toDisk, "to-disk", false, "save memory and processes to disk and stop (state suspended)")
	cmd.Flags().BoolVar(&noMemory, "no-memory", false, "end the processes, keep the files; resume boots it (state shelved)")
	cmd.MarkFlagsMutuallyExclusive("to-disk", "no-memory")
	return cmd
}

func newResumeCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:   "resume ID...",
		Short: "Thaw paused sandboxes, restore suspended ones, boot shelved ones",
		Long: `Resume paused sandboxes: their processes carry on where they were frozen. A
suspended sandbox (paused to disk) is restored from its memory image; a
shelved one (paused without memory) boots again over its files.`,
		Example: `  atoll resume 3k9x2m7q1w8e5r4t6y0u
  atoll ls -q --state paused | xargs atoll resume`,
	}, discard((*atoll.Client).ResumeSandbox))
}

func newForkCmd(g *globals) *cobra.Command {
	var req api.ForkRequest
	var labels []string
	cmd := &cobra.Command{
		Use:   "fork ID [flags]",
		Short: "Create sandboxes from a sandbox's current files",
		Long: fmt.Sprintf(`Fork a sandbox: create new sandboxes, each starting from a copy of its files as
they are now, with its template and limits, and print their IDs one per line.
The sandbox itself carries on unchanged. At most %d children per fork.

With --memory the children also start from its memory: its processes run on in
each of them, from where they were. The sandbox is paused to disk and back for
it (a second or two); only runtimes with the memory_fork capability can (gvisor).`, maxForks),
		Example: `  atoll fork 3k9x2m7q1w8e5r4t6y0u
  for id in $(atoll fork 3k9x2m7q1w8e5r4t6y0u -n 8 --label run=42); do
    atoll exec $id -- ./try.sh &
  done; wait
  atoll fork 3k9x2m7q1w8e5r4t6y0u -n 4 --memory`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Count < 1 || req.Count > maxForks {
				return fmt.Errorf("-n %d: want 1 to %d", req.Count, maxForks)
			}
			var err error
			if req.Labels, err = keyValues("--label", labels); err != nil {
				return err
			}
			sbs, err := request(g, cmd, func(ctx context.Context, c *atoll.Client) ([]api.Sandbox, error) {
				return c.ForkSandbox(ctx, args[0], req)
			})
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&req.Count, "count", "n", 1, fmt.Sprintf("how many sandboxes to create (1-%d)", maxForks))
	f.StringArrayVar(&labels, "label", nil, "label k=v of the new sandboxes (repeatable)")
	f.BoolVar(&req.Memory, "memory", false, "start the children from the sandbox's memory too, its processes running")
	return cmd
}

func newRestoreCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "restore ID SNAPSHOT",
		Short: "Put a snapshot's files back into a sandbox",
		Long: `Restore a sandbox to a snapshot: its files become the snapshot's, and whatever
was written since is lost. The snapshot may be of another sandbox.`,
		Example: `  snap=$(atoll snapshot create 3k9x2m7q1w8e5r4t6y0u --name clean)
  atoll exec 3k9x2m7q1w8e5r4t6y0u -- make test
  atoll restore 3k9x2m7q1w8e5r4t6y0u $snap`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printKey(g, cmd, func(ctx context.Context, c *atoll.Client) (api.Sandbox, error) {
				return c.RestoreSandbox(ctx, args[0], api.RestoreRequest{Snapshot: args[1]})
			}, sandboxListing.key)
		},
	}
}

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot COMMAND",
		Aliases: []string{"snapshots"},
		Short:   "Manage snapshots: saved copies of sandboxes' files",
		Long: `Manage snapshots, immutable copies of a sandbox's files at one instant.
"atoll create --snapshot SNAP" starts a new sandbox from one, "atoll restore"
puts one back into an existing sandbox.`,
		Example: `  snap=$(atoll snapshot create 3k9x2m7q1w8e5r4t6y0u --name deps-installed)
  atoll create --snapshot $snap
  atoll snapshot ls
  atoll snapshot rm $snap`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newSnapshotCreateCmd(g), newSnapshotLsCmd(g), newSnapshotRmCmd(g), newSnapshotArchiveCmd(g))
	return cmd
}

func newSnapshotCreateCmd(g *globals) *cobra.Command {
	var req api.CreateSnapshotRequest
	cmd := &cobra.Command{
		Use:   "create ID [flags]",
		Short: "Take a snapshot of a sandbox's files",
		Long: `Take a snapshot of a sandbox's files and print the snapshot's ID. The name is
optional: at most 63 characters of letters, digits, ".", "_" and "-".`,
		Example: `  atoll snapshot create 3k9x2m7q1w8e5r4t6y0u --name deps-installed`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printKey(g, cmd, func(ctx context.Context, c *atoll.Client) (api.Snapshot, error) {
				return c.CreateSnapshot(ctx, args[0], req)
			}, snapshotListing.key)
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "name of the snapshot")
	return cmd
}

func newSnapshotLsCmd(g *globals) *cobra.Command {
	return snapshotListing.command(g, &cobra.Command{
		Use:   "ls [ID] [flags]",
		Short: "List snapshots",
		Long: `List snapshots, all or those taken of sandbox ID, as a table or as JSON with
--json. SANDBOX is the sandbox each was taken of, which may be gone; SANDBOXES
counts the sandboxes created from it.`,
		Example: `  atoll snapshot ls
  atoll snapshot ls 3k9x2m7q1w8e5r4t6y0u
  atoll snapshot ls --json | jq -r '.snapshots[] | select(.sandboxes == 0) | .id'`,
		Args: cobra.MaximumNArgs(1),
	}, "IDs", func(ctx context.Context, c *atoll.Client, args []string) ([]api.Snapshot, error) {
		var sandbox string
		if len(args) == 1 {
			sandbox = args[0]
		}
		return c.ListSnapshots(ctx, sandbox)
	})
}

var snapshotListing = listing[api.Snapshot]{
	json:  func(snaps []api.Snapshot) any { return api.SnapshotList{Snapshots: snaps} },
	key:   func(s api.Snapshot) string { return s.ID },
	table: renderSnapshots,
	order: func(a, b api.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	},
}

func newSnapshotRmCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:     "rm SNAPSHOT...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots",
		Long: `Delete snapshots. Sandboxes created from a snapshot keep their files: each
has its own copy.`,
		Example: `  atoll snapshot rm 7h2k9x0q1w8e5r4t6y0u
  atoll snapshot ls -q 3k9x2m7q1w8e5r4t6y0u | xargs atoll snapshot rm`,
	}, (*atoll.Client).DeleteSnapshot)
}

func newSnapshotArchiveCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:   "archive SNAPSHOT...",
		Short: "Move snapshots' files to object storage",
		Long: `Archive snapshots: their files move to the server's archive store and their
local disk is freed. Creating a sandbox from an archived snapshot, or
restoring a sandbox to one, brings it back first.`,
		Example: `  atoll snapshot archive 7h2k9x0q1w8e5r4t6y0u
  atoll snapshot ls -q | xargs atoll snapshot archive`,
	}, discard((*atoll.Client).ArchiveSnapshot))
}

func newArchiveCmd(g *globals) *cobra.Command {
	return eachIDCmd(g, &cobra.Command{
		Use:   "archive ID...",
		Short: "Move stopped sandboxes' files to object storage",
		Long: `Archive stopped sandboxes: their files move to the server's archive store and
their local disk is freed. "atoll start" brings them back, exactly as they were.`,
		Example: `  atoll stop 3k9x2m7q1w8e5r4t6y0u && atoll archive 3k9x2m7q1w8e5r4t6y0u
  atoll ls -q --state stopped | xargs atoll archive`,
	}, discard((*atoll.Client).ArchiveSandbox))
}
