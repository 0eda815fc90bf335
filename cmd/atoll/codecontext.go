package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

// newCodeContextCmd is atoll code-context: the code contexts of a
// code-interpreter sandbox, which run-code --context runs in.
func newCodeContextCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "code-context",
		Short: "Make, list, restart and remove a sandbox's code contexts",
		Long: `Manage the code contexts of a sandbox made from the code-interpreter template
(docs/code-interpreter.md). A context is one kernel: its variables, imports and
working directory last between the runs of atoll run-code --context C, apart
from every other context. Restarting a context forgets its state; removing it
stops its kernel.`,
		Example: `  ctx=$(atoll code-context create $id --cwd /tmp)
  echo 'x = 41' | atoll run-code $id --context $ctx -
  echo 'x + 1' | atoll run-code $id --context $ctx -
  atoll code-context ls $id
  atoll code-context restart $id $ctx
  atoll code-context rm $id $ctx`,
	}

	var req api.CreateCodeContextRequest
	var createJSON bool
	create := &cobra.Command{
		Use:   "create ID [--language L] [--cwd DIR] [--json]",
		Short: "Make a code context and print its ID",
		Long: `Make a code context in the sandbox: a new kernel of --language (python,
bash, javascript or typescript; default python) whose working directory starts at --cwd (default the
user's home). Its ID is printed, for run-code --context.`,
		Example: `  atoll code-context create $id
  atoll code-context create $id --language bash --cwd /work`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			cc, err := c.CreateCodeContext(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if createJSON {
				return renderJSON(cmd.OutOrStdout(), cc)
			}
			fmt.Fprintln(cmd.OutOrStdout(), cc.ID)
			return nil
		},
	}
	create.Flags().StringVar(&req.Language, "language", "", "the context's language: python, bash, javascript (js) or typescript (ts) (default python)")
	create.Flags().StringVar(&req.Cwd, "cwd", "", "its working directory (default the user's home)")
	create.Flags().BoolVar(&createJSON, "json", false, "print the context as JSON")

	var lsJSON bool
	ls := &cobra.Command{
		Use:     "ls ID [--json]",
		Short:   "List a sandbox's code contexts",
		Long:    `List the code contexts of the sandbox, the languages' default contexts among them, with each one's language and first working directory.`,
		Example: `  atoll code-context ls $id`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			cs, err := c.ListCodeContexts(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if lsJSON {
				return renderJSON(cmd.OutOrStdout(), cs)
			}
			return renderCodeContexts(cmd.OutOrStdout(), cs)
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")

	restart := &cobra.Command{
		Use:     "restart ID CONTEXT",
		Short:   "Restart a code context's kernel, forgetting its state",
		Long:    `Restart the kernel of the code context: its variables and imports are lost, its working directory is --cwd's again. Its ID stays.`,
		Example: `  atoll code-context restart $id $ctx`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.RestartCodeContext(cmd.Context(), args[0], args[1])
		},
	}
	rm := &cobra.Command{
		Use:     "rm ID CONTEXT",
		Short:   "Remove a code context",
		Long:    `Remove the code context and stop its kernel. A language's default context, removed, starts afresh at its next run.`,
		Example: `  atoll code-context rm $id $ctx`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.RemoveCodeContext(cmd.Context(), args[0], args[1])
		},
	}
	cmd.AddCommand(create, ls, restart, rm)
	return cmd
}

func renderCodeContexts(w io.Writer, cs []api.CodeContext) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.ID, c.Language, c.Cwd)
	}
	return tw.Flush()
}
