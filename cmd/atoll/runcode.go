package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newRunCodeCmd(g *globals) *cobra.Command {
	var opts atoll.RunCodeOptions
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "run-code ID [--context C | --language L] FILE|-",
		Short: "Run code in a sandbox's code interpreter, keeping its state",
		Long: `Run the code in FILE (- for standard input) in a code context of a sandbox made
from the code-interpreter template (docs/code-interpreter.md). A context keeps
its variables, imports and working directory between runs; atoll code-context
create makes one. Without --context the code runs in the default context of
--language (python, bash, javascript or typescript).

Its output streams to standard output and standard error; then the value of its
last expression, if any, is printed. Other results (plots, tables) are printed
as text; --json prints every event of the execution as a JSON line instead,
images and all. An exception's traceback goes to standard error and the exit
status is 1. --timeout interrupts the code; the context stays usable (exit
status 124).`,
		Example: `  atoll create --template code-interpreter
  echo 'x = 41' | atoll run-code 3k9x2m7q1w8e5r4t6y0u -
  echo 'x + 1' | atoll run-code 3k9x2m7q1w8e5r4t6y0u -
  atoll run-code 3k9x2m7q1w8e5r4t6y0u --language bash setup.sh
  atoll run-code 3k9x2m7q1w8e5r4t6y0u --json plot.py > events.ndjson`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Context != "" && opts.Language != "" {
				return errors.New("--context and --language exclude each other")
			}
			if timeout < 0 {
				return errors.New("--timeout must not be negative")
			}
			code, err := readCode(cmd.InOrStdin(), args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			enc := json.NewEncoder(stdout)
			if asJSON {
				emit := func(ev api.CodeEvent) { enc.Encode(ev) }
				opts.OnStdout = func(s string) { emit(api.CodeEvent{Type: api.CodeStdout, Text: s}) }
				opts.OnStderr = func(s string) { emit(api.CodeEvent{Type: api.CodeStderr, Text: s}) }
				opts.OnResult = emit
				opts.OnError = func(e atoll.ExecutionError) {
					emit(api.CodeEvent{Type: api.CodeError, Name: e.Name, Value: e.Value, Traceback: e.Traceback})
				}
			} else {
				opts.OnStdout = func(s string) { io.WriteString(stdout, s) }
				opts.OnStderr = func(s string) { io.WriteString(stderr, s) }
			}
			ex, err := c.RunCode(ctx, args[0], code, opts)
			if errors.Is(err, context.DeadlineExceeded) && timeout > 0 {
				fmt.Fprintf(stderr, "atoll: the code was interrupted after %v\n", timeout)
				return exitError{124}
			}
			if err != nil {
				return err
			}
			if !asJSON {
				for _, r := range ex.Results {
					printResult(stdout, r)
				}
			}
			if ex.Error != nil {
				if !asJSON {
					if ex.Error.Traceback != "" {
						fmt.Fprintln(stderr, ex.Error.Traceback)
					} else {
						fmt.Fprintf(stderr, "%s: %s\n", ex.Error.Name, ex.Error.Value)
					}
				}
				return exitError{1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Context, "context", "", "ID of the code context to run in (default: the language's default context)")
	f.StringVar(&opts.Language, "language", "", "language whose default context runs the code: python, bash, javascript (js) or typescript (ts) (default python)")
	f.DurationVar(&timeout, "timeout", 0, "interrupt the code after this long, e.g. 30s (default none)")
	f.BoolVar(&asJSON, "json", false, "print the execution's events as JSON lines")
	return cmd
}

// readCode reads the code from file, or from stdin for "-".
func readCode(stdin io.Reader, file string) (string, error) {
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	return string(b), err
}

// printResult prints a result as text: its text/plain, or the formats it
// has when it has none.
func printResult(w io.Writer, r api.CodeEvent) {
	if r.Text != "" {
		fmt.Fprintln(w, r.Text)
		return
	}
	var formats []string
	for _, f := range []struct{ name, v string }{{"html", r.HTML}, {"markdown", r.Markdown}, {"svg", r.SVG}, {"png", r.PNG},
		{"jpeg", r.JPEG}, {"pdf", r.PDF}, {"latex", r.LaTeX}, {"json", string(r.JSON)}} {
		if f.v != "" {
			formats = append(formats, f.name)
		}
	}
	if len(formats) > 0 {
		fmt.Fprintf(w, "[result: %v; --json shows it]\n", formats)
	}
}
