package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// gitHost serves the bare repositories under root over git's smart HTTP
// (git http-backend) on port 8080 of the netWorld's internet host, to
// clients that give user gitUser and password gitToken.
const (
	gitUser  = "agent"
	gitToken = "tok-5f1b9c0e7d2a4e68"
)

func serveGitHost(t *testing.T, w *netWorld, root string) {
	t.Helper()
	backend := &cgi.Handler{Path: mustLookPath(t, "git"), Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	ln := nettest.Listen(t, w.inet, "tcp", "[::]:8080")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != gitUser || p != gitToken {
			rw.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(rw, "who are you", http.StatusUnauthorized)
			return
		}
		r.Header.Del("Authorization")
		backend.ServeHTTP(rw, r)
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
}

func mustLookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// hostGit runs git on the host, in dir.
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=host", "GIT_AUTHOR_EMAIL=host@example.com",
		"GIT_COMMITTER_NAME=host", "GIT_COMMITTER_EMAIL=host@example.com", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestGitE2E drives the Go and Python SDKs' and the CLI's git against a repository on a
// test git host that wants a token: clone, status, branches, checkout,
// add, commit, push and pull in two sandboxes, with the token never left
// in a sandbox, and git's refusals arriving as typed errors.
func TestGitE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	root := testenv.Dir(t)
	hostGit(t, root, "init", "--quiet", "--bare", "--initial-branch=main", "app.git")
	hostGit(t, filepath.Join(root, "app.git"), "config", "http.receivepack", "true")
	seed := filepath.Join(root, "seed")
	hostGit(t, root, "init", "--quiet", "--initial-branch=main", seed)
	os.WriteFile(filepath.Join(seed, "README.md"), []byte("# app\n"), 0o644)
	hostGit(t, seed, "add", "README.md")
	hostGit(t, seed, "commit", "--quiet", "-m", "first")
	hostGit(t, seed, "push", "--quiet", filepath.Join(root, "app.git"), "main")
	serveGitHost(t, w, root)

	data := testenv.Dir(t)
	d := startDaemonIn(t, data, w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--warm-pool", "0", "--prestart", "0", "--network-pool", "0")
	c := d.client()
	ctx := context.Background()
	repoURL := "http://" + wInet4 + ":8080/app.git"
	auth := &atoll.GitAuth{Username: gitUser, Password: gitToken}
	a := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	b := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	ga, gb := c.Git(a.ID), c.Git(b.ID)
	ga.User, gb.User = "user", "user"
	// b signs its commits and merges as a whole; a per commit.
	gb.AuthorName, gb.AuthorEmail = "B", "b@example.com"
	sign := atoll.GitCommitOptions{AuthorName: "Agent", AuthorEmail: "agent@example.com"}
	isErr := func(what string, err, kind error) {
		t.Helper()
		var ge *atoll.GitError
		if !errors.Is(err, kind) {
			t.Errorf("%s: %v, want %v", what, err, kind)
		} else if !errors.As(err, &ge) && !errors.Is(kind, atoll.ErrInvalid) {
			t.Errorf("%s: %T is not a GitError", what, err)
		}
	}

	// No token: the host's 401 is ErrUnauthorized, and git did not wait
	// for a prompt.
	isErr("clone without a token", ga.Clone(ctx, repoURL, "nope", atoll.GitCloneOptions{}), atoll.ErrUnauthorized)
	isErr("clone with a wrong token", ga.Clone(ctx, repoURL, "nope", atoll.GitCloneOptions{
		Auth: &atoll.GitAuth{Username: gitUser, Password: "wrong"}}), atoll.ErrUnauthorized)
	// The token inside the URL is taken out of it.
	if err := ga.Clone(ctx, "http://"+gitUser+":"+gitToken+"@"+wInet4+":8080/app.git", "app", atoll.GitCloneOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := gb.Clone(ctx, repoURL, "/home/user/app", atoll.GitCloneOptions{Auth: auth, Depth: 1}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, b.ID} {
		out, _ := sh(t, c, id, "git config --file /home/user/app/.git/config --get remote.origin.url; grep -rl "+gitToken+" /home/user /tmp /root 2>/dev/null | wc -l")
		if lines := strings.Fields(out); len(lines) != 2 || lines[0] != repoURL || lines[1] != "0" {
			t.Errorf("%s: the token is left in the sandbox or the origin is wrong: %q", id, out)
		}
	}

	st, err := ga.Status(ctx, "app")
	if err != nil || st.Branch != "main" || st.Upstream != "origin/main" || !st.Clean() || st.Ahead != 0 {
		t.Fatalf("status of a fresh clone: %+v, %v", st, err)
	}
	sh(t, c, a.ID, "cd /home/user/app && echo hi > notes.txt && echo more >> README.md && chown user: notes.txt")
	st, _ = ga.Status(ctx, "app")
	files := map[string]string{}
	for _, f := range st.Files {
		files[f.Path] = f.Index + f.Worktree
	}
	if files["notes.txt"] != "??" || files["README.md"] != ".M" || len(files) != 2 {
		t.Errorf("status after edits: %+v", st.Files)
	}
	if err := ga.Add(ctx, "app", "notes.txt"); err != nil {
		t.Fatal(err)
	}
	st, _ = ga.Status(ctx, "app")
	for _, f := range st.Files {
		if f.Path == "notes.txt" && (!f.Staged() || f.Index != "A") {
			t.Errorf("notes.txt after add: %+v", f)
		}
	}
	if err := ga.Add(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	sha, err := ga.Commit(ctx, "app", "Add notes\n\nwith a body", sign)
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(sha) {
		t.Fatalf("commit: %q, %v", sha, err)
	}
	if out, _ := sh(t, c, a.ID, "cd /home/user/app && git -c safe.directory='*' log -1 --format='%an <%ae> %s'; git config --file .git/config --get user.name; true"); strings.TrimSpace(out) != "Agent <agent@example.com> Add notes" {
		t.Errorf("the commit's author, and no identity written into the config: %q", out)
	}
	st, _ = ga.Status(ctx, "app")
	if st.Ahead != 1 || !st.Clean() {
		t.Errorf("status after commit: %+v", st)
	}
	_, err = ga.Commit(ctx, "app", "nothing", sign)
	isErr("commit with nothing staged", err, atoll.ErrConflict)

	isErr("push without a token", ga.Push(ctx, "app", atoll.GitRemoteOptions{}), atoll.ErrUnauthorized)
	if err := ga.Push(ctx, "app", atoll.GitRemoteOptions{Auth: auth}); err != nil {
		t.Fatal(err)
	}
	if got := hostGit(t, filepath.Join(root, "app.git"), "rev-parse", "main"); got != sha {
		t.Errorf("the host's main is %s after the push of %s", got, sha)
	}

	// Branches: make one, switch, push it as a new upstream.
	if err := ga.Checkout(ctx, "app", "feature", true); err != nil {
		t.Fatal(err)
	}
	br, err := ga.Branches(ctx, "app")
	if err != nil || br.Current != "feature" || strings.Join(br.Branches, ",") != "feature,main" {
		t.Errorf("branches: %+v, %v", br, err)
	}
	isErr("making a branch that exists", ga.Checkout(ctx, "app", "main", true), atoll.ErrConflict)
	isErr("checking out no such branch", ga.Checkout(ctx, "app", "nope", false), atoll.ErrNotFound)
	if _, err := ga.Commit(ctx, "app", "on feature", atoll.GitCommitOptions{AllowEmpty: true, AuthorName: "A", AuthorEmail: "a@x"}); err != nil {
		t.Fatal(err)
	}
	if err := ga.Push(ctx, "app", atoll.GitRemoteOptions{Branch: "feature", SetUpstream: true, Auth: auth}); err != nil {
		t.Fatal(err)
	}
	if st, _ := ga.Status(ctx, "app"); st.Upstream != "origin/feature" || st.Ahead != 0 {
		t.Errorf("after a push with SetUpstream: %+v", st)
	}
	if err := ga.Checkout(ctx, "app", "main", false); err != nil {
		t.Fatal(err)
	}

	// b pulls a's commit; then b pushes one and a, behind, is refused until
	// it pulls.
	if err := gb.Pull(ctx, "app", atoll.GitRemoteOptions{Auth: auth}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, b.ID, "cat /home/user/app/notes.txt"); out != "hi\n" {
		t.Errorf("b after the pull: %q", out)
	}
	sh(t, c, b.ID, "cd /home/user/app && echo from-b > b.txt && chown user: b.txt")
	gb.Add(ctx, "app")
	if _, err := gb.Commit(ctx, "app", "from b", atoll.GitCommitOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := gb.Push(ctx, "app", atoll.GitRemoteOptions{Auth: auth}); err != nil {
		t.Fatal(err)
	}
	if _, err := ga.Commit(ctx, "app", "from a", atoll.GitCommitOptions{AllowEmpty: true, AuthorName: "A", AuthorEmail: "a@x"}); err != nil {
		t.Fatal(err)
	}
	isErr("a push behind the remote", ga.Push(ctx, "app", atoll.GitRemoteOptions{Auth: auth}), atoll.ErrConflict)
	// The pull merges: a merge commit needs an identity, which the
	// sandbox's config does not have.
	isErr("a merge with no identity", ga.Pull(ctx, "app", atoll.GitRemoteOptions{Auth: auth}), atoll.ErrInvalid)
	sh(t, c, a.ID, "cd /home/user/app && git -c safe.directory='*' merge --abort 2>/dev/null; true")
	ga.AuthorName, ga.AuthorEmail = "A", "a@example.com"
	if err := ga.Pull(ctx, "app", atoll.GitRemoteOptions{Auth: auth}); err != nil {
		t.Fatal(err)
	}
	if st, _ := ga.Status(ctx, "app"); st.Behind != 0 || st.Ahead != 2 {
		t.Errorf("a after pulling b's commit into its own: %+v", st)
	}

	// Bad input: option-looking URLs and branches, no repository, no path.
	isErr("a URL that is an option", ga.Clone(ctx, "--upload-pack=touch /tmp/pwned", "x", atoll.GitCloneOptions{}), atoll.ErrInvalid)
	isErr("a branch that is an option", ga.Checkout(ctx, "app", "--orphan=x", false), atoll.ErrInvalid)
	isErr("a remote that is an option", ga.Push(ctx, "app", atoll.GitRemoteOptions{Remote: "--mirror"}), atoll.ErrInvalid)
	isErr("clone into no path", ga.Clone(ctx, repoURL, "", atoll.GitCloneOptions{}), atoll.ErrInvalid)
	isErr("clone into a repository", ga.Clone(ctx, repoURL, "app", atoll.GitCloneOptions{Auth: auth}), atoll.ErrConflict)
	_, err = ga.Status(ctx, "/tmp")
	isErr("status outside a repository", err, atoll.ErrNotFound)
	_, err = c.Git("sb-nonexistent").Status(ctx, "app")
	if !errors.Is(err, atoll.ErrNotFound) && !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("git in no sandbox: %v", err)
	}
	if out, _ := sh(t, c, a.ID, "ls /tmp/pwned 2>&1"); !strings.Contains(out, "No such file") {
		t.Errorf("an option-looking URL ran: %q", out)
	}

	// The CLI: a clone with the token from the environment, then status.
	t.Setenv(gitPasswordEnv, gitToken)
	if out, code := d.cli("git", "clone", b.ID, repoURL, "cli", "--username", gitUser, "--user", "user"); code != 0 {
		t.Fatalf("atoll git clone: %d %s", code, out)
	}
	os.Unsetenv(gitPasswordEnv)
	out, code := d.cli("git", "status", b.ID, "cli", "--user", "user")
	if code != 0 || !strings.HasPrefix(out, "## main ... origin/main [ahead 0, behind 0]") {
		t.Errorf("atoll git status: %d %q", code, out)
	}
	if out, code := d.cli("git", "branches", b.ID, "cli", "--user", "user"); code != 0 || strings.TrimSpace(out) != "* main" {
		t.Errorf("atoll git branches: %d %q", code, out)
	}
	if out, code := d.cli("git", "push", b.ID, "cli", "--user", "user"); code == 0 || !strings.Contains(out, "git push") {
		t.Errorf("atoll git push without a token: %d %q", code, out)
	}
	// A branch of its own, a file added and committed, pushed with the
	// token, which stays out of the sandbox.
	cli := func(args ...string) (string, int) {
		return d.cli(append(append([]string{"git"}, args...), "--user", "user")...)
	}
	sh(t, c, b.ID, "cd /home/user/cli && echo cli > cli.txt && chown user: cli.txt")
	if out, code := cli("checkout", b.ID, "cli", "cli-feature", "-b"); code != 0 || out != "" {
		t.Errorf("atoll git checkout -b: %d %q", code, out)
	}
	if out, code := cli("branches", b.ID, "cli"); code != 0 || out != "* cli-feature\n  main\n" {
		t.Errorf("atoll git branches after checkout -b: %d %q", code, out)
	}
	if out, code := cli("add", b.ID, "cli", "cli.txt"); code != 0 || out != "" {
		t.Errorf("atoll git add: %d %q", code, out)
	}
	if out, code := cli("status", b.ID, "cli"); code != 0 || out != "## cli-feature\nA. cli.txt\n" {
		t.Errorf("atoll git status after add: %d %q", code, out)
	}
	out, code = cli("commit", b.ID, "cli", "-m", "From the CLI", "--author-name", "CLI", "--author-email", "cli@example.com")
	cliSHA := strings.TrimSpace(out)
	if code != 0 || !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(cliSHA) {
		t.Fatalf("atoll git commit: %d %q", code, out)
	}
	t.Setenv(gitPasswordEnv, gitToken)
	out, code = cli("push", b.ID, "cli", "--username", gitUser, "--branch", "cli-feature", "--set-upstream")
	os.Unsetenv(gitPasswordEnv)
	if code != 0 {
		t.Fatalf("atoll git push with a token: %d %q", code, out)
	}
	if got := hostGit(t, filepath.Join(root, "app.git"), "rev-parse", "cli-feature"); got != cliSHA {
		t.Errorf("the host's cli-feature is %s after the CLI's push of %s", got, cliSHA)
	}
	if got := hostGit(t, filepath.Join(root, "app.git"), "log", "-1", "--format=%an <%ae> %s", "cli-feature"); got != "CLI <cli@example.com> From the CLI" {
		t.Errorf("the CLI's commit on the host: %q", got)
	}
	if out, _ := sh(t, c, b.ID, "cd /home/user/cli && git config --file .git/config --get remote.origin.url; git config --file .git/config --get branch.cli-feature.remote; grep -rl "+gitToken+" /home/user /tmp /root /etc/gitconfig 2>/dev/null | wc -l"); out != repoURL+"\norigin\n0\n" {
		t.Errorf("after the CLI's push, the token is left in the sandbox or the upstream is not set: %q", out)
	}
	if out, code := cli("status", b.ID, "cli"); code != 0 || out != "## cli-feature ... origin/cli-feature [ahead 0, behind 0]\n" {
		t.Errorf("atoll git status after push --set-upstream: %d %q", code, out)
	}
	// Another commit reaches the host; the CLI pulls it.
	hostClone := filepath.Join(root, "host-clone")
	hostGit(t, root, "clone", "--quiet", "--branch", "cli-feature", filepath.Join(root, "app.git"), hostClone)
	os.WriteFile(filepath.Join(hostClone, "host.txt"), []byte("from the host\n"), 0o644)
	hostGit(t, hostClone, "add", "host.txt")
	hostGit(t, hostClone, "commit", "--quiet", "-m", "from the host")
	hostGit(t, hostClone, "push", "--quiet", "origin", "cli-feature")
	hostSHA := hostGit(t, hostClone, "rev-parse", "HEAD")
	if out, code := cli("pull", b.ID, "cli"); code == 0 || !strings.Contains(out, "git pull") {
		t.Errorf("atoll git pull without a token: %d %q", code, out)
	}
	t.Setenv(gitPasswordEnv, gitToken)
	out, code = cli("pull", b.ID, "cli", "--username", gitUser)
	os.Unsetenv(gitPasswordEnv)
	if code != 0 {
		t.Fatalf("atoll git pull: %d %q", code, out)
	}
	if out, _ := sh(t, c, b.ID, "cd /home/user/cli && cat host.txt && git -c safe.directory='*' rev-parse HEAD && grep -rl "+gitToken+" /home/user /tmp /root 2>/dev/null | wc -l"); out != "from the host\n"+hostSHA+"\n0\n" {
		t.Errorf("after atoll git pull: %q, want the host's commit %s and no token", out, hostSHA)
	}

	// The Python SDK's git, the same calls against the same host
	// (sdk/python/tests/test_git.py).
	t.Run("python", func(t *testing.T) {
		if n := runPythonTests(t, d, "test_git.py", "ATOLL_TEST_GIT_URL="+repoURL,
			"ATOLL_TEST_GIT_USER="+gitUser, "ATOLL_TEST_GIT_TOKEN="+gitToken); n < 4 {
			t.Errorf("only %d Python git tests ran", n)
		}
	})
}
