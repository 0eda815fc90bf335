package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newRuntimesCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:   "runtimes",
		Short: "List the server's sandbox runtimes and what each can do",
		Long: `List the runtimes "atoll create --runtime" takes, with their capabilities:
pause (freeze in memory), memory_snapshot (pause --to-disk), memory_fork,
process_oom (a process over the memory limit dies alone), shared_kernel (the
sandbox runs on the host's kernel), network (sandboxes get the server's
networking; without it, loopback only), and emulated (CPU emulation: a vm on a
host without usable KVM, slow and no security boundary). A runtime the server
cannot offer is listed with why.`,
		Example: `  atoll runtimes
  atoll create --runtime gvisor && atoll pause --to-disk ID`,
		Args: cobra.NoArgs,
	}, "print JSON", func(ctx context.Context, c *atoll.Client, _ []string) (api.RuntimeList, error) {
		rts, err := c.Runtimes(ctx)
		return api.RuntimeList{Runtimes: rts}, err
	}, func(w io.Writer, l api.RuntimeList) error { return renderRuntimes(w, l.Runtimes) })
}

func renderRuntimes(w io.Writer, rts []api.Runtime) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tAVAILABLE\tCAPABILITIES")
	for _, rt := range rts {
		name := rt.Name
		if rt.Default {
			name += " (default)"
		}
		if !rt.Available {
			fmt.Fprintf(tw, "%s\tno: %s\t\n", name, rt.Reason)
			continue
		}
		var caps []string
		for _, c := range []struct {
			on   bool
			name string
		}{
			{rt.Capabilities.Pause, "pause"}, {rt.Capabilities.MemorySnapshot, "memory_snapshot"},
			{rt.Capabilities.MemoryFork, "memory_fork"}, {rt.Capabilities.ProcessOOM, "process_oom"},
			{rt.Capabilities.SharedKernel, "shared_kernel"}, {rt.Capabilities.Network, "network"},
			{rt.Capabilities.Emulated, "emulated"},
		} {
			if c.on {
				caps = append(caps, c.name)
			}
		}
		fmt.Fprintf(tw, "%s\tyes\t%s\n", name, strings.Join(caps, " "))
	}
	return tw.Flush()
}
