package main

import (
	"fmt"
	"io"
	"sort"

	"github.com/atoll-dev/atoll/api"
	"github.com/spf13/cobra"
)

// `atoll vault compact`: roll old daily timeline files into week files,
// old week files into month files.

func newVaultCompactCmd(g *globals) *cobra.Command {
	var req api.VaultCompactRequest
	var asJSON bool
	compact := &cobra.Command{
		Use:   "compact NAME [--before DATE] [--weeks-before DATE] [--summarizer CMD]",
		Short: "Roll a vault's old daily timeline files into week files, old weeks into months",
		Long: `Summarize the daily timeline files (timeline/YYYY/MM/DD.md) of the days before
DATE into their ISO week's file, timeline/weekly/YYYY-Www.md, a "## YYYY-MM-DD"
section a day, and the week files of the weeks that ended before
--weeks-before into their month's file, timeline/monthly/YYYY-MM.md, a
"## YYYY-Www" section a week (a week's month is its Thursday's). What was
rolled up is removed from the tip in the same commit. It stays in the
history: atoll vault show NAME PATH@REV reads it, and [[links]] to a
rolled-up day or week resolve to the week's or month's file. The commit
message lists what was rolled up. With nothing to roll up, no commit is made.

The default summary needs no model: of each entry of a day (a heading and
what follows it) it keeps the heading, the first sentence, the [[links]] and
the #tags, and counts the entries and links; a week goes into its month
whole, its headings one level down.

--summarizer CMD (or the vault's, "atoll vault set --summarizer") runs the
shell command CMD in a sandbox of the tenant's, made for the compaction and
deleted after it, once for each file rolled up: the file on stdin, and
ATOLL_ROLLUP_KIND (day or week), ATOLL_ROLLUP_PATH, ATOLL_ROLLUP_INTO and
ATOLL_ROLLUP_SECTION in its environment. What it prints is the file's
section. A command that exits non-zero or prints nothing fails the
compaction, which commits nothing; "atoll vault log" shows why.

The commit is stored as a push is; a push that lands meanwhile is kept, and
the compaction is made again on it.

Without --before, the days before the current ISO week (UTC) are rolled up;
without --weeks-before, the weeks that ended before the first day of
--before's month.`,
		Example: `  atoll vault compact notes
  atoll vault compact notes --before 2026-11-01 --weeks-before 2026-10-01
  atoll vault compact notes --summarizer 'llm -s "Summarize these notes, keep [[links]]"'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.CompactVault(cmd.Context(), args[0], req)
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
			printRollups(w, res.Weeks, "days")
			printRollups(w, res.Months, "weeks")
			fmt.Fprintf(w, "commit %s\n", res.Commit)
			return nil
		},
	}
	compact.Flags().StringVar(&req.Before, "before", "", "roll up the days before DATE, YYYY-MM-DD (default: the current ISO week's Monday)")
	compact.Flags().StringVar(&req.WeeksBefore, "weeks-before", "", "roll up the weeks that ended before DATE into months, YYYY-MM-DD (default: the first day of --before's month)")
	compact.Flags().StringVar(&req.Summarizer, "summarizer", "", "a shell command that summarizes each file rolled up, run in a sandbox (default: the vault's, else deterministic)")
	compact.Flags().BoolVar(&asJSON, "json", false, "print JSON, with the files rolled into each week and month")
	return compact
}

// printRollups prints, by file rolled into, how many of what went in.
func printRollups(w io.Writer, into map[string][]string, what string) {
	files := make([]string, 0, len(into))
	for f := range into {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		fmt.Fprintf(w, "%s: %d %s\n", f, len(into[f]), what)
	}
}
