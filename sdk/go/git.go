package atoll

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/api"
)

// Git runs the sandbox's own git client on a repository inside it: clone,
// status, branches, checkout, add, commit, push and pull, as E2B's and
// Daytona's SDKs offer them. Each call is one exec of git in the sandbox.
//
// Credentials never stay in the sandbox: a call that needs them hands them
// to git through a credential helper given on git's command line (-c,
// which applies to that one invocation and is not written to any config)
// that reads them from the exec's environment. A URL with a user and
// password in it is split the same way, so that the clone's origin is the
// URL without them.
type Git struct {
	c  *Client
	id string
	// User runs git as this user of the sandbox ("user" or "root"); empty
	// is the exec default.
	User string
	// AuthorName and AuthorEmail, when set, sign the commits git makes
	// (Commit's, and a Pull's merges) without writing them into any config;
	// GitCommitOptions override them for one commit.
	AuthorName, AuthorEmail string
}

// Git returns the git client of sandbox id.
func (c *Client) Git(id string) *Git { return &Git{c: c, id: id} }

// GitAuth is what git answers a server that asks for credentials: a
// username and a password or token. Empty Username is sent as "git", which
// GitHub, GitLab and most hosts accept with a token.
type GitAuth struct {
	Username string
	Password string
}

// GitCloneOptions shape a clone.
type GitCloneOptions struct {
	Branch string // check out this branch (or tag) instead of the remote's HEAD
	Depth  int    // a shallow clone of this many commits; 0 is all
	Auth   *GitAuth
}

// GitRemoteOptions shape a push or a pull.
type GitRemoteOptions struct {
	Remote string // default: the branch's upstream, else origin
	Branch string // default: the current branch's upstream
	// SetUpstream makes Remote/Branch the current branch's upstream (push
	// only): a new branch's first push.
	SetUpstream bool
	Auth        *GitAuth
}

// GitCommitOptions shape a commit.
type GitCommitOptions struct {
	// AuthorName and AuthorEmail sign the commit (as author and committer)
	// without writing them into the repository's config; empty leaves
	// git's configured identity.
	AuthorName, AuthorEmail string
	AllowEmpty              bool
}

// GitStatus is a repository's state, from git status --porcelain=v2.
type GitStatus struct {
	Branch   string // the current branch; empty when detached
	Detached bool
	Upstream string // e.g. origin/main; empty when none
	Ahead    int    // commits on Branch not on Upstream
	Behind   int    // commits on Upstream not on Branch
	Files    []GitFileStatus
}

// Clean reports whether nothing is changed, staged or untracked.
func (s GitStatus) Clean() bool { return len(s.Files) == 0 }

// GitFileStatus is one changed path. Index and Worktree are git's
// two-letter status split: "M" modified, "A" added, "D" deleted, "R"
// renamed, "C" copied, "U" unmerged, "." unchanged, "?" untracked.
type GitFileStatus struct {
	Path     string
	OrigPath string // the path before a rename or copy
	Index    string
	Worktree string
}

// Staged reports whether the path has a change in the index.
func (f GitFileStatus) Staged() bool { return f.Index != "." && f.Index != "?" }

// GitBranches are a repository's local branches and the one checked out.
type GitBranches struct {
	Current  string // empty when detached
	Branches []string
}

// GitError is a git command that failed in the sandbox: its exit code and
// what it printed on stderr. errors.Is matches it to ErrUnauthorized,
// ErrNotFound, ErrConflict or ErrInvalid when stderr says which (see
// gitFailures).
type GitError struct {
	Op       string // clone, status, push, ...
	ExitCode int
	Stderr   string
}

func (e *GitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = "exit code " + strconv.Itoa(e.ExitCode)
	}
	return "git " + e.Op + ": " + msg
}

// Is reports whether git's message is of target's kind.
func (e *GitError) Is(target error) bool {
	low := strings.ToLower(e.Stderr)
	for _, f := range gitFailures {
		if f.kind == target && strings.Contains(low, f.says) {
			return true
		}
	}
	return false
}

// gitFailures are what git prints for failures a caller handles, and their
// kinds, checked in order.
var gitFailures = []struct {
	says string
	kind error
}{
	{"authentication failed", ErrUnauthorized},
	{"could not read username", ErrUnauthorized},
	{"could not read password", ErrUnauthorized},
	{"the requested url returned error: 401", ErrUnauthorized},
	{"the requested url returned error: 403", ErrForbidden},
	{"the requested url returned error: 404", ErrNotFound},
	{"repository not found", ErrNotFound},
	{"does not appear to be a git repository", ErrNotFound},
	{"not a git repository", ErrNotFound},
	{"did not match any file(s) known to git", ErrNotFound},
	{"invalid reference", ErrNotFound}, // switch to no such branch
	{"remote branch", ErrNotFound},     // "Remote branch X not found in upstream origin"
	{"already exists and is not an empty directory", ErrConflict},
	{"already exists", ErrConflict}, // a branch that exists
	{"[rejected]", ErrConflict},     // a push that is not a fast-forward
	{"non-fast-forward", ErrConflict},
	{"conflict", ErrConflict}, // a pull that merged with conflicts
	{"nothing to commit", ErrConflict},
	{"would be overwritten", ErrConflict},
	{"not a valid branch name", ErrInvalid},
	{"please tell me who you are", ErrInvalid}, // no identity: set AuthorName/AuthorEmail
	{"unable to auto-detect email address", ErrInvalid},
}

// Clone clones url into path (relative to the user's home). The clone's
// origin is url without any credentials in it.
func (g *Git) Clone(ctx context.Context, rawURL, path string, opts GitCloneOptions) error {
	clean, auth, err := splitCredentials(rawURL, opts.Auth)
	if err != nil {
		return err
	}
	if path == "" {
		return &Error{StatusCode: 400, Code: api.CodeInvalid, Message: "git clone: a path is needed"}
	}
	args := []string{"clone"}
	if opts.Branch != "" {
		args = append(args, "--branch", opts.Branch)
	}
	if opts.Depth < 0 {
		return &Error{StatusCode: 400, Code: api.CodeInvalid, Message: "git clone: depth must not be negative"}
	}
	if opts.Depth > 0 {
		args = append(args, "--depth", strconv.Itoa(opts.Depth))
	}
	args = append(args, "--", clean, path)
	_, err = g.run(ctx, "", "clone", auth, nil, args...)
	return err
}

// splitCredentials takes a user and password out of rawURL into auth (an
// explicit auth wins), so that they reach git only through the helper.
func splitCredentials(rawURL string, auth *GitAuth) (string, *GitAuth, error) {
	if rawURL == "" || strings.HasPrefix(rawURL, "-") {
		return "", nil, &Error{StatusCode: 400, Code: api.CodeInvalid, Message: fmt.Sprintf("git: malformed URL %q", rawURL)}
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil || (u.Scheme != "http" && u.Scheme != "https") {
		// scp-like ssh URLs (git@host:path) and local paths are passed on
		// as they are: their user is not a secret.
		return rawURL, auth, nil
	}
	if auth == nil {
		pw, _ := u.User.Password()
		auth = &GitAuth{Username: u.User.Username(), Password: pw}
	}
	u.User = nil
	return u.String(), auth, nil
}

// Status reads the state of the repository at path.
func (g *Git) Status(ctx context.Context, path string) (GitStatus, error) {
	out, err := g.run(ctx, path, "status", nil, nil, "status", "--porcelain=v2", "--branch", "-z")
	if err != nil {
		return GitStatus{}, err
	}
	return parseGitStatus(out), nil
}

// parseGitStatus reads git status --porcelain=v2 --branch -z: NUL-ended
// records, headers starting with "#", a rename's original path in the
// record after it.
func parseGitStatus(out string) GitStatus {
	var s GitStatus
	recs := strings.Split(out, "\x00")
	for i := 0; i < len(recs); i++ {
		r := recs[i]
		switch {
		case strings.HasPrefix(r, "# branch.head "):
			s.Branch = strings.TrimPrefix(r, "# branch.head ")
			if s.Branch == "(detached)" {
				s.Branch, s.Detached = "", true
			}
		case strings.HasPrefix(r, "# branch.upstream "):
			s.Upstream = strings.TrimPrefix(r, "# branch.upstream ")
		case strings.HasPrefix(r, "# branch.ab "):
			fmt.Sscanf(strings.TrimPrefix(r, "# branch.ab "), "+%d -%d", &s.Ahead, &s.Behind)
		case strings.HasPrefix(r, "1 "), strings.HasPrefix(r, "u "):
			// "1 XY sub mH mI mW hH hI path"; "u XY sub m1 m2 m3 mW h1 h2 h3 path"
			n := 9
			if r[0] == 'u' {
				n = 11
			}
			if f := strings.SplitN(r, " ", n); len(f) == n {
				s.Files = append(s.Files, GitFileStatus{Path: f[n-1], Index: f[1][:1], Worktree: f[1][1:]})
			}
		case strings.HasPrefix(r, "2 "):
			// "2 XY sub mH mI mW hH hI Xscore path", then the original path.
			if f := strings.SplitN(r, " ", 10); len(f) == 10 {
				fs := GitFileStatus{Path: f[9], Index: f[1][:1], Worktree: f[1][1:]}
				if i+1 < len(recs) {
					i++
					fs.OrigPath = recs[i]
				}
				s.Files = append(s.Files, fs)
			}
		case strings.HasPrefix(r, "? "):
			s.Files = append(s.Files, GitFileStatus{Path: r[2:], Index: "?", Worktree: "?"})
		}
	}
	return s
}

// Branches lists the local branches of the repository at path.
func (g *Git) Branches(ctx context.Context, path string) (GitBranches, error) {
	out, err := g.run(ctx, path, "branches", nil, nil, "for-each-ref", "--format=%(HEAD)%(refname:short)", "refs/heads")
	if err != nil {
		return GitBranches{}, err
	}
	var b GitBranches
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if len(line) < 2 {
			continue
		}
		name := line[1:]
		if line[0] == '*' {
			b.Current = name
		}
		b.Branches = append(b.Branches, name)
	}
	return b, nil
}

// Checkout switches the repository at path to branch; create makes it
// first, at the current commit.
func (g *Git) Checkout(ctx context.Context, path, branch string, create bool) error {
	if branch == "" || strings.HasPrefix(branch, "-") {
		return &Error{StatusCode: 400, Code: api.CodeInvalid, Message: fmt.Sprintf("git checkout: malformed branch %q", branch)}
	}
	args := []string{"switch"}
	if create {
		args = append(args, "--create")
	}
	// No "--" before it: switch takes no paths, and a branch starting
	// with "-" is refused above.
	_, err := g.run(ctx, path, "checkout", nil, nil, append(args, branch)...)
	return err
}

// Add stages files (paths relative to the repository); none stages every
// change, removals and new files included.
func (g *Git) Add(ctx context.Context, path string, files ...string) error {
	args := []string{"add"}
	if len(files) == 0 {
		args = append(args, "--all")
	} else {
		args = append(append(args, "--"), files...)
	}
	_, err := g.run(ctx, path, "add", nil, nil, args...)
	return err
}

// Commit commits what is staged and returns the new commit's hash.
func (g *Git) Commit(ctx context.Context, path, message string, opts GitCommitOptions) (string, error) {
	if strings.TrimSpace(message) == "" {
		return "", &Error{StatusCode: 400, Code: api.CodeInvalid, Message: "git commit: a message is needed"}
	}
	args := []string{"commit", "--quiet", "--file=-"}
	if opts.AllowEmpty {
		args = append(args, "--allow-empty")
	}
	env := map[string]string{}
	identity(env, opts.AuthorName, opts.AuthorEmail)
	if _, err := g.runIn(ctx, path, "commit", nil, env, []byte(message), args...); err != nil {
		return "", err
	}
	out, err := g.run(ctx, path, "commit", nil, nil, "rev-parse", "HEAD")
	return strings.TrimSpace(out), err
}

// Push pushes the repository at path.
func (g *Git) Push(ctx context.Context, path string, opts GitRemoteOptions) error {
	args := []string{"push"}
	if opts.SetUpstream {
		args = append(args, "--set-upstream")
	}
	args, err := remoteArgs(args, opts)
	if err != nil {
		return err
	}
	_, err = g.run(ctx, path, "push", opts.Auth, nil, args...)
	return err
}

// Pull fetches and merges into the current branch of the repository at
// path (fast-forward or merge, never rebase, as git's default).
func (g *Git) Pull(ctx context.Context, path string, opts GitRemoteOptions) error {
	if opts.SetUpstream {
		return &Error{StatusCode: 400, Code: api.CodeInvalid, Message: "git pull: SetUpstream is for push"}
	}
	args, err := remoteArgs([]string{"pull", "--no-rebase", "--no-edit"}, opts)
	if err != nil {
		return err
	}
	_, err = g.run(ctx, path, "pull", opts.Auth, nil, args...)
	return err
}

// remoteArgs appends the remote and branch of opts, refusing ones git
// would take for options.
func remoteArgs(args []string, opts GitRemoteOptions) ([]string, error) {
	remote, branch := opts.Remote, opts.Branch
	if branch != "" && remote == "" {
		remote = "origin"
	}
	for _, a := range []string{remote, branch} {
		if strings.HasPrefix(a, "-") {
			return nil, &Error{StatusCode: 400, Code: api.CodeInvalid, Message: fmt.Sprintf("git: malformed remote or branch %q", a)}
		}
	}
	if remote != "" {
		args = append(args, remote)
	}
	if branch != "" {
		args = append(args, branch)
	}
	return args, nil
}

// credentialHelper answers git's "get" from the exec's environment; git
// runs it with sh. The empty helper before it drops any helper the
// sandbox's config names, for this invocation.
const credentialHelper = `!f() { test "$1" = get && printf 'username=%s\npassword=%s\n' "$ATOLL_GIT_USERNAME" "$ATOLL_GIT_PASSWORD"; }; f`

func (g *Git) run(ctx context.Context, path, op string, auth *GitAuth, env map[string]string, args ...string) (string, error) {
	return g.runIn(ctx, path, op, auth, env, nil, args...)
}

// runIn runs git with args in the repository at path (absolute, or
// relative to the user's home; the home when empty), stdin as its input,
// and returns its stdout.
func (g *Git) runIn(ctx context.Context, path, op string, auth *GitAuth, env map[string]string, stdin []byte, args ...string) (string, error) {
	if env == nil {
		env = map[string]string{}
	}
	if _, ok := env["GIT_AUTHOR_NAME"]; !ok {
		identity(env, g.AuthorName, "")
	}
	if _, ok := env["GIT_AUTHOR_EMAIL"]; !ok {
		identity(env, "", g.AuthorEmail)
	}
	// Never wait for a prompt no one can answer.
	env["GIT_TERMINAL_PROMPT"] = "0"
	cmd := []string{"git"}
	if auth != nil {
		user := auth.Username
		if user == "" {
			user = "git"
		}
		env["ATOLL_GIT_USERNAME"], env["ATOLL_GIT_PASSWORD"] = user, auth.Password
		cmd = append(cmd, "-c", "credential.helper=", "-c", "credential.helper="+credentialHelper)
	}
	if path != "" {
		// -C, not the exec's cwd: it takes a path relative to the home.
		cmd = append(cmd, "-C", path)
	}
	var stdout, stderr bytes.Buffer
	code, err := g.c.Exec(ctx, g.id, api.ExecRequest{Cmd: append(cmd, args...), User: g.User,
		Env: env, Stdin: stdin}, &stdout, &stderr)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", &GitError{Op: op, ExitCode: code, Stderr: stderr.String() + gitStdoutHint(stdout.String())}
	}
	return stdout.String(), nil
}

// identity sets git's author and committer in env, where given.
func identity(env map[string]string, name, email string) {
	if name != "" {
		env["GIT_AUTHOR_NAME"], env["GIT_COMMITTER_NAME"] = name, name
	}
	if email != "" {
		env["GIT_AUTHOR_EMAIL"], env["GIT_COMMITTER_EMAIL"] = email, email
	}
}

// gitStdoutHint is what git printed on stdout when it failed, for the few
// commands (commit) that explain themselves there.
func gitStdoutHint(out string) string {
	if out = strings.TrimSpace(out); out == "" {
		return ""
	}
	return "\n" + out
}

var _ error = (*GitError)(nil)
