package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

func newVaultCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vault",
		Short: "Memory vaults: git repositories of Markdown that outlive sandboxes",
		Long: `A memory vault is an agent's long-term memory: a git repository of Markdown
files that belongs to the key's tenant and lives on the server, outside any
sandbox. Clone, pull and push it with the stock git client at the URL that
"vault inspect" prints, giving the API key as the password:

  git clone https://x:$ATOLL_API_KEY@server/git/NAME.git

A push is answered ok only once its objects and refs are durable in the
server's stores; history is append-only (force-pushes and ref deletions are
refused) unless the vault was made with --allow-rewrite and the key is an
admin's. See docs/vault.md.`,
		Example: `  atoll vault create notes --layout agent
  git clone "http://x:$ATOLL_API_KEY@127.0.0.1:7777/git/notes.git"
  atoll vault log notes
  atoll vault show notes index.md@HEAD~1
  atoll vault search notes ada lovelace
  atoll vault links notes entities/ada-lovelace.md
  atoll vault credentials notes --env
  atoll vault set notes --compact daily`,
	}
	cmd.AddCommand(newVaultCreateCmd(g), newVaultListCmd(g), newVaultInspectCmd(g), newVaultRmCmd(g), newVaultLogCmd(g), newVaultShowCmd(g),
		newVaultSearchCmd(g), newVaultLinksCmd(g), newVaultCredentialsCmd(g), newVaultCompactCmd(g), newVaultSetCmd(g))
	return cmd
}

func newVaultCreateCmd(g *globals) *cobra.Command {
	var req api.CreateVaultRequest
	var asJSON bool
	create := &cobra.Command{
		Use:   "create NAME [--layout agent] [--allow-rewrite] [--compact daily|weekly] [--summarizer CMD]",
		Short: "Create a vault and print its git URL",
		Long: `Create a vault: empty, or with --layout agent seeded with entities/,
workflows/, timeline/ and index.md (docs/vault.md explains the layout).
NAME is 1 to 64 characters of [A-Za-z0-9._-], starting with a letter or
digit, without "..". --allow-rewrite lets admin keys force-push and delete
refs; no other key ever may.

--compact daily or weekly has the server compact the vault's timeline on a
schedule, as "atoll vault compact" does, with --summarizer's command if one
is given (see "atoll vault set" and "atoll vault compact").`,
		Example: `  atoll vault create notes
  atoll vault create memory --layout agent --compact daily`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.Name = args[0]
			v, err := c.CreateVault(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), c.VaultGitURL(v.Name))
			return nil
		},
	}
	create.Flags().StringVar(&req.Layout, "layout", "", "seed the vault with a layout: agent")
	create.Flags().BoolVar(&req.AllowRewrite, "allow-rewrite", false, "let admin keys force-push and delete refs")
	create.Flags().StringVar(&req.Compact, "compact", "", "compact the timeline on a schedule: daily or weekly (00:00 UTC; weekly on Mondays)")
	create.Flags().StringVar(&req.Summarizer, "summarizer", "", "the shell command that summarizes its compactions, run in a sandbox of the tenant's")
	create.Flags().BoolVar(&asJSON, "json", false, "print the vault as JSON")
	return create
}

func newVaultListCmd(g *globals) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the tenant's vaults",
		Long: `List the vaults of the key's tenant: each one's name, the commit its main
branch points at, how many refs it holds, the layout it was seeded with and
when it was made.`,
		Example: `  atoll vault ls
  atoll vault ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			vs, err := c.ListVaults(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), vs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHEAD\tREFS\tLAYOUT\tCREATED")
			for _, v := range vs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", v.Name, short(v.Head), len(v.Refs), v.Layout, v.CreatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// short is a commit ID's first 12 digits, or "-" for none.
func short(id string) string {
	if id == "" {
		return "-"
	}
	return id[:min(12, len(id))]
}

func newVaultInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME",
		Short: "Print a vault as JSON, with its refs and git URL",
		Long: `Print a vault's record as JSON: its refs (branches and tags with the
commits they point at), its settings and the URL git clones it from.`,
		Example: `  atoll vault inspect notes
  git clone "$(atoll vault inspect notes | jq -r .git_url)"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.GetVault(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return renderJSON(cmd.OutOrStdout(), struct {
				api.Vault
				GitURL string `json:"git_url"`
			}{v, c.VaultGitURL(v.Name)})
		},
	}
}

func newVaultRmCmd(g *globals) *cobra.Command {
	var force bool
	rm := &cobra.Command{
		Use:   "rm NAME... [--force]",
		Short: "Delete vaults and their history",
		Long: `Delete vaults, their history and their objects. A vault that sandboxes
mount is refused unless --force.`,
		Example: `  atoll vault rm notes
  atoll vault rm --force notes scratch`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteVault(cmd.Context(), name, force); err != nil {
					return err
				}
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "delete even while sandboxes mount it")
	return rm
}

func newVaultLogCmd(g *globals) *cobra.Command {
	var rev string
	var limit int
	var asJSON bool
	log := &cobra.Command{
		Use:   "log NAME [--rev REV] [-n N]",
		Short: "List a vault's commits and failed compactions, newest first",
		Long: `List a vault's commits, newest first: each one's ID, time, author and
subject; and among them, marked "!", the compactions that failed (a
summarizer that exited non-zero or printed nothing, say), which changed
nothing. --json prints the commits and all the vault's events (compactions
made, with nothing to do, or failed).`,
		Example: `  atoll vault log notes
  atoll vault log notes --rev v1 -n 20`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			cs, err := c.VaultLog(cmd.Context(), args[0], rev, limit)
			if err != nil {
				return err
			}
			evs, err := c.VaultEvents(cmd.Context(), args[0], 0)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), struct {
					Commits []api.VaultCommit `json:"commits"`
					Events  []api.VaultEvent  `json:"events"`
				}{cs, evs})
			}
			printLog(cmd.OutOrStdout(), cs, evs)
			return nil
		},
	}
	log.Flags().StringVar(&rev, "rev", "", "start from this branch, tag or commit (default the main branch)")
	log.Flags().IntVarP(&limit, "max-count", "n", 0, "at most N commits (default 100)")
	log.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return log
}

func newVaultShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME PATH[@REV]",
		Short: "Print a file of a vault, at a revision",
		Long: `Print the file at PATH of the vault as of REV (a branch, tag or commit, with
git's ~N and ^; default the main branch), also a file that later commits
removed.`,
		Example: `  atoll vault show notes index.md
  atoll vault show notes timeline/2026/01/05.md@HEAD~3`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			path, rev := args[1], ""
			if i := strings.LastIndex(path, "@"); i >= 0 {
				path, rev = path[:i], path[i+1:]
			}
			r, err := c.ReadVaultFile(cmd.Context(), args[0], path, rev)
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = io.Copy(cmd.OutOrStdout(), r)
			return err
		},
	}
}

// printLog prints commits and, among them by time, the failed events,
// newest first.
func printLog(w io.Writer, cs []api.VaultCommit, evs []api.VaultEvent) {
	var failed []api.VaultEvent
	for _, e := range evs {
		if e.Error != "" {
			failed = append(failed, e)
		}
	}
	for len(cs) > 0 || len(failed) > 0 {
		if len(failed) > 0 && (len(cs) == 0 || !failed[0].Time.Before(cs[0].Time)) {
			e := failed[0]
			failed = failed[1:]
			fmt.Fprintf(w, "! %s %s (%s) failed: %s\n", e.Time.Format("2006-01-02 15:04"), e.Kind, e.Trigger, e.Error)
			continue
		}
		co := cs[0]
		cs = cs[1:]
		fmt.Fprintf(w, "%s %s %s %s\n", short(co.ID), co.Time.Format("2006-01-02 15:04"), co.Author, co.Subject)
	}
}

func newVaultSetCmd(g *globals) *cobra.Command {
	var compact, summarizer string
	var asJSON bool
	set := &cobra.Command{
		Use:   "set NAME [--compact daily|weekly|off] [--summarizer CMD]",
		Short: "Change a vault's compaction schedule and summarizer",
		Long: `Change what is given of a vault's settings, keeping the rest:

  --compact daily    compact the timeline every day at 00:00 UTC
  --compact weekly   every Monday at 00:00 UTC
  --compact off      no scheduled compaction

A schedule turned on or changed makes its first compaction at once (at the
server's next look, within a minute). A scheduled compaction rolls the days
before the current ISO week into their weeks' files and the weeks before
that week's month into their months' files, as "atoll vault compact" does
without dates; one server of a cluster makes it.

--summarizer CMD is the shell command that summarizes the vault's
compactions, scheduled or not (see "atoll vault compact"); "" goes back to
the deterministic summarizer. A compaction that fails shows in "atoll vault
log".`,
		Example: `  atoll vault set notes --compact daily
  atoll vault set notes --summarizer 'python3 /opt/summarize.py'
  atoll vault set notes --compact off --summarizer ''`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var u api.VaultUpdate
			if cmd.Flags().Changed("compact") {
				u.Compact = &compact
			}
			if cmd.Flags().Changed("summarizer") {
				u.Summarizer = &summarizer
			}
			if u.Compact == nil && u.Summarizer == nil {
				return fmt.Errorf("nothing to set: give --compact or --summarizer")
			}
			v, err := c.UpdateVault(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), v)
			}
			w := cmd.OutOrStdout()
			if v.Compact == "" {
				fmt.Fprintln(w, "compact: off")
			} else {
				fmt.Fprintf(w, "compact: %s, next %s\n", v.Compact, v.NextCompaction.Format(time.RFC3339))
			}
			if v.Summarizer == "" {
				fmt.Fprintln(w, "summarizer: deterministic")
			} else {
				fmt.Fprintf(w, "summarizer: %s\n", v.Summarizer)
			}
			return nil
		},
	}
	set.Flags().StringVar(&compact, "compact", "", "the compaction schedule: daily, weekly or off")
	set.Flags().StringVar(&summarizer, "summarizer", "", "the shell command that summarizes its compactions; '' for the deterministic one")
	set.Flags().BoolVar(&asJSON, "json", false, "print the vault as JSON")
	return set
}
