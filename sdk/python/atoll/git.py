"""Git in a sandbox through the sandbox's own git (sdk/go/git.go in Go):
clone, status, branches, checkout, add, commit, push and pull, each one
exec of git.

Credentials never stay in the sandbox: a call that needs them hands them
to git through a credential helper given on git's command line (``-c``,
which applies to that one invocation and is written to no config) that
reads them from the exec's environment. A URL with a user and password in
it is split the same way, so that the clone's origin is the URL without
them.

    g = c.git(sb.id, user="user", author_name="Agent", author_email="a@x")
    g.clone("https://host/org/repo.git", "repo", auth=GitAuth("me", token))
    g.add("repo")
    g.commit("repo", "Change things")
    g.push("repo", auth=GitAuth("me", token))

A failed git command raises a :class:`GitError` that is also the
:mod:`atoll.errors` class its message says (Unauthorized, NotFound,
Conflict, Invalid, ...), by the one table :data:`FAILURES`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Type

from . import errors

if TYPE_CHECKING:
    from .client import Client


@dataclass
class GitAuth:
    """What git answers a server that asks for credentials. An empty
    username is sent as "git", which GitHub, GitLab and most hosts accept
    with a token."""
    username: str = ""
    password: str = ""


@dataclass
class GitFileStatus:
    """One changed path. index and worktree are git's two-letter status
    split: "M" modified, "A" added, "D" deleted, "R" renamed, "C" copied,
    "U" unmerged, "." unchanged, "?" untracked."""
    path: str
    index: str
    worktree: str
    orig_path: str = ""  # the path before a rename or copy

    @property
    def staged(self) -> bool:
        return self.index not in (".", "?")


@dataclass
class GitStatus:
    """A repository's state, from git status --porcelain=v2."""
    branch: str = ""  # empty when detached
    detached: bool = False
    upstream: str = ""  # e.g. origin/main
    ahead: int = 0
    behind: int = 0
    files: List[GitFileStatus] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.files


@dataclass
class GitBranches:
    current: str = ""  # empty when detached
    branches: List[str] = field(default_factory=list)


class GitError(errors.Error):
    """A git command that failed in the sandbox: its exit code and what it
    printed on stderr. Each instance is also of the error class FAILURES
    finds for its message, so ``except atoll.NotFound`` catches it."""

    def __init__(self, op: str, exit_code: int, stderr: str):
        msg = stderr.strip() or f"exit code {exit_code}"
        super().__init__("git " + op + ": " + msg, status=0)
        self.op, self.exit_code, self.stderr = op, exit_code, stderr


#: What git prints for failures a caller handles, and their kinds,
#: checked in order (gitFailures in Go).
FAILURES: Sequence[tuple] = (
    ("authentication failed", errors.Unauthorized),
    ("could not read username", errors.Unauthorized),
    ("could not read password", errors.Unauthorized),
    ("the requested url returned error: 401", errors.Unauthorized),
    ("the requested url returned error: 403", errors.Forbidden),
    ("the requested url returned error: 404", errors.NotFound),
    ("repository not found", errors.NotFound),
    ("does not appear to be a git repository", errors.NotFound),
    ("not a git repository", errors.NotFound),
    ("did not match any file(s) known to git", errors.NotFound),
    ("invalid reference", errors.NotFound),  # switch to no such branch
    ("remote branch", errors.NotFound),  # "Remote branch X not found in upstream origin"
    ("already exists and is not an empty directory", errors.Conflict),
    ("already exists", errors.Conflict),  # a branch that exists
    ("[rejected]", errors.Conflict),  # a push that is not a fast-forward
    ("non-fast-forward", errors.Conflict),
    ("conflict", errors.Conflict),  # a pull that merged with conflicts
    ("nothing to commit", errors.Conflict),
    ("would be overwritten", errors.Conflict),
    ("not a valid branch name", errors.Invalid),
    ("please tell me who you are", errors.Invalid),  # no identity: give author_name/author_email
    ("unable to auto-detect email address", errors.Invalid),
)

_classes: Dict[Type[errors.Error], type] = {}


def git_error(op: str, exit_code: int, stderr: str) -> GitError:
    """The GitError of a failed command, of the kind its stderr says."""
    low = stderr.lower()
    kind = next((k for says, k in FAILURES if says in low), None)
    if kind is None:
        return GitError(op, exit_code, stderr)
    cls = _classes.get(kind)
    if cls is None:
        cls = _classes[kind] = type("GitError", (GitError, kind), {"code": kind.code})
    e = cls(op, exit_code, stderr)
    return e


# The credential helper answers git's "get" from the exec's environment;
# git runs it with sh. The empty helper before it drops any helper the
# sandbox's config names, for this invocation.
CREDENTIAL_HELPER = ("!f() { test \"$1\" = get && printf 'username=%s\\npassword=%s\\n' "
                     "\"$ATOLL_GIT_USERNAME\" \"$ATOLL_GIT_PASSWORD\"; }; f")


def split_credentials(raw_url: str, auth: Optional[GitAuth]):
    """Takes a user and password out of raw_url into auth (an explicit auth
    wins), so that they reach git only through the helper."""
    if not raw_url or raw_url.startswith("-"):
        raise errors.invalid(f"git: malformed URL {raw_url!r}")
    try:
        u = urllib.parse.urlsplit(raw_url)
    except ValueError:
        return raw_url, auth
    if u.scheme not in ("http", "https") or (u.username is None and u.password is None):
        # scp-like ssh URLs (git@host:path) and local paths are passed on
        # as they are: their user is not a secret.
        return raw_url, auth
    if auth is None:
        auth = GitAuth(urllib.parse.unquote(u.username or ""), urllib.parse.unquote(u.password or ""))
    host = u.hostname or ""
    if ":" in host:
        host = "[" + host + "]"
    if u.port:
        host += f":{u.port}"
    return urllib.parse.urlunsplit((u.scheme, host, u.path, u.query, u.fragment)), auth


def parse_status(out: str) -> GitStatus:
    """Reads git status --porcelain=v2 --branch -z: NUL-ended records,
    headers starting with "#", a rename's original path in the record
    after it."""
    s = GitStatus()
    recs = out.split("\x00")
    i = 0
    while i < len(recs):
        r = recs[i]
        if r.startswith("# branch.head "):
            s.branch = r[len("# branch.head "):]
            if s.branch == "(detached)":
                s.branch, s.detached = "", True
        elif r.startswith("# branch.upstream "):
            s.upstream = r[len("# branch.upstream "):]
        elif r.startswith("# branch.ab "):
            m = re.match(r"\+(\d+) -(\d+)", r[len("# branch.ab "):])
            if m:
                s.ahead, s.behind = int(m.group(1)), int(m.group(2))
        elif r.startswith("1 ") or r.startswith("u "):
            # "1 XY sub mH mI mW hH hI path"; "u XY sub m1 m2 m3 mW h1 h2 h3 path"
            n = 11 if r[0] == "u" else 9
            f = r.split(" ", n - 1)
            if len(f) == n:
                s.files.append(GitFileStatus(path=f[n - 1], index=f[1][:1], worktree=f[1][1:]))
        elif r.startswith("2 "):
            # "2 XY sub mH mI mW hH hI Xscore path", then the original path.
            f = r.split(" ", 9)
            if len(f) == 10:
                fs = GitFileStatus(path=f[9], index=f[1][:1], worktree=f[1][1:])
                if i + 1 < len(recs):
                    i += 1
                    fs.orig_path = recs[i]
                s.files.append(fs)
        elif r.startswith("? "):
            s.files.append(GitFileStatus(path=r[2:], index="?", worktree="?"))
        i += 1
    return s


class Git:
    """The git client of one sandbox (Client.git). user runs git as that
    user of the sandbox; author_name and author_email, when set, sign the
    commits git makes (commit's, and a pull's merges) without writing them
    into any config."""

    def __init__(self, client: "Client", id: str, *, user: Optional[str] = None,
                 author_name: Optional[str] = None, author_email: Optional[str] = None):
        self._c, self.id = client, id
        self.user, self.author_name, self.author_email = user, author_name, author_email

    def clone(self, url: str, path: str, *, branch: Optional[str] = None, depth: int = 0,
              auth: Optional[GitAuth] = None) -> None:
        """Clones url into path (relative to the user's home). The clone's
        origin is url without any credentials in it."""
        clean, auth = split_credentials(url, auth)
        if not path:
            raise errors.invalid("git clone: a path is needed")
        args = ["clone"]
        if branch:
            args += ["--branch", branch]
        if depth < 0:
            raise errors.invalid("git clone: depth must not be negative")
        if depth > 0:
            args += ["--depth", str(depth)]
        self._run("", "clone", args + ["--", clean, path], auth=auth)

    def status(self, path: str) -> GitStatus:
        """The state of the repository at path."""
        return parse_status(self._run(path, "status", ["status", "--porcelain=v2", "--branch", "-z"]))

    def branches(self, path: str) -> GitBranches:
        """The local branches of the repository at path."""
        out = self._run(path, "branches", ["for-each-ref", "--format=%(HEAD)%(refname:short)", "refs/heads"])
        b = GitBranches()
        for line in out.rstrip("\n").split("\n"):
            if len(line) < 2:
                continue
            name = line[1:]
            if line[0] == "*":
                b.current = name
            b.branches.append(name)
        return b

    def checkout(self, path: str, branch: str, create: bool = False) -> None:
        """Switches the repository at path to branch; create makes it first."""
        if not branch or branch.startswith("-"):
            raise errors.invalid(f"git checkout: malformed branch {branch!r}")
        args = ["switch"] + (["--create"] if create else [])
        # No "--" before it: switch takes no paths, and a branch starting
        # with "-" is refused above.
        self._run(path, "checkout", args + [branch])

    def add(self, path: str, *files: str) -> None:
        """Stages files (relative to the repository); none stages every change."""
        args = ["add"] + (["--", *files] if files else ["--all"])
        self._run(path, "add", args)

    def commit(self, path: str, message: str, *, author_name: Optional[str] = None,
               author_email: Optional[str] = None, allow_empty: bool = False) -> str:
        """Commits what is staged and returns the new commit's hash."""
        if not message.strip():
            raise errors.invalid("git commit: a message is needed")
        args = ["commit", "--quiet", "--file=-"] + (["--allow-empty"] if allow_empty else [])
        env: Dict[str, str] = {}
        _identity(env, author_name, author_email)
        self._run(path, "commit", args, env=env, stdin=message.encode())
        return self._run(path, "commit", ["rev-parse", "HEAD"]).strip()

    def push(self, path: str, *, remote: Optional[str] = None, branch: Optional[str] = None,
             set_upstream: bool = False, auth: Optional[GitAuth] = None) -> None:
        """Pushes the repository at path (to the branch's upstream, else
        origin, unless remote and branch say). set_upstream makes them the
        current branch's upstream: a new branch's first push."""
        args = ["push"] + (["--set-upstream"] if set_upstream else [])
        self._run(path, "push", _remote_args(args, remote, branch), auth=auth)

    def pull(self, path: str, *, remote: Optional[str] = None, branch: Optional[str] = None,
             auth: Optional[GitAuth] = None) -> None:
        """Fetches and merges into the current branch (fast-forward or
        merge, never rebase, as git's default)."""
        args = _remote_args(["pull", "--no-rebase", "--no-edit"], remote, branch)
        self._run(path, "pull", args, auth=auth)

    def _run(self, path: str, op: str, args: List[str], *, auth: Optional[GitAuth] = None,
             env: Optional[Dict[str, str]] = None, stdin: Optional[bytes] = None) -> str:
        """Runs git with args in the repository at path (absolute, or
        relative to the user's home; the home when empty) and returns its
        stdout."""
        env = dict(env or {})
        if "GIT_AUTHOR_NAME" not in env:
            _identity(env, self.author_name, None)
        if "GIT_AUTHOR_EMAIL" not in env:
            _identity(env, None, self.author_email)
        # Never wait for a prompt no one can answer.
        env["GIT_TERMINAL_PROMPT"] = "0"
        cmd = ["git"]
        if auth is not None:
            env["ATOLL_GIT_USERNAME"] = auth.username or "git"
            env["ATOLL_GIT_PASSWORD"] = auth.password
            cmd += ["-c", "credential.helper=", "-c", "credential.helper=" + CREDENTIAL_HELPER]
        if path:
            # -C, not the exec's cwd: it takes a path relative to the home.
            cmd += ["-C", path]
        r = self._c.exec(self.id, cmd + args, user=self.user, env=env, stdin=stdin)
        out = r.stdout.decode(errors="replace")
        if r.exit_code != 0:
            hint = "\n" + out.strip() if out.strip() else ""
            raise git_error(op, r.exit_code, r.stderr.decode(errors="replace") + hint)
        return out


def _remote_args(args: List[str], remote: Optional[str], branch: Optional[str]) -> List[str]:
    if branch and not remote:
        remote = "origin"
    for a in (remote, branch):
        if a and a.startswith("-"):
            raise errors.invalid(f"git: malformed remote or branch {a!r}")
    return args + [a for a in (remote, branch) if a]


def _identity(env: Dict[str, str], name: Optional[str], email: Optional[str]) -> None:
    if name:
        env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = name
    if email:
        env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = email
