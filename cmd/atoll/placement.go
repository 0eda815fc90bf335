package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newPlacementCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:   "placement ID",
		Short: "Show how the cluster chose a sandbox's node",
		Long: `Show a sandbox's placement record: the nodes the scheduler considered, best
first, with their scores and the score's parts, why the chosen node won, and
the nodes it filtered out (named with why if the create asked --explain,
counted by filter otherwise). A single machine places nothing.`,
		Example: `  atoll placement 3k9x2m7q1w8e5r4t6y0u`,
		Args:    cobra.ExactArgs(1),
	}, "print the record as JSON", byID((*atoll.Client).GetPlacement), func(w io.Writer, p api.Placement) error {
		renderPlacement(w, p)
		return nil
	})
}

// renderExplain prints how the sandbox a create answered was placed.
func renderExplain(w io.Writer, sb api.Sandbox) {
	switch {
	case sb.Node == "":
		fmt.Fprintln(w, "single machine: one node runs every sandbox; nothing to choose")
	case sb.Placement == nil:
		fmt.Fprintf(w, "not placed by the scheduler: node %s had a warm sandbox ready (or it was made from a snapshot, which stays on its node)\n", sb.Node)
	default:
		renderPlacement(w, *sb.Placement)
	}
}

// renderPlacement prints a placement record: the candidates as a table of
// scores and parts, why the chosen one won, the nodes filtered out.
func renderPlacement(w io.Writer, p api.Placement) {
	excluded := 0
	for _, n := range p.Excluded {
		excluded += n
	}
	fmt.Fprintf(w, "placed on %s: %d nodes, %d candidates, %d filtered out\n", p.Node, p.Passed+excluded, p.Passed, excluded)
	if p.Warm {
		fmt.Fprintf(w, "warm: a sandbox of the template waiting on %s, reserved with the placement\n", p.Node)
	}
	if len(p.Selector) > 0 {
		fmt.Fprintf(w, "node selector: %s\n", selectorString(p.Selector))
	}
	if p.Spread != "" {
		fmt.Fprintf(w, "spread over: %s\n", p.Spread)
	}
	terms := partTerms(p.Candidates)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\tNODE\tSCORE\t%s\t\n", strings.ToUpper(strings.Join(terms, "\t")))
	for _, c := range p.Candidates {
		mark := " "
		if c.Node == p.Node {
			mark = "*"
		}
		var cells []string
		for _, t := range terms {
			cells = append(cells, partCell(c, t))
		}
		note := ""
		switch {
		case c.Drawn:
			note = "drawn"
		case c.Window:
			note = "window"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, c.Node, num(c.Score), strings.Join(cells, "\t"), note)
	}
	tw.Flush()
	if more := p.Passed - len(p.Candidates); more > 0 {
		fmt.Fprintf(w, "  (%d more candidates not listed)\n", more)
	}
	fmt.Fprintln(w, whyWon(p))
	if len(p.Filtered) > 0 {
		fmt.Fprintln(w, "filtered out:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, f := range p.Filtered {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Node, f.Filter, f.Reason)
		}
		tw.Flush()
	} else if excluded > 0 {
		var by []string
		for k, n := range p.Excluded {
			by = append(by, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(by)
		fmt.Fprintf(w, "filtered out: %s (create with --explain to name them)\n", strings.Join(by, ", "))
	}
}

// whyWon says why p.Node was chosen over the others.
func whyWon(p api.Placement) string {
	var won *api.PlacementCandidate
	for i := range p.Candidates {
		if p.Candidates[i].Node == p.Node {
			won = &p.Candidates[i]
			break
		}
	}
	var why []string
	if len(p.Refused) > 0 {
		why = append(why, "full by the time the placement reached it: "+strings.Join(p.Refused, ", "))
	}
	switch {
	case won == nil:
		why = append(why, p.Node+" won")
	case len(p.Candidates) == 1:
		why = append(why, p.Node+" won: the only node that could take it")
	case won.Drawn:
		why = append(why, fmt.Sprintf("%s won the draw between the two drawn among the nodes scoring within 0.1 of the best (%s): "+
			"nearly equal nodes are drawn, so that API nodes placing at once spread their sandboxes", p.Node, num(p.Candidates[0].Score)))
	default:
		// The runner-up, and the part that differs most.
		var next *api.PlacementCandidate
		for i := range p.Candidates {
			if p.Candidates[i].Node != p.Node {
				next = &p.Candidates[i]
				break
			}
		}
		s := fmt.Sprintf("%s won: the highest score, %s against %s's %s", p.Node, num(won.Score), next.Node, num(next.Score))
		if t, d := mostApart(*won, *next); t != "" {
			s += fmt.Sprintf(", most of it from %s (%+.2f)", t, d)
		}
		why = append(why, s)
	}
	return strings.Join(why, "; ")
}

// mostApart is the term of a's score that is most ahead of b's.
func mostApart(a, b api.PlacementCandidate) (string, float64) {
	var term string
	var diff float64
	for _, pa := range a.Parts {
		for _, pb := range b.Parts {
			if d := pa.Weighted - pb.Weighted; pa.Term == pb.Term && d > diff {
				term, diff = pa.Term, d
			}
		}
	}
	return term, diff
}

// partTerms are the terms of the candidates' scores, in their order.
func partTerms(cs []api.PlacementCandidate) []string {
	var terms []string
	for _, c := range cs {
		for _, p := range c.Parts {
			found := false
			for _, t := range terms {
				found = found || t == p.Term
			}
			if !found {
				terms = append(terms, p.Term)
			}
		}
	}
	return terms
}

// partCell is c's weighted share of term t, and its value if that differs.
func partCell(c api.PlacementCandidate, t string) string {
	for _, p := range c.Parts {
		if p.Term == t {
			if p.Weighted == p.Value {
				return num(p.Weighted)
			}
			return num(p.Weighted) + " (" + num(p.Value) + ")"
		}
	}
	return "-"
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }

// selectorString is sel as "k=v,k=v", by key.
func selectorString(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + sel[k]
	}
	return strings.Join(keys, ",")
}
