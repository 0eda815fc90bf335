package vault

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// A command summarizer is a shell command of the user's (one that calls
// their model, say) that makes the sections of a compaction: run in a
// sandbox of the vault's tenant, made for the compaction and removed
// after it, once for each file rolled up, given the file on stdin; what
// it prints is the section. A command that fails or prints nothing fails
// the compaction, which then commits nothing.

// Sandboxes make the sandboxes that command summarizers run in
// (Config.Sandboxes; cmd/atoll makes them with the control plane).
type Sandboxes interface {
	// Open makes a sandbox of the context's tenant's to run commands in.
	Open(ctx context.Context) (Sandbox, error)
}

// Sandbox is one that Sandboxes made.
type Sandbox interface {
	// Run runs shell (sh -c) as the sandbox's user, with env and stdin,
	// and returns what it printed and its exit code.
	Run(ctx context.Context, shell string, env map[string]string, stdin []byte) (stdout, stderr []byte, exit int, err error)
	// Close removes the sandbox.
	Close()
}

// MaxSummarizer bounds a summarizer command's length, in bytes.
const MaxSummarizer = 4096

// maxSection bounds what a summarizer may print for one file.
const maxSection = 1 << 20

// checkSummarizer refuses a summarizer command that cannot be one.
func checkSummarizer(cmd string) error {
	if len(cmd) > MaxSummarizer || !utf8.ValidString(cmd) || strings.ContainsRune(cmd, 0) {
		return fmt.Errorf("%w: summarizer: want a shell command of at most %d bytes of UTF-8", errdefs.ErrInvalid, MaxSummarizer)
	}
	return nil
}

// command is a command summarizer; its sandbox is made at its first file
// (a compaction with nothing to roll up makes none) and removed by close.
type command struct {
	shell string
	sbs   Sandboxes

	mu  sync.Mutex
	sb  Sandbox
	err error
}

// commandSummarizer is the summarizer that runs shell; ErrUnavailable if
// this server runs no sandboxes for it.
func (s *Service) commandSummarizer(shell string) (*command, error) {
	if err := checkSummarizer(shell); err != nil {
		return nil, err
	}
	if s.cfg.Sandboxes == nil {
		return nil, fmt.Errorf("%w: this server runs no summarizer commands (it makes no sandboxes)", errdefs.ErrUnavailable)
	}
	return &command{shell: shell, sbs: s.cfg.Sandboxes}, nil
}

func (c *command) sandbox(ctx context.Context) (Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sb == nil && c.err == nil {
		c.sb, c.err = c.sbs.Open(ctx)
		if c.err != nil {
			c.err = fmt.Errorf("making the summarizer's sandbox: %w", c.err)
		}
	}
	return c.sb, c.err
}

func (c *command) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sb != nil {
		c.sb.Close()
	}
}

// Summarize runs the command on r's content; its environment names the
// file and where it goes: ATOLL_ROLLUP_KIND (day or week),
// ATOLL_ROLLUP_PATH, ATOLL_ROLLUP_INTO and ATOLL_ROLLUP_SECTION.
func (c *command) Summarize(ctx context.Context, r Rollup) (string, error) {
	sb, err := c.sandbox(ctx)
	if err != nil {
		return "", err
	}
	env := map[string]string{"ATOLL_ROLLUP_KIND": r.Kind, "ATOLL_ROLLUP_PATH": r.Path, "ATOLL_ROLLUP_INTO": r.Into, "ATOLL_ROLLUP_SECTION": r.Section}
	out, stderr, code, err := sb.Run(ctx, c.shell, env, []byte(r.Content))
	if err != nil {
		return "", fmt.Errorf("%w: the summarizer could not run: %v", errdefs.ErrConflict, err)
	}
	if code != 0 {
		return "", fmt.Errorf("%w: the summarizer exited %d: %s", errdefs.ErrConflict, code, tail(stderr, 500))
	}
	if strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("%w: the summarizer printed nothing", errdefs.ErrConflict)
	}
	if len(out) > maxSection {
		return "", fmt.Errorf("%w: the summarizer printed more than %d bytes", errdefs.ErrConflict, maxSection)
	}
	if !utf8.Valid(out) {
		return "", fmt.Errorf("%w: the summarizer printed what is not UTF-8 text", errdefs.ErrConflict)
	}
	return string(out), nil
}

// tail is the last n bytes of b, trimmed, as text.
func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	if s == "" {
		return "(no stderr)"
	}
	return strings.ToValidUTF8(s, "?")
}
