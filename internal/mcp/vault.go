package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
)

type vaultReadIn struct {
	Vault string `json:"vault" jsonschema:"the vault's name"`
	Path  string `json:"path" jsonschema:"the note's path in the vault, e.g. index.md"`
	Rev   string `json:"rev,omitempty" jsonschema:"a commit, branch or tag; default the main branch"`
}

func (t *tools) vaultRead(ctx context.Context, _ *mcp.CallToolRequest, in vaultReadIn) (fileOut, error) {
	if err := need("vault", in.Vault, "path", in.Path); err != nil {
		return fileOut{}, err
	}
	r, err := t.c.ReadVaultFile(ctx, in.Vault, in.Path, in.Rev)
	if err != nil {
		return fileOut{}, err
	}
	defer r.Close()
	b, err := readAll(r, maxFile, in.Path)
	if err != nil {
		return fileOut{}, err
	}
	return encode(in.Path, b), nil
}

type vaultWriteIn struct {
	Vault   string `json:"vault" jsonschema:"the vault's name"`
	Path    string `json:"path" jsonschema:"the note's path in the vault, e.g. timeline/2026/12/03.md"`
	Content string `json:"content" jsonschema:"the note's text"`
	Append  bool   `json:"append,omitempty" jsonschema:"append to the note instead of replacing it"`
	Message string `json:"message,omitempty" jsonschema:"the commit message"`
}

type vaultWriteOut struct {
	Commit  string `json:"commit" jsonschema:"the main branch's commit after the write"`
	Changed bool   `json:"changed" jsonschema:"false when the note already read so: no commit was made"`
}

// vaultWrite commits a note to a vault the way any client does, over the
// vault's git URL with the key (the REST API reads vaults; git writes
// them): a clone in a temporary directory, one commit, a push to main. A
// push that another writer beat is a conflict, to be tried again.
func (t *tools) vaultWrite(ctx context.Context, _ *mcp.CallToolRequest, in vaultWriteIn) (vaultWriteOut, error) {
	if err := need("vault", in.Vault, "path", in.Path); err != nil {
		return vaultWriteOut{}, err
	}
	rel := path.Clean(in.Path)
	if path.IsAbs(in.Path) || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || rel == ".git" || strings.HasPrefix(rel, ".git/") {
		return vaultWriteOut{}, invalid("path must be a relative path inside the vault, not %q", in.Path)
	}
	if len(in.Content) > maxFile {
		return vaultWriteOut{}, &toolError{Code: api.CodeTooLarge, Message: fmt.Sprintf("content is larger than %d MiB", maxFile>>20)}
	}
	// The vault exists and is this key's: its error says so better than git's.
	if _, err := t.c.GetVault(ctx, in.Vault); err != nil {
		return vaultWriteOut{}, err
	}
	dir, err := os.MkdirTemp("", "atoll-mcp-vault-")
	if err != nil {
		return vaultWriteOut{}, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	g := gitIn{dir: dir, key: t.key}
	if _, err := g.run(ctx, "clone", "--quiet", "--no-tags", t.c.VaultGitURL(in.Vault), "w"); err != nil {
		return vaultWriteOut{}, err
	}
	g.dir = filepath.Join(dir, "w")
	file := filepath.Join(g.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return vaultWriteOut{}, invalid("path %q: a parent of it is a file", in.Path)
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if in.Append {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(file, flags, 0o644)
	if err != nil {
		return vaultWriteOut{}, invalid("path %q cannot be written: it is a directory", in.Path)
	}
	_, err = f.WriteString(in.Content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return vaultWriteOut{}, err
	}
	if _, err := g.run(ctx, "add", "--", rel); err != nil {
		return vaultWriteOut{}, err
	}
	status, err := g.run(ctx, "status", "--porcelain")
	if err != nil {
		return vaultWriteOut{}, err
	}
	if strings.TrimSpace(status) == "" {
		head, err := g.run(ctx, "rev-parse", "HEAD")
		return vaultWriteOut{Commit: strings.TrimSpace(head)}, err
	}
	msg := in.Message
	if msg == "" {
		msg = "mcp: write " + rel
	}
	if _, err := g.run(ctx, "-c", "user.name=atoll mcp", "-c", "user.email=mcp@atoll.invalid", "commit", "--quiet", "-m", msg); err != nil {
		return vaultWriteOut{}, err
	}
	if _, err := g.run(ctx, "push", "--quiet", "origin", "HEAD:refs/heads/main"); err != nil {
		return vaultWriteOut{}, err
	}
	head, err := g.run(ctx, "rev-parse", "HEAD")
	return vaultWriteOut{Commit: strings.TrimSpace(head), Changed: true}, err
}

// gitIn runs git in dir, sending the key as a bearer token: through
// git's environment config, so that it is neither in a URL git may print
// nor in an argument list other users can read.
type gitIn struct {
	dir, key string
}

func (g gitIn) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = g.dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Bearer "+g.key,
		"GIT_CONFIG_KEY_1=init.defaultBranch", "GIT_CONFIG_VALUE_1=main")
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return "", &toolError{Code: api.CodeUnavailable, Message: "vault_write needs git on the machine the MCP server runs on"}
	case errors.As(err, &ee):
		msg := strings.TrimSpace(errb.String())
		code := api.CodeUnavailable
		switch {
		case strings.Contains(msg, "rejected") || strings.Contains(msg, "append-only"):
			// Another write reached main first, or the history rule.
			code = api.CodeConflict
		case strings.Contains(msg, "Authentication failed") || strings.Contains(msg, "403"):
			code = api.CodeForbidden
		}
		return "", &toolError{Code: code, Message: fmt.Sprintf("git %s: %s", args[0], msg)}
	case err != nil:
		return "", err
	}
	return out.String(), nil
}

type vaultSearchIn struct {
	Vault string `json:"vault" jsonschema:"the vault's name"`
	Query string `json:"query" jsonschema:"SQLite FTS5 query: words, \"phrases\", prefix*, AND, OR, NOT, title:word"`
	Limit int    `json:"limit,omitempty" jsonschema:"at most this many hits"`
}

func (t *tools) vaultSearch(ctx context.Context, _ *mcp.CallToolRequest, in vaultSearchIn) (api.VaultSearch, error) {
	if err := need("vault", in.Vault, "query", in.Query); err != nil {
		return api.VaultSearch{}, err
	}
	if in.Limit < 0 {
		return api.VaultSearch{}, invalid("limit must not be negative")
	}
	return t.c.SearchVault(ctx, in.Vault, in.Query, in.Limit)
}
