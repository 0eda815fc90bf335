package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newExecCmd(g *globals) *cobra.Command {
	var req api.ExecRequest
	var env []string
	var timeout time.Duration
	var interactive, detach bool
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox, streaming its stdout and stderr to yours, and
exit with its exit code (128+N if signal N ended it, 124 if --timeout passed).
Put "--" before the command so that its own flags are not read as atoll's.
Ctrl-C (SIGINT) and SIGTERM are passed on to the command. With -d the
command runs in the background: its PID is printed at once, and what it
prints goes to the sandbox's log (atoll logs).`,
		Example: `  atoll exec 3k9x2m7q1w8e5r4t6y0u -- ls -la /
  atoll exec 3k9x2m7q1w8e5r4t6y0u --cwd /work --env CI=1 --timeout 5m -- make test
  tar c . | atoll exec 3k9x2m7q1w8e5r4t6y0u -i -- tar x -C /work
  atoll exec 3k9x2m7q1w8e5r4t6y0u -d -- python3 -m http.server 8080`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = keyValues("--env", env); err != nil {
				return err
			}
			if timeout < 0 {
				return errors.New("--timeout must not be negative")
			}
			req.TimeoutMs = timeout.Milliseconds()
			req.Cmd = args[1:]
			req.KeepStdin = interactive
			if detach && interactive {
				return errors.New("-d and -i do not go together: a background command's stdin is closed")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if detach {
				p, err := c.StartProcess(cmd.Context(), args[0], req)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), p.PID)
				return nil
			}
			return runExec(cmd.Context(), c, args[0], req, interactive, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Cwd, "cwd", "", "working directory (default: the user's home)")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	f.StringVar(&req.User, "user", "", `user to run as: "root" (default) or "user"`)
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long, e.g. 30s (default none)")
	f.BoolVarP(&interactive, "interactive", "i", false, "pass stdin to the command")
	f.BoolVarP(&detach, "detach", "d", false, "run in the background and print its PID; its output goes to the sandbox's log (atoll logs)")
	return cmd
}

func runExec(ctx context.Context, c *atoll.Client, id string, req api.ExecRequest, interactive bool, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.ExecStream(ctx, id, req)
	if err != nil {
		return err
	}
	defer s.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	for s.Next() {
		ev := s.Event()
		switch ev.Type {
		case api.EventStart:
			go forwardSignals(ctx, c, id, ev.PID, sigs)
			if interactive {
				go pumpStdin(ctx, c, id, ev.PID, stdin, stderr)
			}
		case api.EventStdout:
			stdout.Write(ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data)
		case api.EventError:
			return errors.New(ev.Message)
		case api.EventExit:
			return exitError{exitStatus(ev, stderr, time.Duration(req.TimeoutMs)*time.Millisecond)}
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	return errors.New("the connection ended before the command exited")
}

// exitStatus is the shell-style exit code of an exit event.
func exitStatus(ev api.ExecEvent, stderr io.Writer, timeout time.Duration) int {
	switch {
	case ev.TimedOut:
		fmt.Fprintf(stderr, "atoll: command timed out after %v\n", timeout)
		return 124
	case ev.ExitCode != nil && *ev.ExitCode >= 0:
		return *ev.ExitCode
	case ev.Signal != "":
		if n := unix.SignalNum(ev.Signal); n != 0 {
			return 128 + int(n)
		}
	}
	return 255
}

// forwardSignals passes SIGINT and SIGTERM to the remote process until ctx ends.
func forwardSignals(ctx context.Context, c *atoll.Client, id string, pid int, sigs <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			name := "SIGINT"
			if sig == syscall.SIGTERM {
				name = "SIGTERM"
			}
			c.Signal(ctx, id, pid, name)
		}
	}
}

// pumpStdin sends stdin to the process chunk by chunk, then closes its stdin.
// It may outlive the command while blocked reading stdin; the CLI exits then.
func pumpStdin(ctx context.Context, c *atoll.Client, id string, pid int, stdin io.Reader, stderr io.Writer) {
	buf := make([]byte, 64<<10)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if err := c.SendStdin(ctx, id, pid, bytes.NewReader(buf[:n])); err != nil {
				if ctx.Err() == nil {
					fmt.Fprintln(stderr, "atoll: sending stdin:", err)
				}
				return
			}
		}
		if err != nil {
			c.CloseStdin(ctx, id, pid)
			return
		}
	}
}

func newShellCmd(g *globals) *cobra.Command {
	var user, cwd string
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open an interactive login shell (bash if the sandbox has it, else sh) on a
terminal in the sandbox. Exit the shell to leave; atoll exits with its code.`,
		Example: `  atoll shell 3k9x2m7q1w8e5r4t6y0u
  atoll shell --user user --cwd /work 3k9x2m7q1w8e5r4t6y0u`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return runShell(cmd.Context(), c, args[0], user, cwd)
		},
	}
	cmd.Flags().StringVar(&user, "user", "", `user to run as: "root" (default) or "user"`)
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory (default: the user's home)")
	return cmd
}

func runShell(ctx context.Context, c *atoll.Client, id, user, cwd string) error {
	fd := int(os.Stdin.Fd())
	isTerm := term.IsTerminal(fd)
	size := api.PTYSize{Rows: 24, Cols: 80}
	if isTerm {
		if w, h, err := term.GetSize(fd); err == nil {
			size = api.PTYSize{Rows: uint16(h), Cols: uint16(w)}
		}
	}
	termName := os.Getenv("TERM")
	if termName == "" {
		termName = "xterm-256color"
	}
	p, err := c.StartProcess(ctx, id, api.ExecRequest{
		Cmd:       []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"},
		Env:       map[string]string{"TERM": termName},
		User:      user,
		Cwd:       cwd,
		KeepStdin: true,
		PTY:       &size,
		Tag:       "atoll-shell",
	})
	if err != nil {
		return err
	}
	t, err := c.Terminal(ctx, id, p.PID)
	if err != nil {
		return err
	}
	defer t.Close()
	if isTerm {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("setting the terminal to raw mode: %w", err)
		}
		defer term.Restore(fd, old)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	winch <- syscall.SIGWINCH // send the size once: a redraw shows the prompt
	go func() {
		for range winch {
			if w, h, err := term.GetSize(fd); err == nil {
				t.Resize(uint16(h), uint16(w))
			}
		}
	}()
	go io.Copy(t, os.Stdin) // blocked in a read when the shell ends; the CLI exits then
	io.Copy(os.Stdout, t)
	code, err := t.Wait()
	if err != nil {
		return err
	}
	return exitError{code}
}
