"""What the tests share: a client of the server under test, from
ATOLL_URL and ATOLL_API_KEY (cmd/atoll's TestPythonSDK starts a server
and sets them), and sandboxes that are deleted when a test ends."""

from __future__ import annotations

import os
import time
import unittest

import atoll


def client(**kw) -> atoll.Client:
    if not os.environ.get("ATOLL_URL"):
        raise unittest.SkipTest("ATOLL_URL is not set: run through cmd/atoll's TestPythonSDK")
    return atoll.Client(os.environ["ATOLL_URL"], os.environ.get("ATOLL_API_KEY", ""), **kw)


class TestCase(unittest.TestCase):
    """A test with a client (self.c) and sandboxes it deletes afterwards."""

    def setUp(self) -> None:
        self.c = client()

    def sandbox(self, **kw) -> atoll.Sandbox:
        sb = self.c.create_sandbox(**kw)
        self.addCleanup(self._delete, sb.id)
        return sb

    def _delete(self, id: str) -> None:
        try:
            self.c.delete_sandbox(id)
        except atoll.NotFound:
            pass

    def sh(self, id: str, script: str) -> str:
        r = self.c.exec(id, shell=script)
        self.assertEqual(r.exit_code, 0, f"{script}: {r.stderr!r}")
        return r.stdout.decode()

    def eventually(self, check, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return check()
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
