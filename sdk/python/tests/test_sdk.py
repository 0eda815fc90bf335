"""The SDK against a real server: every call, and the errors each raises."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import os
import tarfile
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import atoll
from atoll import errors

from .support import TestCase, client

# NOPE is a well-formed ID that names nothing.
NOPE = "zzzzzzzzzzzzzzzzzzzz"


class TestErrors(unittest.TestCase):
    def test_one_table(self):
        # Every code has its class, the class knows its code, and an
        # answer without a JSON body is classified by its status.
        for code, cls, status, also in atoll.KINDS:
            self.assertEqual(cls.code, code)
            e = errors.error_from(status, b"")
            self.assertIsInstance(e, cls)
            for s in also:
                self.assertIsInstance(errors.error_from(s, b"<html>bad gateway</html>"), cls)
        e = errors.error_from(429, json.dumps({"code": "quota_exceeded", "message": "over",
                                               "quota": {"name": "max_sandboxes"}}).encode(), 2)
        self.assertIsInstance(e, atoll.QuotaExceeded)
        self.assertEqual((e.message, e.retry_after, e.quota["name"]), ("over", 2, "max_sandboxes"))
        # An unknown code keeps the class of its status.
        self.assertIsInstance(errors.error_from(404, b'{"code":"gone","message":"m"}'), atoll.NotFound)


class TestServer(TestCase):
    def test_health_and_runtimes(self):
        self.assertEqual(self.c.health().status, "ok")
        rts = {r.name: r for r in self.c.runtimes()}
        self.assertTrue(rts["ns"].available)
        self.assertTrue(any(r.default for r in rts.values()))

    def test_bad_key(self):
        bad = atoll.Client(os.environ["ATOLL_URL"], "atoll_nope")
        self.assertEqual(bad.health().status, "ok")  # needs no key
        with self.assertRaises(atoll.Unauthorized) as cm:
            bad.list_sandboxes()
        self.assertEqual(cm.exception.status, 401)

    def test_failover(self):
        # A node that cannot be reached is passed over for the next.
        c = atoll.Client("http://127.0.0.1:1," + os.environ["ATOLL_URL"], os.environ["ATOLL_API_KEY"])
        self.assertEqual(len(c.list_sandboxes(state="archived", labels={"none": "x"})), 0)
        self.assertEqual(c.base_url, os.environ["ATOLL_URL"])

    def test_nodes_on_one_machine(self):
        with self.assertRaises(atoll.Conflict):
            self.c.list_nodes()
        with self.assertRaises(atoll.Conflict):
            self.c.cordon_node("n1")
        with self.assertRaises(atoll.Conflict):
            self.c.uncordon_node("n1")
        with self.assertRaises(atoll.Conflict):
            self.c.drain_node("n1")


class TestSandboxes(TestCase):
    def test_lifecycle(self):
        sb = self.sandbox(labels={"suite": "py", "n": "1"}, env={"GREETING": "hi"}, cpu=1,
                          memory_mib=256)
        self.assertEqual((sb.state, sb.template, sb.cpu, sb.memory_mib), ("running", "host", 1.0, 256))
        self.assertIsInstance(sb.created_at, dt.datetime)
        self.assertEqual(self.c.get_sandbox(sb.id).labels, {"suite": "py", "n": "1"})
        ids = [s.id for s in self.c.list_sandboxes(labels={"suite": "py"})]
        self.assertIn(sb.id, ids)
        self.assertNotIn(sb.id, [s.id for s in self.c.list_sandboxes(labels={"suite": "other"})])
        self.assertIn(sb.id, [s.id for s in self.c.list_sandboxes(state="running")])
        self.assertEqual(self.sh(sb.id, "echo $GREETING"), "hi\n")

        self.sh(sb.id, "echo kept > /root/kept")
        self.assertEqual(self.c.stop_sandbox(sb.id).state, "stopped")
        with self.assertRaises(atoll.Conflict):
            self.c.stop_sandbox(sb.id)
        with self.assertRaises(atoll.Conflict):
            self.c.exec(sb.id, ["true"])
        self.assertEqual(self.c.start_sandbox(sb.id).state, "running")
        self.assertEqual(self.sh(sb.id, "cat /root/kept"), "kept\n")

        self.assertEqual(self.c.pause_sandbox(sb.id).state, "paused")
        with self.assertRaises(atoll.Conflict):
            self.c.exec(sb.id, ["true"])
        self.assertEqual(self.c.resume_sandbox(sb.id).state, "running")
        self.assertEqual(self.c.shelve_sandbox(sb.id).state, "shelved")
        self.assertEqual(self.c.resume_sandbox(sb.id).state, "running")
        self.assertEqual(self.sh(sb.id, "cat /root/kept"), "kept\n")
        # The ns runtime keeps no memory on disk.
        with self.assertRaises((atoll.Conflict, atoll.Invalid)):
            self.c.suspend_sandbox(sb.id)

        t = self.c.set_timeout(sb.id, 600.5)
        self.assertIsNotNone(t.expires_at)
        left = (t.expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
        self.assertTrue(590 < left <= 601, left)
        self.assertIsNone(self.c.set_timeout(sb.id, 0).expires_at)

        self.c.delete_sandbox(sb.id)
        with self.assertRaises(atoll.NotFound) as cm:
            self.c.get_sandbox(sb.id)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(atoll.NotFound):
            self.c.delete_sandbox(sb.id)

    def test_bad_creates(self):
        with self.assertRaises(atoll.Invalid):
            self.c.create_sandbox(cpu=-1)
        with self.assertRaises(atoll.NotFound):
            self.c.create_sandbox(template="no-such-template")
        with self.assertRaises((atoll.Invalid, atoll.Unavailable)):
            self.c.create_sandbox(runtime="no-such-runtime")
        with self.assertRaises(atoll.Invalid):
            self.c.set_timeout("sb", -1)
        # A JSON body above the server's 1 MiB.
        with self.assertRaises(atoll.TooLarge) as cm:
            self.c.create_sandbox(labels={"big": "x" * (2 << 20)})
        self.assertEqual(cm.exception.status, 413)

    def test_archive(self):
        sb = self.sandbox()
        self.sh(sb.id, "echo archived > /root/f")
        with self.assertRaises(atoll.Conflict):
            self.c.archive_sandbox(sb.id)  # running
        self.c.stop_sandbox(sb.id)
        self.assertIn(self.c.archive_sandbox(sb.id).state, ("archived", "archiving"))
        self.eventually(lambda: self.assertEqual(self.c.get_sandbox(sb.id).state, "archived"), 60)
        self.c.start_sandbox(sb.id)
        self.eventually(lambda: self.assertEqual(self.c.get_sandbox(sb.id).state, "running"), 60)
        self.assertEqual(self.sh(sb.id, "cat /root/f"), "archived\n")

    def test_metrics(self):
        sb = self.sandbox()
        start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)

        def sampled():
            ms = self.c.metrics(sb.id, start=start)
            self.assertTrue(ms, "no samples yet")
            return ms

        ms = self.eventually(sampled, 30)
        self.assertGreater(ms[0].memory_total_bytes, 0)
        self.assertIsInstance(ms[0].time, dt.datetime)
        self.assertEqual(self.c.metrics(sb.id, end=start - dt.timedelta(hours=1)), [])
        with self.assertRaises(atoll.NotFound):
            self.c.metrics(NOPE)

    def test_placement_on_one_machine(self):
        sb = self.sandbox()
        with self.assertRaises((atoll.Conflict, atoll.NotFound)):
            self.c.get_placement(sb.id)

    def test_async(self):
        async def main():
            async with atoll.AsyncClient(os.environ["ATOLL_URL"], os.environ["ATOLL_API_KEY"]) as c:
                sbs = await asyncio.gather(*(c.create_sandbox(labels={"async": "1"}) for _ in range(3)))
                try:
                    rs = await asyncio.gather(*(c.exec(s.id, shell=f"echo {i}") for i, s in enumerate(sbs)))
                    self.assertEqual([r.stdout for r in rs], [b"0\n", b"1\n", b"2\n"])
                    with self.assertRaises(atoll.NotFound):
                        await c.get_sandbox(NOPE)
                finally:
                    await asyncio.gather(*(c.delete_sandbox(s.id) for s in sbs))

        asyncio.run(main())


class TestExec(TestCase):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox()

    def test_output_and_exit(self):
        r = self.c.exec(self.sb.id, shell="echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (3, b"out\n", b"err\n", False))
        self.assertGreater(r.pid, 0)
        r = self.c.exec(self.sb.id, ["sh", "-c", 'printf "%s|%s|%s" "$A" "$(pwd)" "$(id -un)"'],
                        env={"A": "x y"}, cwd="/tmp", user="user")
        self.assertEqual(r.stdout, b"x y|/tmp|user")
        self.assertEqual(self.c.exec(self.sb.id, ["cat"], stdin="typed in").stdout, b"typed in")
        self.assertEqual(self.c.exec(self.sb.id, ["wc", "-c"], stdin=b"\x00" * 100000).stdout.strip(), b"100000")

    def test_timeout_and_signal(self):
        t0 = time.monotonic()
        r = self.c.exec(self.sb.id, ["sleep", "30"], timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual((r.exit_code, r.signal), (-1, "SIGKILL"))
        self.assertLess(time.monotonic() - t0, 10)

    def test_callbacks_stream_in_order(self):
        got = []
        r = self.c.exec(self.sb.id, shell="for i in 1 2 3; do echo $i; sleep 0.1; done; echo e >&2",
                        on_stdout=lambda b: got.append(("o", b)), on_stderr=lambda b: got.append(("e", b)))
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(b"".join(b for k, b in got if k == "o"), b"1\n2\n3\n")
        self.assertEqual(got[-1], ("e", b"e\n"))
        self.assertEqual(r.stdout, b"")  # handed to the callback, not kept

    def test_exec_stream(self):
        with self.c.exec_stream(self.sb.id, shell="echo a; sleep 0.2; echo b") as s:
            types = [(ev.type, ev.data) for ev in s]
        self.assertEqual(types[0][0], "start")
        self.assertEqual([d for t, d in types if t == "stdout"], [b"a\n", b"b\n"])
        self.assertEqual(types[-1][0], "exit")

    def test_bad_exec(self):
        with self.assertRaises(atoll.Invalid):
            self.c.exec(self.sb.id)  # neither cmd nor shell
        with self.assertRaises(atoll.Invalid):
            self.c.exec(self.sb.id, "echo hi")  # a string, not a list
        with self.assertRaises(atoll.Invalid):
            self.c.exec(self.sb.id, ["true"], user="nobody-here")
        with self.assertRaises(atoll.Invalid):
            self.c.exec(self.sb.id, ["true"], env={"A=B": "c"})
        with self.assertRaises(atoll.NotFound):
            self.c.exec(NOPE, ["true"])
        with self.assertRaises(atoll.TooLarge):
            self.c.exec(self.sb.id, ["cat"], stdin=b"x" * (2 << 20))
        with self.assertRaises(atoll.Invalid):
            self.c.exec(self.sb.id, ["/no/such/binary"])

    def test_background_process(self):
        p = self.c.start_process(self.sb.id, ["sh", "-c", "while read l; do echo got:$l; done; exit 7"],
                                 keep_stdin=True, tag="reader")
        self.assertTrue(p.running)
        self.assertEqual(p.tag, "reader")
        self.assertIn(p.pid, [q.pid for q in self.c.list_processes(self.sb.id)])
        self.assertTrue(self.c.get_process(self.sb.id, p.pid).running)
        with self.c.attach(self.sb.id, p.pid) as s:
            self.c.send_stdin(self.sb.id, p.pid, b"one\n")
            self.c.send_stdin(self.sb.id, p.pid, io.BytesIO(b"two\n"))
            self.c.close_stdin(self.sb.id, p.pid)
            evs = list(s)
        self.assertEqual(b"".join(e.data for e in evs if e.type == "stdout"), b"got:one\ngot:two\n")
        self.assertEqual(evs[-1].exit_code, 7)
        self.eventually(lambda: self.assertFalse(self.c.get_process(self.sb.id, p.pid).running))
        self.assertEqual(self.c.get_process(self.sb.id, p.pid).exit_code, 7)
        with self.assertRaises(atoll.NotFound):
            self.c.get_process(self.sb.id, 999999)
        with self.assertRaises(atoll.NotFound):
            self.c.send_stdin(self.sb.id, 999999, b"x")

    def test_logs(self):
        p = self.c.start_process(self.sb.id, ["sh", "-c", "echo to-out; echo to-err >&2"], tag="logged")
        self.eventually(lambda: self.assertGreaterEqual(
            len([l for l in self.c.logs(self.sb.id) if l.pid == p.pid]), 2))
        mine = [l for l in self.c.logs(self.sb.id) if l.pid == p.pid]
        self.assertEqual({(l.stream, l.line, l.tag) for l in mine},
                         {("stdout", "to-out", "logged"), ("stderr", "to-err", "logged")})
        last = max(l.seq for l in self.c.logs(self.sb.id))
        self.assertEqual(list(self.c.logs(self.sb.id, since=last)), [])
        with self.c.logs(self.sb.id, since=last, follow=True) as s:
            self.c.start_process(self.sb.id, ["echo", "later"])
            self.assertEqual(next(s).line, "later")
        with self.assertRaises(atoll.Invalid):
            list(self.c.logs(self.sb.id, since=-1))
        with self.assertRaises(atoll.NotFound):
            list(self.c.logs(NOPE))

    def test_signals(self):
        p = self.c.start_process(self.sb.id, ["sh", "-c", "trap 'echo term; exit 5' TERM; while true; do sleep 0.05; done"])
        time.sleep(0.3)
        self.c.signal(self.sb.id, p.pid, "TERM")
        r = self.c.wait_process(self.sb.id, p.pid)
        self.assertEqual(r.exit_code, 5)
        p = self.c.start_process(self.sb.id, ["sleep", "30"])
        self.c.signal(self.sb.id, p.pid, 9)
        r = self.c.wait_process(self.sb.id, p.pid)
        self.assertEqual((r.exit_code, r.signal), (-1, "SIGKILL"))
        with self.assertRaises(atoll.Invalid):
            self.c.signal(self.sb.id, p.pid, "SIGNOPE")

    def test_terminal(self):
        p = self.c.start_process(self.sb.id, ["bash", "--norc"], pty=(24, 80), env={"PS1": "$ "})
        self.assertTrue(p.pty)
        with self.c.terminal(self.sb.id, p.pid) as t:
            t.write(b"stty size\n")
            self.assertIn(b"24 80", self._until(t, b"24 80"))
            t.resize(30, 100)
            t.write("stty size\n")
            self.assertIn(b"30 100", self._until(t, b"30 100"))
            self.c.resize(self.sb.id, p.pid, 40, 120)
            t.write(b"stty size; exit 4\n")
            self.assertIn(b"40 120", t.read_all())
            self.assertEqual(t.wait(), 4)
        with self.assertRaises(atoll.NotFound):
            self.c.terminal(self.sb.id, 999999)

    @staticmethod
    def _until(t, want: bytes) -> bytes:
        out = b""
        while want not in out:
            b = t.read()
            if not b:
                break
            out += b
        return out


class TestFiles(TestCase):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox()

    def test_read_write_stat(self):
        id = self.sb.id
        fi = self.c.write_file(id, "/home/user/d/a.txt", "hello", mode=0o640)
        self.assertEqual((fi.name, fi.size, fi.mode, fi.type), ("a.txt", 5, 0o640, "file"))
        self.assertEqual(self.c.read_file(id, "/home/user/d/a.txt"), b"hello")
        # Streamed bodies: a file and an iterable of chunks of unknown length.
        big = os.urandom(3 << 20)
        self.assertEqual(self.c.write_file(id, "/tmp/big", io.BytesIO(big)).size, len(big))
        with self.c.open_file(id, "/tmp/big") as f:
            self.assertEqual(f.read(), big)
        self.c.write_file(id, "/tmp/chunks", (bytes([65 + i]) * 1000 for i in range(5)))
        self.assertEqual(self.c.read_file(id, "/tmp/chunks"), b"".join(bytes([65 + i]) * 1000 for i in range(5)))
        st = self.c.stat(id, "/home/user/d")
        self.assertEqual(st.type, "dir")
        self.assertTrue(self.c.exists(id, "/tmp/big"))
        self.assertFalse(self.c.exists(id, "/tmp/nope"))
        with self.assertRaises(atoll.NotFound):
            self.c.read_file(id, "/tmp/nope")
        with self.assertRaises(atoll.Invalid):
            self.c.read_file(id, "relative/path")
        # A refusal before the body is read arrives as such, large body or not.
        with self.assertRaises(atoll.Invalid):
            self.c.write_file(id, "relative", b"x" * (8 << 20))
        with self.assertRaises(atoll.NotFound):
            self.c.write_file(NOPE, "/tmp/x", b"x" * (1 << 20))

    def test_dirs(self):
        id = self.sb.id
        self.assertEqual(self.c.mkdir(id, "/tmp/a/b/c", 0o700).mode, 0o700)
        self.c.write_file(id, "/tmp/a/f", b"1")
        names = sorted(f.name for f in self.c.list_dir(id, "/tmp/a"))
        self.assertEqual(names, ["b", "f"])
        self.assertEqual(self.c.rename(id, "/tmp/a/f", "/tmp/a/g").name, "g")
        self.assertEqual(self.c.chmod(id, "/tmp/a/g", 0o600).mode, 0o600)
        with self.assertRaises(atoll.NotFound):
            self.c.list_dir(id, "/tmp/nope")
        with self.assertRaises(atoll.NotFound):
            self.c.rename(id, "/tmp/nope", "/tmp/x")
        with self.assertRaises((atoll.Conflict, atoll.Invalid)):
            self.c.remove(id, "/tmp/a")  # not empty
        self.c.remove(id, "/tmp/a", recursive=True)
        with self.assertRaises(atoll.NotFound):
            self.c.stat(id, "/tmp/a")

    def test_tar(self):
        id = self.sb.id
        with tempfile.TemporaryDirectory() as src:
            os.makedirs(os.path.join(src, "sub"))
            with open(os.path.join(src, "sub", "x.txt"), "w") as f:
                f.write("x")
            with open(os.path.join(src, "run.sh"), "w") as f:
                f.write("#!/bin/sh\necho ran\n")
            os.chmod(os.path.join(src, "run.sh"), 0o755)
            self.c.upload_dir(id, src, "/work")
        self.assertEqual(self.sh(id, "/work/run.sh; cat /work/sub/x.txt"), "ran\nx")
        with tempfile.TemporaryDirectory() as dst:
            self.c.download_dir(id, "/work", dst)
            with open(os.path.join(dst, "sub", "x.txt")) as f:
                self.assertEqual(f.read(), "x")
            self.assertTrue(os.access(os.path.join(dst, "run.sh"), os.X_OK))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("t.txt")
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"tar"))
        self.c.upload_tar(id, "/work", buf.getvalue())
        with self.c.download_tar(id, "/work/t.txt") as r, tarfile.open(fileobj=r, mode="r|") as tf:
            m = next(iter(tf))
            self.assertEqual(tf.extractfile(m).read(), b"tar")
        # A hostile tar: the agent refuses what would leave the directory.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("../../etc/evil")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"x"))
        with self.assertRaises(atoll.Invalid):
            self.c.upload_tar(id, "/work", buf.getvalue())
        self.assertFalse(self.c.exists(id, "/etc/evil"))
        with self.assertRaises(atoll.NotFound):
            self.c.download_tar(id, "/nope")
        with self.assertRaises(atoll.Invalid):
            self.c.upload_dir(id, "/definitely/not/here", "/work")

    def test_watch(self):
        id = self.sb.id
        self.c.mkdir(id, "/tmp/w")
        with self.c.watch(id, "/tmp/w", recursive=True) as events:
            self.c.write_file(id, "/tmp/w/new.txt", b"1")
            seen = set()
            for ev in events:
                seen.add((ev.type, ev.path))
                if ("create", "/tmp/w/new.txt") in seen or ("write", "/tmp/w/new.txt") in seen:
                    break
        self.assertTrue(any(p == "/tmp/w/new.txt" for _, p in seen), seen)
        with self.assertRaises(atoll.NotFound):
            self.c.watch(id, "/tmp/nope")


class TestSnapshotsForks(TestCase):
    def test_snapshot_restore_fork(self):
        sb = self.sandbox()
        self.sh(sb.id, "echo v1 > /root/v")
        snap = self.c.create_snapshot(sb.id, name="py-v1")
        self.addCleanup(self._delete_snapshot, snap.id)
        self.assertEqual((snap.name, snap.sandbox_id, snap.state), ("py-v1", sb.id, "ready"))
        self.assertEqual(self.c.get_snapshot(snap.id).id, snap.id)
        self.assertIn(snap.id, [s.id for s in self.c.list_snapshots(sb.id)])
        self.assertIn(snap.id, [s.id for s in self.c.list_snapshots()])
        self.sh(sb.id, "echo v2 > /root/v")
        self.c.restore_sandbox(sb.id, snap.id)
        self.assertEqual(self.sh(sb.id, "cat /root/v"), "v1\n")
        with self.assertRaises(atoll.NotFound):
            self.c.restore_sandbox(sb.id, NOPE)

        from_snap = self.sandbox(snapshot=snap.id)
        self.assertEqual(self.sh(from_snap.id, "cat /root/v"), "v1\n")

        kids = self.c.fork_sandbox(sb.id, 3, labels={"forked": "yes"})
        for k in kids:
            self.addCleanup(self._delete, k.id)
        self.assertEqual(len(kids), 3)
        self.assertEqual({k.labels.get("forked") for k in kids}, {"yes"})
        self.assertEqual({self.sh(k.id, "cat /root/v") for k in kids}, {"v1\n"})
        self.sh(kids[0].id, "echo mine > /root/v")
        self.assertEqual(self.sh(kids[1].id, "cat /root/v"), "v1\n")
        with self.assertRaises(atoll.Invalid):
            self.c.fork_sandbox(sb.id, 1000)
        with self.assertRaises(atoll.NotFound):
            self.c.fork_sandbox(NOPE)

        # The sandbox made from a snapshot keeps its files when the
        # snapshot is deleted.
        self.c.delete_snapshot(snap.id)
        self.assertEqual(self.sh(from_snap.id, "cat /root/v"), "v1\n")
        other = self.c.create_snapshot(sb.id)
        self.assertIn(self.c.archive_snapshot(other.id).state, ("archived", "archiving"))
        self.eventually(lambda: self.assertEqual(self.c.get_snapshot(other.id).state, "archived"), 60)
        self.c.delete_snapshot(other.id)
        with self.assertRaises(atoll.NotFound):
            self.c.get_snapshot(other.id)

    def _delete_snapshot(self, id):
        try:
            self.c.delete_snapshot(id)
        except atoll.Error:
            pass


class TestTemplates(TestCase):
    def test_build_tag_delete(self):
        events = []
        with tempfile.TemporaryDirectory() as ctx:
            with open(os.path.join(ctx, "Dockerfile"), "w") as f:
                f.write("FROM host\nARG WHO=nobody\nCOPY hello.txt /opt/hello.txt\n"
                        "ENV BY=$WHO\nRUN echo \"built by $BY\" > /opt/who\nENV PYSDK=1\n")
            with open(os.path.join(ctx, "hello.txt"), "w") as f:
                f.write("hello from the context\n")
            t = self.c.build_template("py-sdk-tpl", ctx, build_args={"WHO": "python"},
                                      on_event=events.append)
        self.addCleanup(self._delete_template, "py-sdk-tpl")
        self.assertEqual(t.name, "py-sdk-tpl")
        self.assertIn("PYSDK=1", t.env)
        self.assertIn("BY=python", t.env)
        self.assertTrue(any(e.type == "step" for e in events))
        self.assertEqual(self.c.get_template("py-sdk-tpl").version_id, t.version_id)
        self.assertIn("py-sdk-tpl", [x.name for x in self.c.list_templates()])
        sb = self.sandbox(template="py-sdk-tpl")
        self.assertEqual(self.sh(sb.id, "cat /opt/hello.txt /opt/who; echo $PYSDK"),
                         "hello from the context\nbuilt by python\n1\n")
        tagged = self.c.tag_template("py-sdk-tpl", "py-sdk-tag")
        self.addCleanup(self._delete_template, "py-sdk-tag")
        self.assertEqual(tagged.version_id, t.version_id)
        removed = self.c.delete_template("py-sdk-tag")
        self.assertEqual(removed.name, "py-sdk-tag")
        with self.assertRaises(atoll.NotFound):
            self.c.get_template("py-sdk-tag")

    def test_build_errors(self):
        def build(dockerfile: str):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tf:
                ti = tarfile.TarInfo("Dockerfile")
                data = dockerfile.encode()
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            return self.c.build_template("py-sdk-bad", buf.getvalue())

        with self.assertRaises(atoll.Error) as cm:
            build("FROM host\nRUN exit 3\n")
        self.assertIn("exit", str(cm.exception))
        with self.assertRaises(atoll.Invalid):
            build("FROM host\nCOPY ../../etc/passwd /x\n")
        with self.assertRaises(atoll.Invalid):
            self.c.build_template("bad name!", b"")
        with self.assertRaises(atoll.NotFound):
            self.c.get_template("no-such-template")
        with self.assertRaises(atoll.NotFound):
            self.c.delete_template("no-such-template")
        with self.assertRaises(atoll.Invalid):
            self.c.import_template("py-import", "not a ref!")
        with self.assertRaises(atoll.Invalid):
            self.c.import_template_archive("py-import", b"this is not a tar")
        with self.assertRaises(atoll.Invalid):
            self.c.bootstrap_template("py-boot", "nodistro")
        with self.assertRaises(atoll.Invalid):
            self.c.bootstrap_template("py-boot", build="nosuchtemplate")
        with self.assertRaises(atoll.Invalid):
            self.c.bootstrap_template("py-boot", build_args={"NPM_REGISTRY": ""})
        with self.assertRaises(atoll.Invalid):
            self.c.bootstrap_template("py-boot", build="code-interpreter", build_args={"": "x"})

    def _delete_template(self, name):
        try:
            self.c.delete_template(name)
        except atoll.NotFound:
            pass


class TestNetworkPorts(TestCase):
    def setUp(self):
        super().setUp()
        self.inet = os.environ.get("ATOLL_TEST_INET")
        if not self.inet:
            self.skipTest("ATOLL_TEST_INET is not set: the server runs without networking")

    def test_network_policy(self):
        sb = self.sandbox()
        url = f"http://{self.inet}/"
        fetch = f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{url}\", timeout=3).status)'"
        self.assertEqual(self.sh(sb.id, fetch), "200\n")
        net = self.c.get_network(sb.id)
        self.assertTrue(net.ipv4)
        net = self.c.set_network(sb.id, atoll.NetworkPolicy(egress="deny-all"))
        self.assertEqual(net.policy.egress, "deny-all")
        self.assertNotEqual(self.c.exec(sb.id, shell=fetch).exit_code, 0)
        net = self.c.set_network(sb.id, {"egress": "deny-all", "allow": [self.inet]})
        self.assertEqual(net.policy.allow, [self.inet])
        self.assertEqual(self.sh(sb.id, fetch), "200\n")
        with self.assertRaises(atoll.Invalid):
            self.c.set_network(sb.id, {"egress": "sometimes"})
        denied = self.sandbox(network=atoll.NetworkPolicy(egress="deny-all"))
        self.assertEqual(self.c.get_network(denied.id).policy.egress, "deny-all")

    def test_ports(self):
        sb = self.sandbox()
        self.c.start_process(sb.id, ["python3", "-m", "http.server", "8080", "--directory", "/tmp"])
        self.c.write_file(sb.id, "/tmp/index.html", b"served")
        pu = self.c.port_url(sb.id, 8080, signed_for=60)
        self.assertEqual((pu.port, pu.public), (8080, False))
        self.assertTrue(pu.signed_url and pu.token)

        def fetch(url, headers=None):
            # Names under .localhost are loopback (RFC 6761), as browsers
            # and curl resolve them; the host's resolver need not know them
            # (without DNS it fails), so connect to 127.0.0.1 as curl does.
            u = urllib.parse.urlsplit(url)
            headers = dict(headers or {})
            if u.hostname and u.hostname.endswith(".localhost"):
                headers["Host"] = u.netloc
                url = urllib.parse.urlunsplit(u._replace(netloc="127.0.0.1" + (f":{u.port}" if u.port else "")))
            req = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        def served():
            st, body = fetch(pu.signed_url)
            self.assertEqual((st, body), (200, b"served"))

        self.eventually(served, 15)
        self.assertIn(fetch(pu.url)[0], (401, 403))
        self.assertTrue(self.c.set_ports(sb.id, public=True).ports.public)
        self.assertEqual(fetch(pu.url), (200, b"served"))
        with self.assertRaises(atoll.Invalid):
            self.c.port_url(sb.id, 70000)


class TestKeysTenants(TestCase):
    def test_keys_and_quota(self):
        k = self.c.create_key("py-tenant-key", tenant="py-tenant")
        self.addCleanup(self._delete_key, k.id)
        self.assertTrue(k.key)
        self.assertEqual(k.tenant, "py-tenant")
        self.assertIn(k.id, [x.id for x in self.c.list_keys()])
        self.assertNotIn("", [x.key for x in self.c.list_keys() if x.key])  # keys are not shown again
        tc = atoll.Client(os.environ["ATOLL_URL"], k.key)
        with self.assertRaises(atoll.Forbidden):
            tc.list_keys()
        with self.assertRaises(atoll.Forbidden):
            tc.create_key("x")
        with self.assertRaises(atoll.Forbidden):
            tc.set_quota("py-tenant", max_sandboxes=100)

        t = self.c.set_quota("py-tenant", max_sandboxes=1, max_memory_mib=4096)
        self.assertEqual((t.quota.max_sandboxes, t.quota.max_memory_mib), (1, 4096))
        self.assertIn("py-tenant", [x.name for x in self.c.list_tenants()])
        sb = tc.create_sandbox()
        try:
            self.assertEqual(tc.get_tenant("py-tenant").used.sandboxes, 1)
            with self.assertRaises(atoll.QuotaExceeded) as cm:
                tc.create_sandbox()
            self.assertEqual(cm.exception.status, 429)
            self.assertEqual(cm.exception.quota["name"], "max_sandboxes")
            # Tenants do not see each other's sandboxes.
            with self.assertRaises(atoll.NotFound):
                self.c.get_sandbox(sb.id) if False else tc.get_sandbox(self.sandbox().id)
        finally:
            tc.delete_sandbox(sb.id)
        with self.assertRaises(atoll.Invalid):
            self.c.set_quota("py-tenant", max_sandboxes=-1)
        self.c.delete_key(k.id)
        with self.assertRaises(atoll.Unauthorized):
            tc.list_sandboxes()
        with self.assertRaises(atoll.NotFound):
            self.c.delete_key(k.id)

    def _delete_key(self, id):
        try:
            self.c.delete_key(id)
        except atoll.NotFound:
            pass


class TestJournal(TestCase):
    def test_events(self):
        c = client(timeout=30)
        try:
            c.events().close()
        except atoll.Unavailable as e:
            # A server without a journal says so.
            self.assertIn("events", e.message)
            return
        with c.events(types=["created", "stopped"]) as events:
            sb = self.sandbox()
            self.c.stop_sandbox(sb.id)
            seen = []
            for ev in events:
                self.assertIsInstance(ev, atoll.Event)
                self.assertIn(ev.type, ("created", "stopped"))
                if ev.sandbox == sb.id:
                    seen.append(ev.type)
                    if ev.type == "stopped":
                        break
        self.assertEqual(seen, ["created", "stopped"])
        last = None
        with c.events(after=0, sandbox=sb.id) as events:
            last = next(iter(events))
        self.assertEqual(last.sandbox, sb.id)
        with self.assertRaises(atoll.Invalid):
            c.events(types=["no-such-type"])

    def test_webhooks(self):
        try:
            self.c.list_webhooks()
        except atoll.Unavailable as e:
            # A server that sends no webhooks says so, to every call.
            self.assertIn("webhooks", e.message)
            with self.assertRaises(atoll.Unavailable):
                self.c.create_webhook("http://127.0.0.1:9/hook")
            return
        # An address outside the server's private ranges (the test
        # world's internet host when there is one).
        url = "http://%s:8080/hook" % os.environ.get("ATOLL_TEST_INET", "198.51.100.1")
        w = self.c.create_webhook(url, ["created"])
        self.addCleanup(self._delete_webhook, w.id)
        self.assertTrue(w.secret)
        self.assertEqual(w.events, ["created"])
        self.assertIn(w.id, [x.id for x in self.c.list_webhooks()])
        self.assertEqual([x.secret for x in self.c.list_webhooks() if x.id == w.id], [""])
        self.assertIsInstance(self.c.webhook_deliveries(w.id, limit=5), list)
        with self.assertRaises(atoll.Invalid):
            self.c.create_webhook("not a url")
        with self.assertRaises(atoll.Invalid):
            self.c.create_webhook("http://127.0.0.1:9/hook")  # loopback
        with self.assertRaises(atoll.Invalid):
            self.c.create_webhook(url, ["no-such-type"])
        self.c.delete_webhook(w.id)
        with self.assertRaises(atoll.NotFound):
            self.c.delete_webhook(w.id)

    def _delete_webhook(self, id):
        try:
            self.c.delete_webhook(id)
        except atoll.NotFound:
            pass

    def test_usage_and_audit(self):
        sb = self.sandbox(labels={"team": "py"})
        rep = self.c.usage(step="1h", group_by="label:team")
        self.assertEqual((rep["step"], rep["group_by"]), ("1h", "label:team"))
        self.assertIsInstance(rep["usage"], list)
        with self.assertRaises(atoll.Invalid):
            self.c.usage(step="7s")
        page = self.c.audit(sandbox=sb.id, limit=5)
        self.assertIsInstance(page["entries"], list)
        self.assertTrue(all(e["target"] == sb.id for e in page["entries"]), page)
        k = self.c.create_key("py-audit", tenant="py-audit")
        try:
            with self.assertRaises(atoll.Forbidden):
                atoll.Client(os.environ["ATOLL_URL"], k.key).audit()
        finally:
            self.c.delete_key(k.id)


class TestVaults(TestCase):
    def test_vault(self):
        try:
            v = self.c.create_vault("py-notes")
        except atoll.Unavailable:
            self.skipTest("the server keeps no vaults")
        self.addCleanup(self._delete, "py-notes")
        self.assertEqual(v.name, "py-notes")
        self.assertIn("py-notes", [x.name for x in self.c.list_vaults()])
        self.assertEqual(self.c.get_vault("py-notes").name, "py-notes")
        with self.assertRaises(atoll.Conflict):
            self.c.create_vault("py-notes")
        with self.assertRaises(atoll.Invalid):
            self.c.create_vault("Bad Name!")
        self.assertIsInstance(self.c.vault_log("py-notes"), list)
        self.assertTrue(self.c.vault_git_url("py-notes").endswith("/git/py-notes.git"))
        res = self.c.search_vault("py-notes", "anything")
        self.assertIsInstance(res, dict)
        self.assertIsInstance(self.c.vault_links("py-notes"), dict)
        self.assertIsInstance(self.c.compact_vault("py-notes"), dict)
        with self.assertRaises(atoll.NotFound):
            self.c.read_vault_file("py-notes", "entities/nope.md")
        with self.assertRaises((atoll.Conflict, atoll.Unavailable)):
            self.c.vault_credentials("py-notes")
        self.assertEqual(self.c.update_vault("py-notes", compact="off").name, "py-notes")
        with self.assertRaises(atoll.Invalid):
            self.c.update_vault("py-notes", compact="hourly")
        self.assertIsInstance(self.c.vault_events("py-notes", limit=3), list)
        self.c.delete_vault("py-notes")
        with self.assertRaises(atoll.NotFound):
            self.c.get_vault("py-notes")

    def _delete(self, name):
        try:
            self.c.delete_vault(name, force=True)
        except atoll.NotFound:
            pass


if __name__ == "__main__":
    unittest.main()
