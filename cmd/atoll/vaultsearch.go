package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// The index of a vault: `atoll vault search` and `atoll vault links`.

func newVaultSearchCmd(g *globals) *cobra.Command {
	var limit int
	var asJSON bool
	search := &cobra.Command{
		Use:   "search NAME QUERY... [-n N]",
		Short: "Search the notes of a vault, best first",
		Long: `Search the Markdown notes of the vault's main branch, as of its latest push,
and print the best matches: score, path, title, and a passage with the matches
marked **like this**. QUERY's words are joined by spaces; the syntax is
SQLite FTS5's: words (stemmed: "engines" finds "engine"), "exact phrases",
prefix*, AND, OR, NOT, NEAR(a b), title:word. A query that does not parse is
refused; put a word in double quotes to match it as it is.`,
		Example: `  atoll vault search notes ada lovelace
  atoll vault search notes 'title:ada OR "analytical engine"' -n 5`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.SearchVault(cmd.Context(), args[0], strings.Join(args[1:], " "), limit)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			for _, h := range res.Hits {
				fmt.Fprintf(w, "%6.2f  %s  %s\n", h.Score, h.Path, h.Title)
				fmt.Fprintf(w, "        %s\n", strings.Join(strings.Fields(h.Snippet), " "))
			}
			return nil
		},
	}
	search.Flags().IntVarP(&limit, "limit", "n", 0, "at most N notes (default 20, at most 200)")
	search.Flags().BoolVar(&asJSON, "json", false, "print JSON, with each note's frontmatter fields")
	return search
}

func newVaultLinksCmd(g *globals) *cobra.Command {
	var asJSON bool
	links := &cobra.Command{
		Use:   "links NAME [PATH]",
		Short: "Print a note's links and backlinks, or a vault's broken links",
		Long: `With PATH, print the note's title and frontmatter fields, its [[links]] with
what each resolves to, and the notes that link to it (backlinks). Without,
print every broken link of the vault: links that resolve to no note.

[[X]] resolves to the note at path X or X.md, else to the note titled X
(frontmatter title, else its file name without .md), ignoring case.`,
		Example: `  atoll vault links notes entities/ada-lovelace.md
  atoll vault links notes`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			path := ""
			if len(args) == 2 {
				path = args[1]
			}
			res, err := c.VaultLinks(cmd.Context(), args[0], path)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			if res.Note == nil {
				for _, l := range res.Broken {
					fmt.Fprintf(w, "%s: [[%s]]\n", l.From, l.Target)
				}
				return nil
			}
			n := res.Note
			fmt.Fprintf(w, "%s: %s\n", n.Path, n.Title)
			if n.Type != "" {
				fmt.Fprintf(w, "type: %s\n", n.Type)
			}
			if len(n.Tags) > 0 {
				fmt.Fprintf(w, "tags: %s\n", strings.Join(n.Tags, ", "))
			}
			if n.Updated != "" {
				fmt.Fprintf(w, "updated: %s\n", n.Updated)
			}
			fmt.Fprintf(w, "links:\n")
			for _, l := range res.Links {
				to := l.To
				if to == "" {
					to = "(broken)"
				}
				fmt.Fprintf(w, "  [[%s]] -> %s\n", l.Target, to)
			}
			fmt.Fprintf(w, "backlinks:\n")
			for _, l := range res.Backlinks {
				fmt.Fprintf(w, "  %s [[%s]]\n", l.From, l.Target)
			}
			return nil
		},
	}
	links.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return links
}
