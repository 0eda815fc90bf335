package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// request makes one call to the server for cmd, with g's client.
func request[T any](g *globals, cmd *cobra.Command, do func(ctx context.Context, c *atoll.Client) (T, error)) (T, error) {
	c, err := g.client()
	if err != nil {
		var zero T
		return zero, err
	}
	return do(cmd.Context(), c)
}

// printKey makes one call to the server for cmd and prints the key of what
// it answers (an ID or a name), as the commands that make one thing do.
func printKey[T any](g *globals, cmd *cobra.Command, do func(ctx context.Context, c *atoll.Client) (T, error), key func(T) string) error {
	v, err := request(g, cmd, do)
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), key(v))
	return nil
}

// untilError runs op on each of args in turn, for the admin's commands
// (key rm, node cordon), stopping at the first error and returning it.
func untilError(g *globals, cmd *cobra.Command, args []string, op func(c *atoll.Client, ctx context.Context, arg string) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	for _, a := range args {
		if err := op(c, cmd.Context(), a); err != nil {
			return err
		}
	}
	return nil
}

// show runs a command that reads one value from the server and prints it:
// as JSON with --json (asJSON), drawn for people by draw otherwise. The
// commands that print one thing (inspect, placement, network, runtimes, key
// ls, node ls) go through it, so that --json means the same in each.
func show[T any](g *globals, cmd *cobra.Command, asJSON bool, get func(ctx context.Context, c *atoll.Client) (T, error), draw func(w io.Writer, v T) error) error {
	v, err := request(g, cmd, get)
	if err != nil {
		return err
	}
	if asJSON {
		return renderJSON(cmd.OutOrStdout(), v)
	}
	return draw(cmd.OutOrStdout(), v)
}

// showCmd is cmd, given its help and arguments, showing what get answers
// for its arguments through show; usage is its --json flag's.
func showCmd[T any](g *globals, cmd *cobra.Command, usage string, get func(ctx context.Context, c *atoll.Client, args []string) (T, error), draw func(w io.Writer, v T) error) *cobra.Command {
	var asJSON bool
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return show(g, cmd, asJSON, func(ctx context.Context, c *atoll.Client) (T, error) { return get(ctx, c, args) }, draw)
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, usage)
	return cmd
}

// byID is get for a showCmd of one argument, an ID or a name.
func byID[T any](get func(c *atoll.Client, ctx context.Context, id string) (T, error)) func(context.Context, *atoll.Client, []string) (T, error) {
	return func(ctx context.Context, c *atoll.Client, args []string) (T, error) { return get(c, ctx, args[0]) }
}

// listing is how an "ls" command prints its items, in order if it is not
// nil (else as the server lists them): with --json as the API's list
// object (json wraps them, never a null list), with --quiet the key of
// each (an ID or name) a line, and as a table drawn by table otherwise.
type listing[T any] struct {
	json  func([]T) any
	key   func(T) string
	table func(io.Writer, []T, time.Time) error
	order func(a, b T) int
}

// show gets the items from the server with get and prints them.
func (l listing[T]) show(g *globals, cmd *cobra.Command, asJSON, quiet bool, get func(ctx context.Context, c *atoll.Client) ([]T, error)) error {
	items, err := request(g, cmd, get)
	if err != nil {
		return err
	}
	if l.order != nil {
		slices.SortFunc(items, l.order)
	}
	return l.print(cmd.OutOrStdout(), items, asJSON, quiet)
}

// print prints items on w as the flags asJSON and quiet ask.
func (l listing[T]) print(w io.Writer, items []T, asJSON, quiet bool) error {
	switch {
	case asJSON:
		if items == nil {
			items = []T{}
		}
		return renderJSON(w, l.json(items))
	case quiet:
		for _, it := range items {
			fmt.Fprintln(w, l.key(it))
		}
		return nil
	}
	return l.table(w, items, time.Now())
}

// command is cmd, an "ls" given its help and arguments, listing what get
// answers for its arguments; --quiet prints what (IDs or names) alone.
func (l listing[T]) command(g *globals, cmd *cobra.Command, what string, get func(ctx context.Context, c *atoll.Client, args []string) ([]T, error)) *cobra.Command {
	var asJSON, quiet bool
	cmd.Aliases = []string{"list"}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return l.show(g, cmd, asJSON, quiet, func(ctx context.Context, c *atoll.Client) ([]T, error) { return get(ctx, c, args) })
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print "+what+" only")
	return cmd
}
