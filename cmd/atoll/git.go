package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// gitPasswordEnv is where the git commands read a password or token: an
// environment variable, not a flag, so that it shows in no process list.
const gitPasswordEnv = "ATOLL_GIT_PASSWORD"

func newGitCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "git",
		Short: "Run git on a repository inside a sandbox",
		Long: `Run the sandbox's own git on a repository in it: clone, status, branches,
checkout, add, commit, push, pull. PATH is the repository's directory in
the sandbox, relative to the user's home or absolute.

Credentials for clone, push and pull come from $` + gitPasswordEnv + ` (a
password or token) and --username: git gets them through a credential
helper on its command line for that one call, so they are never written
into the sandbox (the clone's origin is the URL without them). A URL with
user:password@ in it is split the same way.`,
		Example: `  ATOLL_GIT_PASSWORD=$GITHUB_TOKEN atoll git clone $id https://github.com/org/repo.git repo
  atoll git status $id repo
  atoll git checkout $id repo feature -b
  atoll git add $id repo
  atoll git commit $id repo -m "Fix the parser" --author-name Agent --author-email agent@example.com
  ATOLL_GIT_PASSWORD=$GITHUB_TOKEN atoll git push $id repo --set-upstream --branch feature`,
	}
	cmd.PersistentFlags().StringVar(&user, "user", "", `run git as this user of the sandbox ("user" or "root"; default: exec's)`)
	gitOf := func(id string) (*atoll.Git, error) {
		c, err := g.client()
		if err != nil {
			return nil, err
		}
		gt := c.Git(id)
		gt.User = user
		return gt, nil
	}
	// run builds a subcommand that opens the sandbox's git and calls f.
	run := func(c *cobra.Command, nargs int, f func(ctx context.Context, gt *atoll.Git, args []string, out io.Writer) error) *cobra.Command {
		c.Args = cobra.ExactArgs(nargs)
		c.RunE = func(cmd *cobra.Command, args []string) error {
			gt, err := gitOf(args[0])
			if err != nil {
				return err
			}
			return f(cmd.Context(), gt, args[1:], cmd.OutOrStdout())
		}
		return c
	}

	var branch, username string
	var depth int
	clone := run(&cobra.Command{
		Use:   "clone ID URL PATH [--branch B] [--depth N] [--username U]",
		Short: "Clone a repository into a sandbox",
		Long: `Clone URL into PATH in the sandbox, with the password or token in $` + gitPasswordEnv + `
if the host asks for one.`,
		Example: `  atoll git clone $id https://github.com/org/repo.git repo --depth 1
  ATOLL_GIT_PASSWORD=$TOKEN atoll git clone $id https://git.example.com/team/app.git app --branch dev`,
	}, 3, func(ctx context.Context, gt *atoll.Git, args []string, _ io.Writer) error {
		return gt.Clone(ctx, args[0], args[1], atoll.GitCloneOptions{Branch: branch, Depth: depth, Auth: gitAuth(username)})
	})
	clone.Flags().StringVar(&branch, "branch", "", "check out this branch or tag")
	clone.Flags().IntVar(&depth, "depth", 0, "a shallow clone of this many commits")
	clone.Flags().StringVar(&username, "username", "", "the username sent with $"+gitPasswordEnv+` (default "git")`)

	var asJSON bool
	status := run(&cobra.Command{
		Use:     "status ID PATH [--json]",
		Short:   "Show a repository's branch and changed files",
		Long:    `Show the current branch, its upstream and how far ahead and behind it is, and each changed, staged or untracked file with git's two status letters (index, work tree).`,
		Example: `  atoll git status $id repo`,
	}, 2, func(ctx context.Context, gt *atoll.Git, args []string, out io.Writer) error {
		s, err := gt.Status(ctx, args[0])
		if err != nil {
			return err
		}
		if asJSON {
			return renderJSON(out, s)
		}
		head := s.Branch
		if s.Detached {
			head = "(detached)"
		}
		if s.Upstream != "" {
			head += fmt.Sprintf(" ... %s [ahead %d, behind %d]", s.Upstream, s.Ahead, s.Behind)
		}
		fmt.Fprintln(out, "## "+head)
		for _, f := range s.Files {
			line := f.Index + f.Worktree + " " + f.Path
			if f.OrigPath != "" {
				line += " <- " + f.OrigPath
			}
			fmt.Fprintln(out, line)
		}
		return nil
	})
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	branches := run(&cobra.Command{
		Use:     "branches ID PATH",
		Short:   "List a repository's local branches",
		Long:    `List the local branches of the repository at PATH, the current one marked with *.`,
		Example: `  atoll git branches $id repo`,
	}, 2, func(ctx context.Context, gt *atoll.Git, args []string, out io.Writer) error {
		b, err := gt.Branches(ctx, args[0])
		if err != nil {
			return err
		}
		for _, name := range b.Branches {
			mark := "  "
			if name == b.Current {
				mark = "* "
			}
			fmt.Fprintln(out, mark+name)
		}
		return nil
	})

	var create bool
	checkout := run(&cobra.Command{
		Use:     "checkout ID PATH BRANCH [-b]",
		Short:   "Switch a repository to a branch",
		Long:    `Switch the repository at PATH to BRANCH; with -b, make the branch first at the current commit.`,
		Example: `  atoll git checkout $id repo feature -b`,
	}, 3, func(ctx context.Context, gt *atoll.Git, args []string, _ io.Writer) error {
		return gt.Checkout(ctx, args[0], args[1], create)
	})
	checkout.Flags().BoolVarP(&create, "create", "b", false, "make the branch first")

	add := &cobra.Command{
		Use:   "add ID PATH [FILE...]",
		Short: "Stage changes",
		Long:  `Stage the named files (relative to the repository), or every change when none is named.`,
		Example: `  atoll git add $id repo
  atoll git add $id repo src/main.go README.md`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			gt, err := gitOf(args[0])
			if err != nil {
				return err
			}
			return gt.Add(cmd.Context(), args[1], args[2:]...)
		},
	}

	var message string
	var copts atoll.GitCommitOptions
	commit := run(&cobra.Command{
		Use:     "commit ID PATH -m MESSAGE [--author-name N --author-email E] [--allow-empty]",
		Short:   "Commit what is staged",
		Long:    `Commit what is staged in the repository at PATH and print the new commit's hash. --author-name and --author-email sign it without changing the repository's config.`,
		Example: `  atoll git commit $id repo -m "Add tests" --author-name Agent --author-email agent@example.com`,
	}, 2, func(ctx context.Context, gt *atoll.Git, args []string, out io.Writer) error {
		sha, err := gt.Commit(ctx, args[0], message, copts)
		if err == nil {
			fmt.Fprintln(out, sha)
		}
		return err
	})
	commit.Flags().StringVarP(&message, "message", "m", "", "the commit message")
	commit.Flags().StringVar(&copts.AuthorName, "author-name", "", "author and committer name")
	commit.Flags().StringVar(&copts.AuthorEmail, "author-email", "", "author and committer email")
	commit.Flags().BoolVar(&copts.AllowEmpty, "allow-empty", false, "commit even with nothing staged")
	commit.MarkFlagRequired("message")

	// push and pull take the same remote flags.
	remoteCmd := func(c *cobra.Command, opts *atoll.GitRemoteOptions, f func(gt *atoll.Git, ctx context.Context, path string, opts atoll.GitRemoteOptions) error) *cobra.Command {
		var username string
		c = run(c, 2, func(ctx context.Context, gt *atoll.Git, args []string, _ io.Writer) error {
			opts.Auth = gitAuth(username)
			return f(gt, ctx, args[0], *opts)
		})
		c.Flags().StringVar(&opts.Remote, "remote", "", "the remote (default: the upstream's, else origin)")
		c.Flags().StringVar(&opts.Branch, "branch", "", "the remote branch (default: the upstream)")
		c.Flags().StringVar(&username, "username", "", "the username sent with $"+gitPasswordEnv+` (default "git")`)
		return c
	}
	var pushOpts, pullOpts atoll.GitRemoteOptions
	push := remoteCmd(&cobra.Command{
		Use:   "push ID PATH [--remote R] [--branch B] [--set-upstream] [--username U]",
		Short: "Push a repository's commits",
		Long:  `Push the repository at PATH, with the password or token in $` + gitPasswordEnv + ` if the host asks for one.`,
		Example: `  ATOLL_GIT_PASSWORD=$TOKEN atoll git push $id repo
  ATOLL_GIT_PASSWORD=$TOKEN atoll git push $id repo --branch feature --set-upstream`,
	}, &pushOpts, (*atoll.Git).Push)
	push.Flags().BoolVar(&pushOpts.SetUpstream, "set-upstream", false, "make the pushed branch the current branch's upstream")
	pull := remoteCmd(&cobra.Command{
		Use:     "pull ID PATH [--remote R] [--branch B] [--username U]",
		Short:   "Fetch and merge into the current branch",
		Long:    `Fetch from the remote and merge into the current branch of the repository at PATH (never a rebase), with the password or token in $` + gitPasswordEnv + ` if the host asks for one.`,
		Example: `  ATOLL_GIT_PASSWORD=$TOKEN atoll git pull $id repo`,
	}, &pullOpts, (*atoll.Git).Pull)
	cmd.AddCommand(clone, status, branches, checkout, add, commit, push, pull)
	return cmd
}

// gitAuth is the credentials the environment holds for a git call: none
// when neither $ATOLL_GIT_PASSWORD nor a username is given.
func gitAuth(username string) *atoll.GitAuth {
	pw, ok := os.LookupEnv(gitPasswordEnv)
	if !ok && username == "" {
		return nil
	}
	return &atoll.GitAuth{Username: username, Password: pw}
}
