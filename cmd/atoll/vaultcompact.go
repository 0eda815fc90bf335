package main

import (
	"fmt"
	"sort"

	"github.com/atoll-dev/atoll/api"
	"github.com/spf13/cobra"
)

// `atoll vault compact`: roll old daily timeline files into week files.

func newVaultCompactCmd(g *globals) *cobra.Command {
	var before string
	var asJSON bool
	compact := &cobra.Command{
		Use:   "compact NAME [--before DATE]",
		Short: "Roll a vault's old daily timeline files into week files",
		Long: `Summarize the daily timeline files (timeline/YYYY/MM/DD.md) of the days before
DATE into their ISO week's file, timeline/weekly/YYYY-Www.md, a "## YYYY-MM-DD"
section a day, and remove them from the tip in the same commit. They stay in
the history: atoll vault show NAME PATH@REV reads them, and [[links]] to a
rolled-up day resolve to its week's file. The commit message lists what was
rolled up. With nothing to roll up, no commit is made.

The summary needs no model: of each entry of a day (a heading and what
follows it) it keeps the heading, the first sentence, the [[links]] and the
#tags, and counts the entries and links. The commit is stored as a push is;
a push that lands meanwhile is kept, and the compaction is made again on it.

Without --before, the days before the current ISO week (UTC) are rolled up.`,
		Example: `  atoll vault compact notes
  atoll vault compact notes --before 2026-11-01`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.CompactVault(cmd.Context(), args[0], api.VaultCompactRequest{Before: before})
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			if res.Commit == "" {
				fmt.Fprintln(w, "nothing to compact")
				return nil
			}
			weeks := make([]string, 0, len(res.Weeks))
			for wk := range res.Weeks {
				weeks = append(weeks, wk)
			}
			sort.Strings(weeks)
			for _, wk := range weeks {
				fmt.Fprintf(w, "%s: %d days\n", wk, len(res.Weeks[wk]))
			}
			fmt.Fprintf(w, "commit %s\n", res.Commit)
			return nil
		},
	}
	compact.Flags().StringVar(&before, "before", "", "roll up the days before DATE, YYYY-MM-DD (default: the current ISO week's Monday)")
	compact.Flags().BoolVar(&asJSON, "json", false, "print JSON, with the day files of each week")
	return compact
}
