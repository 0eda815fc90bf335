"""atoll.harbor.AtollEnvironment, driven as Harbor drives an environment,
through a trial of the task in tasks/hello: build, start, the oracle's
solution, the verifier's reward, and each hook."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import atoll
from atoll import harbor

from .support import TestCase

TASK = Path(__file__).parent / "tasks" / "hello"


def run(coro):
    return asyncio.run(coro)


class TestImport(unittest.TestCase):
    def test_without_harbor(self):
        # The module imports where Harbor is not installed, and then is
        # its own base.
        out = subprocess.run([sys.executable, "-c", "import atoll.harbor as h; print(h.HAVE_HARBOR, "
                              "h.AtollEnvironment.type().value)"],
                             capture_output=True, text=True, check=True,
                             cwd=os.path.dirname(os.path.dirname(atoll.__file__)))
        self.assertEqual(out.stdout.split()[1], "atoll")

    def test_task_config(self):
        cfg = harbor.load_task_config(TASK)
        if not cfg:
            self.skipTest("tomllib is Python 3.11's")
        self.assertEqual((cfg["cpus"], cfg["memory_mb"], cfg["allow_internet"]), (1, 512, False))


class TestEnvironment(TestCase):
    def env(self, session: str, **kw) -> harbor.AtollEnvironment:
        e = harbor.AtollEnvironment(TASK / "environment", "hello", session, client=self.c, **kw)
        self.addCleanup(e.stop_sync, True)
        return e

    def test_trial(self):
        e = self.env("hello__1")
        run(e.start(force_build=False))
        sb = self.c.get_sandbox(e.sandbox_id)
        # The task's settings: 1 cpu, 512 MB, 1 GB of disk, no internet.
        self.assertEqual((sb.cpu, sb.memory_mib, sb.disk_gib), (1.0, 512, 1))
        self.assertEqual(sb.template, e.template)
        self.assertEqual(sb.labels["harbor-session"], "hello__1")
        if os.environ.get("ATOLL_TEST_INET"):
            self.assertEqual(self.c.get_network(sb.id).policy.egress, "deny-all")

        r = run(e.exec("pwd; cat README; echo $GREETING >&2; exit 3", cwd="/app",
                       env={"GREETING": "hi"}))
        self.assertEqual((r.stdout, r.stderr, r.return_code), ("/app\ngreeting task\n", "hi\n", 3))
        self.assertEqual(run(e.exec("id -un", user="user")).stdout, "user\n")
        r = run(e.exec("sleep 30", timeout_sec=1))
        self.assertEqual(r.return_code, harbor.TIMEOUT_EXIT_CODE)
        self.assertIn("timed out", r.stderr)

        # Before the solution the verifier's reward is 0; after it, 1.
        run(e.upload_dir(TASK / "tests", "/tests"))
        run(e.exec("bash /tests/test.sh"))
        with tempfile.TemporaryDirectory() as d:
            run(e.download_file("/logs/verifier/reward.txt", Path(d) / "reward.txt"))
            self.assertEqual((Path(d) / "reward.txt").read_text().strip(), "0")
        run(e.upload_file(TASK / "solution" / "solve.sh", "/solution/solve.sh"))
        self.assertTrue(run(e.is_file("/solution/solve.sh")))
        self.assertTrue(run(e.is_dir("/tests")))
        self.assertFalse(run(e.is_file("/nope")))
        self.assertEqual(run(e.exec("bash /solution/solve.sh")).return_code, 0)
        r = run(e.exec("bash /tests/test.sh"))
        self.assertIn("PASSED", r.stdout)
        with tempfile.TemporaryDirectory() as d:
            run(e.download_dir("/logs", d))
            self.assertEqual((Path(d) / "verifier" / "reward.txt").read_text().strip(), "1")
            self.assertTrue((Path(d) / "agent").is_dir())
        # The uploaded script kept its mode.
        self.assertEqual(self.c.stat(e.sandbox_id, "/solution/solve.sh").mode & 0o111, 0o111)

        run(e.stop(delete=False))
        self.assertEqual(self.c.get_sandbox(e.sandbox_id).state, "stopped")
        id = e.sandbox_id
        run(e.stop(delete=True))
        with self.assertRaises(atoll.NotFound):
            self.c.get_sandbox(id)
        self.assertIsNone(e.sandbox_id)
        with self.assertRaises(RuntimeError):
            run(e.exec("true"))

    def test_template_cached_by_content(self):
        a = self.env("hello__a")
        run(a.start())
        b = self.env("hello__b")
        run(b.start())
        self.assertEqual(a.template, b.template)
        self.assertFalse(b.built, "the second trial built the template again")
        c = self.env("hello__c")
        run(c.start(force_build=True))
        self.assertTrue(c.built)
        self.assertEqual(c.template, a.template)
        # Another Dockerfile is another template.
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "environment").mkdir()
            (Path(d) / "environment" / "Dockerfile").write_text("FROM host\nRUN echo changed > /x\n")
            other = harbor.AtollEnvironment(Path(d) / "environment", "hello", "hello__d",
                                            client=self.c, task_env_config={"cpus": 2, "memory_mb": 256})
            self.addCleanup(other.stop_sync, True)
            run(other.start())
            self.assertNotEqual(other.template, a.template)
            self.assertEqual(run(other.exec("cat /x")).stdout, "changed\n")
            sb = self.c.get_sandbox(other.sandbox_id)
            self.assertEqual((sb.cpu, sb.memory_mib), (2.0, 256))

    def test_network_policy_hook(self):
        inet = os.environ.get("ATOLL_TEST_INET")
        if not inet:
            self.skipTest("ATOLL_TEST_INET is not set: the server runs without networking")
        e = self.env("hello__net", task_env_config={"allow_internet": True})
        run(e.start())
        fetch = f"python3 -c 'import urllib.request as u; print(u.urlopen(\"http://{inet}/\", timeout=3).status)'"
        self.assertEqual(run(e.exec(fetch)).stdout, "200\n")
        run(e.apply_network_policy({"network_mode": "no-network"}))
        self.assertNotEqual(run(e.exec(fetch)).return_code, 0)
        run(e.apply_network_policy({"network_mode": "allowlist", "allowed_hosts": [inet]}))
        self.assertEqual(run(e.exec(fetch)).stdout, "200\n")
        run(e.apply_network_policy({"network_mode": "public"}))
        self.assertEqual(self.c.get_network(e.sandbox_id).policy.egress, "allow-all")
        with self.assertRaises(atoll.Invalid):
            run(e.apply_network_policy({"network_mode": "sometimes"}))

    def test_healthcheck(self):
        ok = self.env("hello__hc", task_env_config={"healthcheck": {
            "command": "test -f /app/README", "retries": 1}})
        run(ok.start())
        bad = self.env("hello__hcbad", task_env_config={"healthcheck": {
            "command": "test -f /app/never", "retries": 2, "interval_sec": 0.1}})
        with self.assertRaises(harbor.HealthcheckError):
            run(bad.start())

    def test_bad_task(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(FileNotFoundError):
                harbor.AtollEnvironment(Path(d), "empty", "empty__1", client=self.c)
            Path(d, "Dockerfile").write_text("FROM host\nRUN exit 7\n")
            e = harbor.AtollEnvironment(Path(d), "broken", "broken__1", client=self.c)
            with self.assertRaises(atoll.Error):
                run(e.start())
            self.assertIsNone(e.sandbox_id)


if __name__ == "__main__":
    unittest.main()
