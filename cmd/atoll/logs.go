package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newLogsCmd(g *globals) *cobra.Command {
	var opts atoll.LogOptions
	var timestamps bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Show what a sandbox's start command and background processes print",
		Long: `Show the lines a sandbox's start command and its background processes
(atoll exec -d, E2B's background commands) printed, as its agent keeps them:
the newest MiB. Their stdout goes to yours, their stderr to yours. With
-f, go on printing new lines until interrupted. The sandbox must be running.`,
		Example: `  atoll logs 3k9x2m7q1w8e5r4t6y0u
  atoll logs -f --timestamps 3k9x2m7q1w8e5r4t6y0u`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Logs(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Next() {
				e := s.Event()
				w := cmd.OutOrStdout()
				if e.Stream == api.EventStderr {
					w = cmd.ErrOrStderr()
				}
				if timestamps {
					fmt.Fprintf(w, "%s %s\n", e.Time.UTC().Format(time.RFC3339Nano), e.Line)
				} else {
					fmt.Fprintln(w, e.Line)
				}
			}
			if err := s.Err(); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&opts.Follow, "follow", "f", false, "keep printing new lines")
	f.BoolVarP(&timestamps, "timestamps", "t", false, "begin each line with when it was printed")
	f.Int64Var(&opts.Since, "since", 0, "only the lines after this seq (a line's number, as GET .../logs gives it)")
	return cmd
}

func newTopCmd(g *globals) *cobra.Command {
	var interval time.Duration
	var once bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show running sandboxes' CPU, memory, disk and network, live",
		Long: `Show each running sandbox's latest sample: CPU as a share of its limit,
memory and disk used of its limits, and the bytes its network received and
sent since it started. Samples are taken every --metrics-interval of the
server (5s by default). The table is redrawn every --interval until
interrupted; --once prints it once.`,
		Example: `  atoll top
  atoll top --once`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if interval <= 0 {
				return errors.New("--interval must be positive")
			}
			out := cmd.OutOrStdout()
			tty := false
			if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				tty = true
			}
			for {
				rows, err := topRows(cmd.Context(), c)
				if err != nil {
					return err
				}
				if tty && !once {
					fmt.Fprint(out, "\033[H\033[2J") // home, clear
				}
				if err := renderTop(out, rows); err != nil {
					return err
				}
				if once {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often to redraw")
	cmd.Flags().BoolVar(&once, "once", false, "print the table once and exit")
	return cmd
}

// topRow is a running sandbox with its latest sample, if it has one yet.
type topRow struct {
	sb  api.Sandbox
	m   api.Metric
	has bool
}

// topRows reads the running sandboxes and each one's newest sample.
func topRows(ctx context.Context, c *atoll.Client) ([]topRow, error) {
	sbs, err := c.ListSandboxes(ctx, atoll.ListOptions{State: api.StateRunning})
	if err != nil {
		return nil, err
	}
	rows := make([]topRow, len(sbs))
	since := time.Now().Add(-time.Minute)
	for i, sb := range sbs {
		rows[i].sb = sb
		ms, err := c.Metrics(ctx, sb.ID, since, time.Time{})
		if err != nil {
			continue // stopped or deleted meanwhile
		}
		if len(ms) > 0 {
			rows[i].m, rows[i].has = ms[len(ms)-1], true
		}
	}
	// The busiest first, as top does.
	slices.SortStableFunc(rows, func(a, b topRow) int {
		switch {
		case a.m.CPUUsedPct > b.m.CPUUsedPct:
			return -1
		case a.m.CPUUsedPct < b.m.CPUUsedPct:
			return 1
		}
		return 0
	})
	return rows, nil
}

func renderTop(w io.Writer, rows []topRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEMPLATE\tRUNTIME\tCPU %\tMEMORY\tDISK\tNET RX\tNET TX")
	for _, r := range rows {
		if !r.has {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\n", r.sb.ID, r.sb.Template, r.sb.Runtime)
			continue
		}
		m := r.m
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s / %s\t%s / %s\t%s\t%s\n", r.sb.ID, r.sb.Template, r.sb.Runtime, m.CPUUsedPct,
			formatBytes(m.MemoryUsedBytes), formatBytes(m.MemoryTotalBytes), formatBytes(m.DiskUsedBytes), formatBytes(m.DiskTotalBytes),
			formatBytes(m.NetworkRxBytes), formatBytes(m.NetworkTxBytes))
	}
	return tw.Flush()
}
