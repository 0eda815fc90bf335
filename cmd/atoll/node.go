package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List, cordon and drain a cluster's nodes (admin keys only)",
		Long: `A cluster's nodes ("atoll serve --cluster postgres://..."; docs/cluster.md):
each runs sandboxes and answers the whole API. "node ls" shows each node's
capacity, what its sandboxes hold, its lease and its schedule; "cordon"
stops placing new sandboxes on a node, "uncordon" lets it take them again,
and "drain" cordons it and moves its sandboxes to other nodes. On a single
machine these commands answer that the server is not a cluster.`,
		Example: `  atoll node ls
  atoll node cordon node-b
  atoll node drain node-b`,
	}
	cmd.AddCommand(newNodeListCmd(g),
		newNodeScheduleCmd(g, "cordon", "Stop placing new sandboxes on nodes",
			`Cordon nodes: the scheduler places no new sandbox on them; the sandboxes
they run stay. "atoll node uncordon" undoes it.`, (*atoll.Client).CordonNode),
		newNodeScheduleCmd(g, "uncordon", "Let nodes take new sandboxes again",
			`Uncordon nodes: the scheduler places new sandboxes on them again. It also
ends a drain; what was moved stays where it went.`, (*atoll.Client).UncordonNode),
		newNodeScheduleCmd(g, "drain", "Cordon nodes and move their sandboxes to other nodes",
			`Drain nodes: cordoned, each node moves its sandboxes to other nodes through
object storage (docs/cluster.md): archived ones are handed over, stopped
ones archived first, running ones stopped, archived, handed over and started
again on their new node, with the same ID, labels, policy and files. What no
other node has room for stays, and is tried again every 2 s; "atoll node ls"
shows "draining (N left)" until it is "draining (done)".`, (*atoll.Client).DrainNode))
	return cmd
}

func newNodeListCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the nodes: capacity, committed, lease, schedule",
		Long: `List the cluster's nodes: each one's state (live, or fenced once its lease
ran out), schedule (cordoned, draining, with how far the drain got), what its
sandboxes hold of its capacity, its runtimes, version and lease.`,
		Example: `  atoll node ls
  atoll node ls --json`,
		Args: cobra.NoArgs,
	}, "print JSON", func(ctx context.Context, c *atoll.Client, _ []string) ([]api.Node, error) {
		return c.ListNodes(ctx)
	}, func(w io.Writer, ns []api.Node) error { return renderNodes(w, ns, time.Now()) })
}

func renderNodes(w io.Writer, ns []api.Node, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tSCHEDULE\tSANDBOXES\tCPU\tMEMORY\tDISK\tRUNTIMES\tTEMPLATES\tVERSION\tLEASE")
	for _, n := range ns {
		sched := n.Schedule
		if sched == "" {
			sched = "-"
		}
		if d := n.Drain; d != nil && len(d.Left) > 0 {
			sched += fmt.Sprintf(" (%d left)", len(d.Left))
		} else if d != nil {
			sched += " (done)"
		}
		lease := "expired " + now.Sub(n.LeaseExpires).Round(time.Second).String() + " ago"
		if n.LeaseExpires.After(now) {
			lease = "renewed " + now.Sub(n.Heartbeat).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%g/%g\t%s/%s\t%d/%d GiB\t%s\t%d\t%s\t%s\n", n.Name, n.State, sched,
			n.Committed.Sandboxes, n.Capacity.Sandboxes, n.Committed.CPU, n.Capacity.CPU,
			mib(n.Committed.MemoryMiB), mib(n.Capacity.MemoryMiB), n.Committed.DiskGiB, n.Capacity.DiskGiB,
			strings.Join(n.Runtimes, ","), len(n.Templates), n.Version, lease)
	}
	return tw.Flush()
}

// mib renders MiB as MiB or GiB.
func mib(m int64) string {
	if m >= 1024 && m%1024 == 0 {
		return fmt.Sprintf("%dGi", m/1024)
	}
	return fmt.Sprintf("%dMi", m)
}

func newNodeScheduleCmd(g *globals, verb, short, long string, do func(*atoll.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     verb + " NODE...",
		Short:   short,
		Long:    long,
		Example: "  atoll node " + verb + " node-b",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return untilError(g, cmd, args, do)
		},
	}
}
