"""Git in a sandbox (atoll.git) against a test git host that wants a token:
cmd/atoll's TestGitE2E serves the repository and sets ATOLL_TEST_GIT_URL,
_USER and _TOKEN. The same calls and refusals as the Go SDK's test."""

from __future__ import annotations

import os
import re
import unittest

import atoll
from atoll.git import GitAuth, GitError, parse_status, split_credentials

from .support import TestCase


class TestParse(unittest.TestCase):
    def test_status(self):
        out = ("# branch.oid abc\x00# branch.head main\x00# branch.upstream origin/main\x00"
               "# branch.ab +2 -1\x001 .M N... 100644 100644 100644 a a README.md\x00"
               "2 R. N... 100644 100644 100644 a a R100 new name.txt\x00old.txt\x00"
               "u UU N... 100644 100644 100644 100644 a b c both.txt\x00? untracked file\x00")
        s = parse_status(out)
        self.assertEqual((s.branch, s.upstream, s.ahead, s.behind), ("main", "origin/main", 2, 1))
        got = [(f.path, f.orig_path, f.index, f.worktree) for f in s.files]
        self.assertEqual(got, [("README.md", "", ".", "M"), ("new name.txt", "old.txt", "R", "."),
                               ("both.txt", "", "U", "U"), ("untracked file", "", "?", "?")])
        self.assertTrue(parse_status("# branch.head (detached)\x00").detached)

    def test_split_credentials(self):
        self.assertEqual(split_credentials("https://u:p%40ss@h.example:8443/r.git", None),
                         ("https://h.example:8443/r.git", GitAuth("u", "p@ss")))
        # An explicit auth wins; scp-like URLs pass as they are.
        self.assertEqual(split_credentials("https://u:p@h/r", GitAuth("a", "b"))[1], GitAuth("a", "b"))
        self.assertEqual(split_credentials("git@h:r.git", None), ("git@h:r.git", None))
        with self.assertRaises(atoll.Invalid):
            split_credentials("--upload-pack=x", None)

    def test_error_kinds(self):
        from atoll.git import git_error
        e = git_error("push", 1, "fatal: Authentication failed for 'http://h/'")
        self.assertIsInstance(e, atoll.Unauthorized)
        self.assertIsInstance(e, GitError)
        self.assertEqual((e.op, e.exit_code), ("push", 1))
        self.assertIsInstance(git_error("push", 1, " ! [rejected] main -> main (fetch first)"), atoll.Conflict)
        self.assertNotIsInstance(git_error("x", 1, "something else"), atoll.NotFound)


class TestGit(TestCase):
    def setUp(self):
        super().setUp()
        self.url = os.environ.get("ATOLL_TEST_GIT_URL")
        if not self.url:
            self.skipTest("ATOLL_TEST_GIT_URL is not set: run through cmd/atoll's TestGitE2E")
        self.auth = GitAuth(os.environ["ATOLL_TEST_GIT_USER"], os.environ["ATOLL_TEST_GIT_TOKEN"])

    def test_git(self):
        a, b = self.sandbox(), self.sandbox()
        ga = self.c.git(a.id, user="user")
        gb = self.c.git(b.id, user="user", author_name="B", author_email="b@example.com")
        token = self.auth.password

        # No token, or a wrong one: Unauthorized, and git did not wait for a prompt.
        with self.assertRaises(atoll.Unauthorized):
            ga.clone(self.url, "nope")
        with self.assertRaises(atoll.Unauthorized):
            ga.clone(self.url, "nope", auth=GitAuth(self.auth.username, "wrong"))
        # The token inside the URL is taken out of it.
        user_url = self.url.replace("://", f"://{self.auth.username}:{token}@", 1)
        ga.clone(user_url, "py")
        gb.clone(self.url, "/home/user/py", auth=self.auth, depth=1)
        for id in (a.id, b.id):
            out = self.sh(id, "git config --file /home/user/py/.git/config --get remote.origin.url; "
                              f"grep -rl {token} /home/user /tmp /root 2>/dev/null | wc -l")
            self.assertEqual(out.split(), [self.url, "0"], "the token is left in the sandbox")

        st = ga.status("py")
        self.assertEqual((st.branch, st.upstream, st.clean, st.ahead), ("main", "origin/main", True, 0))
        ga.checkout("py", "py-work", create=True)
        self.sh(a.id, "cd /home/user/py && echo hi > py.txt && echo more >> README.md && chown user: py.txt")
        files = {f.path: f.index + f.worktree for f in ga.status("py").files}
        self.assertEqual(files, {"py.txt": "??", "README.md": ".M"})
        ga.add("py", "py.txt")
        f = next(f for f in ga.status("py").files if f.path == "py.txt")
        self.assertTrue(f.staged)
        self.assertEqual(f.index, "A")
        ga.add("py")
        sha = ga.commit("py", "Add py.txt\n\nwith a body", author_name="Agent", author_email="agent@example.com")
        self.assertRegex(sha, r"^[0-9a-f]{40}$")
        out = self.sh(a.id, "cd /home/user/py && git -c safe.directory='*' log -1 --format='%an <%ae> %s'; "
                            "git config --file .git/config --get user.name; true")
        self.assertEqual(out.strip(), "Agent <agent@example.com> Add py.txt")
        with self.assertRaises(atoll.Conflict):
            ga.commit("py", "nothing", author_name="A", author_email="a@x")

        with self.assertRaises(atoll.Unauthorized):
            ga.push("py", branch="py-work", set_upstream=True)
        ga.push("py", branch="py-work", set_upstream=True, auth=self.auth)
        st = ga.status("py")
        self.assertEqual((st.upstream, st.ahead), ("origin/py-work", 0))
        br = ga.branches("py")
        self.assertEqual(br.current, "py-work")
        self.assertIn("main", br.branches)
        with self.assertRaises(atoll.Conflict):
            ga.checkout("py", "main", create=True)
        with self.assertRaises(atoll.NotFound):
            ga.checkout("py", "no-such-branch")

        # b takes the branch, pushes to it; a, behind, is refused until it pulls.
        gb.pull("py", branch="py-work", auth=self.auth)
        self.assertEqual(self.sh(b.id, "cat /home/user/py/py.txt"), "hi\n")
        self.sh(b.id, "cd /home/user/py && echo from-py-b > py-b.txt && chown user: py-b.txt")
        gb.add("py")
        gb.commit("py", "from b")
        gb.push("py", branch="HEAD:py-work", auth=self.auth)
        ga.commit("py", "from a", allow_empty=True, author_name="A", author_email="a@x")
        with self.assertRaises(atoll.Conflict) as cm:
            ga.push("py", auth=self.auth)
        self.assertIsInstance(cm.exception, GitError)
        # The merge needs an identity the sandbox's config does not have.
        with self.assertRaises(atoll.Invalid):
            ga.pull("py", auth=self.auth)
        self.sh(a.id, "cd /home/user/py && git -c safe.directory='*' merge --abort 2>/dev/null; true")
        ga.author_name, ga.author_email = "A", "a@example.com"
        ga.pull("py", auth=self.auth)
        st = ga.status("py")
        self.assertEqual((st.behind, st.ahead), (0, 2))
        ga.push("py", auth=self.auth)

        # Bad input: option-looking URLs and branches, no path, a taken path.
        with self.assertRaises(atoll.Invalid):
            ga.clone("--upload-pack=touch /tmp/pwned", "x")
        with self.assertRaises(atoll.Invalid):
            ga.checkout("py", "--orphan=x")
        with self.assertRaises(atoll.Invalid):
            ga.push("py", remote="--mirror")
        with self.assertRaises(atoll.Invalid):
            ga.pull("py", branch="--all")
        with self.assertRaises(atoll.Invalid):
            ga.clone(self.url, "")
        with self.assertRaises(atoll.Invalid):
            ga.clone(self.url, "x", depth=-1)
        with self.assertRaises(atoll.Invalid):
            ga.commit("py", "  ")
        with self.assertRaises(atoll.Conflict):
            ga.clone(self.url, "py", auth=self.auth)
        with self.assertRaises(atoll.NotFound):
            ga.status("/tmp")
        with self.assertRaises((atoll.NotFound, atoll.Invalid)):
            self.c.git("zzzzzzzzzzzzzzzzzzzz").status("py")
        self.assertIn("No such file", self.c.exec(a.id, shell="ls /tmp/pwned 2>&1").stdout.decode())


if __name__ == "__main__":
    unittest.main()
