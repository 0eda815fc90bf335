"""The client of atoll's HTTP API (sdk/go in Go)."""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import socket
import ssl
import tarfile
import tempfile
import time
from typing import (Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Tuple, Union)

from . import errors
from ._http import Body, Transport, ndjson, quote, read_json
from .types import (APIKey, BuildEvent, CodeContext, Delivery, Event, ExecEvent, Execution,
                    ExecutionError, ExecResult, FileInfo, Health, ImportEvent, LogEntry, Metric,
                    NetworkPolicy, Node, PortURL, Process, Result, Runtime, Sandbox,
                    SandboxNetwork, Snapshot, Template, TemplateRemoved, Tenant, TenantQuota,
                    Vault, VaultCommit, VaultMount, WatchEvent, Webhook, decode)

#: how many times a create the server refused as busy is sent again
DEFAULT_BUSY_RETRIES = 30


def _sandbox_path(id: str, rest: str = "") -> str:
    return "/v1/sandboxes/" + quote(id) + rest


def _process_path(id: str, pid: int, rest: str = "") -> str:
    return _sandbox_path(id, f"/processes/{int(pid)}{rest}")


def _drop_none(d: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class Stream:
    """An NDJSON stream of events (exec output, attach, watch), iterable
    and a context manager; close it to stop reading early.

        with c.watch(sb.id, "/home/user") as events:
            for ev in events:
                ...
    """

    def __init__(self, resp, tp: type):
        self._resp = resp
        self._it = ndjson(resp)
        self._tp = tp

    def __iter__(self):
        return self

    def __next__(self):
        return decode(self._tp, next(self._it))

    def close(self) -> None:
        self._it.close()
        self._resp.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EventStream:
    """Lifecycle events from a Server-Sent Events answer (Client.events):
    an iterator of Event and a context manager."""

    def __init__(self, resp):
        self._resp = resp

    def __iter__(self):
        return self

    def __next__(self) -> Event:
        data: List[str] = []
        while True:
            line = self._resp.readline()
            if not line:
                self.close()
                raise StopIteration
            line = line.decode().rstrip("\r\n")
            if line == "":
                if data:
                    return decode(Event, json.loads("\n".join(data)))
                continue  # a comment's end, or a keep-alive
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            # id:, event: and comments: the data holds all of it.

    def close(self) -> None:
        self._resp.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """A client of an atoll server, or of any of the nodes of a cluster.
    Safe to use from several threads: every call is its own connection.

        c = atoll.Client("http://localhost:7070", os.environ["ATOLL_API_KEY"])
        sb = c.create_sandbox(template="host")
        r = c.exec(sb.id, shell="uname -a")
        print(r.stdout.decode())
        c.delete_sandbox(sb.id)

    base_url may name several servers separated by commas: a request that
    cannot connect to one goes to the next. With no arguments, the URL and
    key come from ATOLL_URL and ATOLL_API_KEY, as the CLI's do.
    ``timeout`` bounds each socket operation (connect, and each read), not
    a whole call; None waits as long as a stream runs.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: Optional[float] = None, user_agent: str = "atoll-python",
                 busy_retries: int = DEFAULT_BUSY_RETRIES,
                 ssl_context: Optional[ssl.SSLContext] = None):
        if base_url is None:
            base_url = os.environ.get("ATOLL_URL", "http://localhost:7070")
        if api_key is None:
            api_key = os.environ.get("ATOLL_API_KEY", "")
        bases = [b.strip().rstrip("/") for b in base_url.split(",") if b.strip()]
        if not bases:
            raise errors.invalid("no server URL")
        self._t = Transport(bases, api_key, timeout=timeout, user_agent=user_agent,
                            busy_retries=busy_retries, ssl_context=ssl_context)

    @property
    def base_url(self) -> str:
        """The URL of the server requests go to now."""
        return self._t.base

    # The verbs every method is made of.

    def _json(self, method: str, path: str, tp: Any = None, **kw) -> Any:
        v = read_json(self._t.request(method, path, **kw))
        return decode(tp, v) if tp is not None else v

    def _list(self, method: str, path: str, key: str, tp: type, **kw) -> list:
        v = read_json(self._t.request(method, path, **kw)) or {}
        return [decode(tp, x) for x in (v.get(key) or [])]

    def _do(self, method: str, path: str, **kw) -> None:
        read_json(self._t.request(method, path, **kw))

    # Server.

    def health(self) -> Health:
        """Whether the server is up; needs no API key."""
        return self._json("GET", "/v1/health", Health)

    def runtimes(self) -> List[Runtime]:
        """The server's runtimes with their capabilities, and those it
        cannot offer, with why."""
        return self._list("GET", "/v1/runtimes", "runtimes", Runtime)

    # Sandboxes.

    def create_sandbox(self, template: Optional[str] = None, *, snapshot: Optional[str] = None,
                       runtime: Optional[str] = None, cpu: Optional[float] = None,
                       memory_mib: Optional[int] = None, disk_gib: Optional[int] = None,
                       pids: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                       labels: Optional[Mapping[str, str]] = None,
                       timeout_sec: Optional[int] = None, ephemeral: Optional[bool] = None,
                       network: Union[NetworkPolicy, Mapping[str, Any], None] = None,
                       public_ports: Optional[bool] = None,
                       vaults: Optional[Sequence[Union[VaultMount, Mapping[str, Any]]]] = None,
                       **more: Any) -> Sandbox:
        """Creates and starts a sandbox. ``more`` takes the other fields of
        the API's CreateSandboxRequest (auto_stop_sec, auto_resume,
        node_selector, ...). A create the server refuses as busy is sent
        again after the wait it asks for."""
        body = _drop_none(dict(template=template, snapshot=snapshot, runtime=runtime, cpu=cpu,
                               memory_mib=memory_mib, disk_gib=disk_gib, pids=pids, env=env,
                               labels=labels, timeout_sec=timeout_sec, ephemeral=ephemeral,
                               network=network, vaults=vaults, **more))
        if public_ports is not None:
            body["ports"] = {"public": public_ports}
        return self._json("POST", "/v1/sandboxes", Sandbox, json_body=body, busy_retry=True)

    def get_sandbox(self, id: str) -> Sandbox:
        return self._json("GET", _sandbox_path(id), Sandbox)

    def list_sandboxes(self, *, state: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None) -> List[Sandbox]:
        """The sandboxes in state (any when None) that have all labels."""
        q: List[Tuple[str, Any]] = []
        if state:
            q.append(("state", state))
        for k, v in (labels or {}).items():
            q.append(("label", f"{k}={v}"))
        return self._list("GET", "/v1/sandboxes", "sandboxes", Sandbox, query=q)

    def metrics(self, id: str, start: Optional[_dt.datetime] = None,
                end: Optional[_dt.datetime] = None) -> List[Metric]:
        """The sandbox's CPU, memory and disk samples between start and end
        (either open when None), oldest first."""
        q = []
        for k, t in (("start", start), ("end", end)):
            if t is not None:
                q.append((k, t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")))
        return self._list("GET", _sandbox_path(id, "/metrics"), "metrics", Metric, query=q)

    def logs(self, id: str, since: int = 0, follow: bool = False) -> Stream:
        """What the sandbox's start command and background processes
        printed, as its agent keeps it (a Stream of LogEntry), after line
        since; with follow, the lines to come too, until closed."""
        q: List[Tuple[str, Any]] = []
        if since:
            q.append(("since", since))
        if follow:
            q.append(("follow", True))
        return Stream(self._t.request("GET", _sandbox_path(id, "/logs"), query=q), LogEntry)

    def get_placement(self, id: str) -> Dict[str, Any]:
        """How the cluster chose the sandbox's node (Conflict on one machine)."""
        return self._json("GET", _sandbox_path(id, "/placement"))

    def stop_sandbox(self, id: str) -> Sandbox:
        """Stops a running sandbox; its files stay."""
        return self._json("POST", _sandbox_path(id, "/stop"), Sandbox)

    def start_sandbox(self, id: str) -> Sandbox:
        """Starts a stopped (or archived) sandbox."""
        return self._json("POST", _sandbox_path(id, "/start"), Sandbox)

    def delete_sandbox(self, id: str) -> None:
        """Deletes a sandbox and everything in it."""
        self._do("DELETE", _sandbox_path(id))

    def archive_sandbox(self, id: str) -> Sandbox:
        """Moves a stopped sandbox's files to object storage."""
        return self._json("POST", _sandbox_path(id, "/archive"), Sandbox)

    def pause_sandbox(self, id: str) -> Sandbox:
        """Freezes a running sandbox's processes, keeping their memory."""
        return self._json("POST", _sandbox_path(id, "/pause"), Sandbox)

    def suspend_sandbox(self, id: str) -> Sandbox:
        """Pauses a sandbox to disk (runtimes with memory_snapshot)."""
        return self._json("POST", _sandbox_path(id, "/pause"), Sandbox, json_body={"to_disk": True})

    def shelve_sandbox(self, id: str) -> Sandbox:
        """Pauses a sandbox without its memory: processes end, files stay."""
        return self._json("POST", _sandbox_path(id, "/pause"), Sandbox, json_body={"memory": False})

    def resume_sandbox(self, id: str) -> Sandbox:
        """Thaws a paused sandbox, restores a suspended one, boots a shelved one."""
        return self._json("POST", _sandbox_path(id, "/resume"), Sandbox)

    def set_timeout(self, id: str, seconds: float) -> Sandbox:
        """Stops the sandbox seconds from now (rounded up), replacing any
        earlier timeout; 0 removes it."""
        sec = int(seconds)
        if seconds > sec:
            sec += 1
        return self._json("POST", _sandbox_path(id, "/timeout"), Sandbox, json_body={"timeout_sec": sec})

    def fork_sandbox(self, id: str, count: int = 1, *, labels: Optional[Mapping[str, str]] = None,
                     memory: Optional[bool] = None) -> List[Sandbox]:
        """Makes count (at most 100) sandboxes from the sandbox's current
        files (and with memory=True its memory, where the runtime can)."""
        body = _drop_none({"count": count, "labels": labels, "memory": memory})
        return self._list("POST", _sandbox_path(id, "/fork"), "sandboxes", Sandbox, json_body=body)

    def restore_sandbox(self, id: str, snapshot: str) -> Sandbox:
        """Puts the snapshot's files back into the sandbox; what was written
        since is lost."""
        return self._json("POST", _sandbox_path(id, "/restore"), Sandbox, json_body={"snapshot": snapshot})

    # Snapshots.

    def create_snapshot(self, id: str, name: Optional[str] = None) -> Snapshot:
        """Takes a snapshot of the sandbox's files."""
        return self._json("POST", _sandbox_path(id, "/snapshots"), Snapshot,
                          json_body=_drop_none({"name": name}))

    def list_snapshots(self, sandbox_id: Optional[str] = None) -> List[Snapshot]:
        """The snapshots of sandbox_id, or all when None."""
        q = [("sandbox", sandbox_id)] if sandbox_id else None
        return self._list("GET", "/v1/snapshots", "snapshots", Snapshot, query=q)

    def get_snapshot(self, id: str) -> Snapshot:
        return self._json("GET", "/v1/snapshots/" + quote(id), Snapshot)

    def delete_snapshot(self, id: str) -> None:
        """Deletes a snapshot (sandboxes made from it keep their copies);
        Conflict while it is being archived."""
        self._do("DELETE", "/v1/snapshots/" + quote(id))

    def archive_snapshot(self, id: str) -> Snapshot:
        """Moves a snapshot's files to the archive store."""
        return self._json("POST", "/v1/snapshots/" + quote(id) + "/archive", Snapshot)

    # Network and ports.

    def get_network(self, id: str) -> SandboxNetwork:
        """The sandbox's addresses and egress policy (Unavailable on a
        server without networking)."""
        return self._json("GET", _sandbox_path(id, "/network"), SandboxNetwork)

    def set_network(self, id: str, policy: Union[NetworkPolicy, Mapping[str, Any]]) -> SandboxNetwork:
        """Replaces the sandbox's egress policy, at once if it runs."""
        return self._json("PUT", _sandbox_path(id, "/network"), SandboxNetwork, json_body=policy)

    def port_url(self, id: str, port: int, signed_for: Optional[float] = None) -> PortURL:
        """Where the port proxy serves the sandbox's port; with signed_for
        (seconds), also a URL that opens it without a header for that long."""
        q = [("ttl_sec", int(signed_for))] if signed_for else None
        return self._json("GET", _sandbox_path(id, f"/ports/{int(port)}"), PortURL, query=q)

    def set_ports(self, id: str, public: bool) -> Sandbox:
        """Whether anyone (public) or only API keys may open the sandbox's ports."""
        return self._json("PUT", _sandbox_path(id, "/ports"), Sandbox, json_body={"public": public})

    # The code interpreter: stateful code contexts (Jupyter kernels) in a
    # sandbox of the code-interpreter template (docs/code-interpreter.md).

    def run_code(self, sandbox_id: str, code: str, *, language: Optional[str] = None,
                 context: Union[str, CodeContext, None] = None,
                 envs: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None) -> Execution:
        """Runs code in a code context (context, or the default one of
        language, python unless given) and returns what it produced; the
        callbacks get its events as they come. envs hold for this execution
        only. timeout (seconds) ends the call, which interrupts the code
        and raises Unavailable; the context and its state stay. An exception
        in the code is the Execution's error, not an exception."""
        if language is not None and context is not None:
            raise errors.invalid("give language or context, not both")
        if timeout is not None and timeout <= 0:
            raise errors.invalid("timeout must be positive")
        if isinstance(context, CodeContext):
            context = context.id
        body = _drop_none(dict(code=code, context_id=context, language=language, env_vars=envs))
        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            return self._run_code(sandbox_id, body, deadline, on_stdout, on_stderr, on_result, on_error)
        except (socket.timeout, TimeoutError):
            # Ending the request interrupted the code.
            raise errors.Unavailable(f"run_code: the code ran past its timeout of {timeout} s and "
                                     "was interrupted; its context stays usable") from None

    def _run_code(self, sandbox_id, body, deadline, on_stdout, on_stderr, on_result,
                  on_error) -> Execution:
        resp = self._t.request("POST", _sandbox_path(sandbox_id, "/code/execute"), json_body=body,
                               timeout=deadline - time.monotonic() if deadline is not None else -1.0)
        ex = Execution()
        try:
            while True:
                if deadline is not None:
                    # A deadline for the whole call, not for each read.
                    resp.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                line = resp.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                ev = json.loads(line)
                kind = ev.get("type")
                if kind == "stdout":
                    ex.logs.stdout.append(ev.get("text", ""))
                    on_stdout and on_stdout(ev.get("text", ""))
                elif kind == "stderr":
                    ex.logs.stderr.append(ev.get("text", ""))
                    on_stderr and on_stderr(ev.get("text", ""))
                elif kind == "result":
                    r = decode(Result, ev)
                    ex.results.append(r)
                    on_result and on_result(r)
                elif kind == "error":
                    ex.error = decode(ExecutionError, ev)
                    on_error and on_error(ex.error)
                elif kind == "number_of_executions":
                    ex.execution_count = ev.get("execution_count")
                elif kind == "end_of_execution":
                    return ex
        finally:
            resp.close()
        raise errors.Unavailable("run_code: the stream ended before the execution's end")

    def create_code_context(self, sandbox_id: str, *, language: Optional[str] = None,
                            cwd: Optional[str] = None) -> CodeContext:
        """Starts a new code context (default python, in /home/user)."""
        return self._json("POST", _sandbox_path(sandbox_id, "/code/contexts"), CodeContext,
                          json_body=_drop_none(dict(language=language, cwd=cwd)))

    def list_code_contexts(self, sandbox_id: str) -> List[CodeContext]:
        """The sandbox's code contexts, the default ones included."""
        return [decode(CodeContext, x) for x in
                read_json(self._t.request("GET", _sandbox_path(sandbox_id, "/code/contexts"))) or []]

    def restart_code_context(self, sandbox_id: str, context: Union[str, CodeContext]) -> None:
        """Restarts a context's kernel: its state is lost."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._do("POST", _sandbox_path(sandbox_id, "/code/contexts/" + quote(cid) + "/restart"))

    def remove_code_context(self, sandbox_id: str, context: Union[str, CodeContext]) -> None:
        """Stops and removes a code context."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._do("DELETE", _sandbox_path(sandbox_id, "/code/contexts/" + quote(cid)))

    # Commands and processes.

    @staticmethod
    def _exec_body(cmd, shell, env, cwd, user, stdin, timeout, keep_stdin=None, tag=None,
                   pty=None, background=None) -> Dict[str, Any]:
        if (cmd is None) == (shell is None):
            raise errors.invalid("give either cmd (a list of arguments) or shell (a script)")
        if isinstance(cmd, str):
            raise errors.invalid("cmd is a list of arguments; use shell= for a command line")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        body = _drop_none(dict(cmd=list(cmd) if cmd is not None else None, shell=shell, env=env,
                               cwd=cwd, user=user, stdin=stdin, keep_stdin=keep_stdin or None,
                               tag=tag, background=background))
        if timeout is not None:
            if timeout < 0:
                raise errors.invalid("timeout must not be negative")
            body["timeout_ms"] = max(1, int(timeout * 1000)) if timeout else 0
        if pty is not None:
            rows, cols = pty
            body["pty"] = {"rows": rows, "cols": cols}
        return body

    def exec(self, id: str, cmd: Optional[Sequence[str]] = None, *, shell: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
             timeout: Optional[float] = None,
             on_stdout: Optional[Callable[[bytes], Any]] = None,
             on_stderr: Optional[Callable[[bytes], Any]] = None) -> ExecResult:
        """Runs a command (cmd, a list of arguments, or shell, a script for
        sh -c) to its end and returns its exit code and output. on_stdout
        and on_stderr, if given, get the output as it arrives (and it is
        not kept in the result). timeout (seconds) kills it; the result
        says timed_out. A non-zero exit is not an exception."""
        res = ExecResult(exit_code=-1)
        out, err = bytearray(), bytearray()
        with self.exec_stream(id, cmd, shell=shell, env=env, cwd=cwd, user=user, stdin=stdin,
                              timeout=timeout) as events:
            for ev in events:
                if ev.type == "start":
                    res.pid = ev.pid
                elif ev.type == "stdout":
                    on_stdout(ev.data) if on_stdout else out.extend(ev.data)
                elif ev.type == "stderr":
                    on_stderr(ev.data) if on_stderr else err.extend(ev.data)
                elif ev.type == "exit":
                    res.exit_code = ev.exit_code if ev.exit_code is not None else -1
                    res.signal, res.timed_out = ev.signal, ev.timed_out
                    res.stdout, res.stderr = bytes(out), bytes(err)
                    return res
                elif ev.type == "error":
                    raise errors.Error("exec: " + ev.message)
        raise errors.Error("exec: the stream ended before the process exited")

    def exec_stream(self, id: str, cmd: Optional[Sequence[str]] = None, *,
                    shell: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Union[bytes, str, None] = None,
                    timeout: Optional[float] = None) -> Stream:
        """Runs a command and returns its events as they happen: start,
        stdout and stderr, then exit or error (a Stream of ExecEvent)."""
        body = self._exec_body(cmd, shell, env, cwd, user, stdin, timeout)
        return Stream(self._t.request("POST", _sandbox_path(id, "/exec"), json_body=body), ExecEvent)

    def start_process(self, id: str, cmd: Optional[Sequence[str]] = None, *,
                      shell: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                      cwd: Optional[str] = None, user: Optional[str] = None,
                      stdin: Union[bytes, str, None] = None, keep_stdin: bool = False,
                      timeout: Optional[float] = None, tag: Optional[str] = None,
                      pty: Optional[Tuple[int, int]] = None) -> Process:
        """Starts a command in the background and returns it at once.
        keep_stdin leaves its stdin open for send_stdin; pty=(rows, cols)
        runs it on a terminal (connect with terminal)."""
        body = self._exec_body(cmd, shell, env, cwd, user, stdin, timeout, keep_stdin, tag, pty,
                               background=True)
        return self._json("POST", _sandbox_path(id, "/exec"), Process, json_body=body)

    def list_processes(self, id: str) -> List[Process]:
        """The processes the sandbox's agent started."""
        return self._list("GET", _sandbox_path(id, "/processes"), "processes", Process)

    def get_process(self, id: str, pid: int) -> Process:
        return self._json("GET", _process_path(id, pid), Process)

    def attach(self, id: str, pid: int) -> Stream:
        """A process's output from now on, then its exit (a Stream of ExecEvent)."""
        return Stream(self._t.request("GET", _process_path(id, pid, "/attach")), ExecEvent)

    def wait_process(self, id: str, pid: int) -> ExecResult:
        """Waits for a background process to end, collecting its output from now on."""
        res = ExecResult(exit_code=-1, pid=pid)
        out, err = bytearray(), bytearray()
        with self.attach(id, pid) as events:
            for ev in events:
                if ev.type == "stdout":
                    out.extend(ev.data)
                elif ev.type == "stderr":
                    err.extend(ev.data)
                elif ev.type == "exit":
                    res.exit_code = ev.exit_code if ev.exit_code is not None else -1
                    res.signal, res.timed_out = ev.signal, ev.timed_out
                    break
                elif ev.type == "error":
                    raise errors.Error("attach: " + ev.message)
        res.stdout, res.stderr = bytes(out), bytes(err)
        return res

    def send_stdin(self, id: str, pid: int, data: Union[bytes, str, BinaryIO]) -> None:
        """Writes data to the process's stdin (started with keep_stdin or a pty)."""
        self._do("POST", _process_path(id, pid, "/stdin"), body=data, ctype="application/octet-stream")

    def close_stdin(self, id: str, pid: int) -> None:
        self._do("POST", _process_path(id, pid, "/stdin/close"))

    def signal(self, id: str, pid: int, signal: Union[str, int] = "SIGTERM") -> None:
        """Sends a signal ("SIGTERM", "TERM" or a number) to the process."""
        self._do("POST", _process_path(id, pid, "/signal"), json_body={"signal": str(signal)})

    def resize(self, id: str, pid: int, rows: int, cols: int) -> None:
        """Resizes a pty process's terminal."""
        self._do("POST", _process_path(id, pid, "/resize"), json_body={"rows": rows, "cols": cols})

    def terminal(self, id: str, pid: int, *, timeout: Optional[float] = None) -> "Terminal":
        """Connects to a pty process (start_process with pty=) over a websocket."""
        from .terminal import Terminal
        return Terminal.connect(self._t, _process_path(id, pid, "/ws"), timeout=timeout)

    # Files.

    def read_file(self, id: str, path: str) -> bytes:
        """The contents of the file at path."""
        with self.open_file(id, path) as f:
            return f.read()

    def open_file(self, id: str, path: str) -> BinaryIO:
        """The file at path as a stream to read; close it when done."""
        return self._t.request("GET", _sandbox_path(id, "/files"), query=[("path", path)])  # type: ignore[return-value]

    def write_file(self, id: str, path: str, data: Union[bytes, str, BinaryIO, Iterable[bytes]],
                   mode: Optional[int] = None) -> FileInfo:
        """Writes data (bytes, str, an open binary file or an iterable of
        bytes, streamed) to the file at path, making its parents. mode holds
        permission bits as in chmod (e.g. 0o755)."""
        q: List[Tuple[str, Any]] = [("path", path)]
        if mode:
            q.append(("mode", "%04o" % mode))
        return self._json("PUT", _sandbox_path(id, "/files"), FileInfo, query=q, body=data,
                          ctype="application/octet-stream")

    def stat(self, id: str, path: str) -> FileInfo:
        """Describes path without following a final symlink."""
        return self._json("GET", _sandbox_path(id, "/files/stat"), FileInfo, query=[("path", path)])

    def exists(self, id: str, path: str) -> bool:
        try:
            self.stat(id, path)
            return True
        except errors.NotFound:
            return False

    def list_dir(self, id: str, path: str) -> List[FileInfo]:
        return self._list("GET", _sandbox_path(id, "/files/list"), "files", FileInfo, query=[("path", path)])

    def mkdir(self, id: str, path: str, mode: int = 0) -> FileInfo:
        """Makes the directory path and its parents (mode 0 is 0o755)."""
        return self._json("POST", _sandbox_path(id, "/files/mkdir"), FileInfo,
                          json_body=_drop_none({"path": path, "mode": mode or None}))

    def remove(self, id: str, path: str, recursive: bool = False) -> None:
        """Removes a file or directory; a non-empty directory only if recursive."""
        q: List[Tuple[str, Any]] = [("path", path)]
        if recursive:
            q.append(("recursive", True))
        self._do("DELETE", _sandbox_path(id, "/files"), query=q)

    def rename(self, id: str, src: str, dst: str) -> FileInfo:
        return self._json("POST", _sandbox_path(id, "/files/rename"), FileInfo,
                          json_body={"from": src, "to": dst})

    def chmod(self, id: str, path: str, mode: int) -> FileInfo:
        return self._json("POST", _sandbox_path(id, "/files/chmod"), FileInfo,
                          json_body={"path": path, "mode": mode})

    def download_tar(self, id: str, path: str) -> BinaryIO:
        """A tar stream of the directory at path (or of the one file);
        close it when done."""
        return self._t.request("GET", _sandbox_path(id, "/files/tar"), query=[("path", path)])  # type: ignore[return-value]

    def upload_tar(self, id: str, path: str, data: Union[bytes, BinaryIO, Iterable[bytes]]) -> None:
        """Extracts a tar stream under the directory path."""
        self._do("PUT", _sandbox_path(id, "/files/tar"), query=[("path", path)], body=data,
                 ctype="application/x-tar")

    def upload_dir(self, id: str, local_dir: Union[str, os.PathLike], path: str) -> None:
        """Copies the local directory's contents under the sandbox's path."""
        with tempfile.TemporaryFile() as f:
            _tar_dir(local_dir, f)
            f.seek(0)
            self.upload_tar(id, path, f)

    def download_dir(self, id: str, path: str, local_dir: Union[str, os.PathLike]) -> None:
        """Copies the sandbox's directory at path (or file) into local_dir,
        refusing entries that would land outside it."""
        os.makedirs(local_dir, exist_ok=True)
        with self.download_tar(id, path) as r, tarfile.open(fileobj=r, mode="r|") as tf:
            for m in tf:
                _extract_member(tf, m, os.fspath(local_dir))

    def watch(self, id: str, path: str, recursive: bool = False) -> Stream:
        """Changes under path as they happen (a Stream of WatchEvent), until closed."""
        q = [("path", path), ("recursive", bool(recursive))]
        return Stream(self._t.request("GET", _sandbox_path(id, "/files/watch"), query=q), WatchEvent)

    # Templates.

    def build_template(self, name: str, context: Union[str, os.PathLike, bytes, BinaryIO], *,
                       dockerfile: Optional[str] = None,
                       build_args: Optional[Mapping[str, str]] = None,
                       on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Template:
        """Builds template name from the Dockerfile in context: a local
        directory, or a tar of one (bytes or an open file), streamed to the
        server. on_event gets each "step" and "log" event. A failed build
        raises its Error."""
        q: List[Tuple[str, Any]] = [("name", name)]
        if dockerfile:
            q.append(("dockerfile", dockerfile))
        for k in sorted(build_args or {}):
            q.append(("build_arg", f"{k}={build_args[k]}"))  # type: ignore[index]
        if isinstance(context, (str, os.PathLike)):
            with tempfile.TemporaryFile() as f:
                _tar_dir(context, f)
                f.seek(0)
                resp = self._t.request("POST", "/v1/templates/build", query=q, body=f,
                                       ctype="application/x-tar")
                return _read_events(resp, "build", ("step", "log"), BuildEvent, on_event)
        resp = self._t.request("POST", "/v1/templates/build", query=q, body=context,
                               ctype="application/x-tar")
        return _read_events(resp, "build", ("step", "log"), BuildEvent, on_event)

    def import_template(self, name: str, ref: str, *, username: Optional[str] = None,
                        password: Optional[str] = None, insecure: Optional[bool] = None,
                        on_event: Optional[Callable[[ImportEvent], Any]] = None) -> Template:
        """Imports the image ref from a registry as template name."""
        body = _drop_none(dict(name=name, ref=ref, username=username, password=password,
                               insecure=insecure))
        resp = self._t.request("POST", "/v1/templates/import", json_body=body)
        return _read_events(resp, "import", ("progress",), ImportEvent, on_event)

    def import_template_archive(self, name: str, archive: Union[bytes, BinaryIO], *,
                                on_event: Optional[Callable[[ImportEvent], Any]] = None) -> Template:
        """Imports the image in a `docker save` or OCI archive (tar) as template name."""
        resp = self._t.request("POST", "/v1/templates/import", query=[("name", name)],
                               body=archive, ctype="application/x-tar")
        return _read_events(resp, "import", ("progress",), ImportEvent, on_event)

    def bootstrap_template(self, name: str, distro: str = "debian", *, suite: Optional[str] = None,
                           mirror: Optional[str] = None, variant: Optional[str] = None,
                           build: Optional[str] = None, build_args: Optional[Dict[str, str]] = None,
                           on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Template:
        """Makes a template with debootstrap on the server: the Debian
        system itself, or, with build ("base", "code-interpreter"), one of
        atoll's own templates built over it, build_args setting its
        Dockerfile's ARGs."""
        body = _drop_none(dict(name=name, distro=distro, suite=suite, mirror=mirror, variant=variant,
                               build=build, build_args=build_args))
        resp = self._t.request("POST", "/v1/templates/bootstrap", json_body=body)
        return _read_events(resp, "bootstrap", ("step", "log"), BuildEvent, on_event)

    def list_templates(self) -> List[Template]:
        return self._list("GET", "/v1/templates", "templates", Template)

    def get_template(self, name: str) -> Template:
        return self._json("GET", "/v1/templates/" + quote(name), Template)

    def delete_template(self, name: str) -> TemplateRemoved:
        """Removes the name; versions stay while something holds them."""
        return self._json("DELETE", "/v1/templates/" + quote(name), TemplateRemoved)

    def tag_template(self, name: str, tag: str) -> Template:
        """Points the name tag at the current version of template name (or NAME@VERSION)."""
        return self._json("POST", "/v1/templates/" + quote(name) + "/tag", Template, json_body={"tag": tag})

    # Keys, tenants, nodes.

    def create_key(self, name: str, tenant: Optional[str] = None) -> APIKey:
        """Issues an API key (admin keys only); its key is the only copy."""
        return self._json("POST", "/v1/keys", APIKey, json_body=_drop_none({"name": name, "tenant": tenant}))

    def list_keys(self) -> List[APIKey]:
        return self._list("GET", "/v1/keys", "keys", APIKey)

    def delete_key(self, id: str) -> None:
        self._do("DELETE", "/v1/keys/" + quote(id))

    def list_tenants(self) -> List[Tenant]:
        return self._list("GET", "/v1/tenants", "tenants", Tenant)

    def get_tenant(self, name: str) -> Tenant:
        return self._json("GET", "/v1/tenants/" + quote(name), Tenant)

    def set_quota(self, name: str, quota: Union[TenantQuota, Mapping[str, Any], None] = None,
                  **limits: Any) -> Tenant:
        """Replaces a tenant's quota (admin keys only); a zero limit is none.
        Give a TenantQuota or its fields: set_quota("t", max_sandboxes=3)."""
        body = quota if quota is not None else TenantQuota(**limits)
        return self._json("PUT", "/v1/tenants/" + quote(name) + "/quota", Tenant, json_body=body)

    def list_nodes(self) -> List[Node]:
        """A cluster's nodes (admin keys; Conflict on one machine)."""
        return self._list("GET", "/v1/nodes", "nodes", Node)

    def cordon_node(self, name: str) -> None:
        self._do("POST", "/v1/nodes/" + quote(name) + "/cordon")

    def uncordon_node(self, name: str) -> None:
        self._do("POST", "/v1/nodes/" + quote(name) + "/uncordon")

    def drain_node(self, name: str) -> None:
        self._do("POST", "/v1/nodes/" + quote(name) + "/drain")

    # Memory vaults.

    def create_vault(self, name: str, *, layout: Optional[str] = None,
                     allow_rewrite: Optional[bool] = None) -> Vault:
        body = _drop_none({"name": name, "layout": layout, "allow_rewrite": allow_rewrite})
        return self._json("POST", "/v1/vaults", Vault, json_body=body)

    def list_vaults(self) -> List[Vault]:
        return self._list("GET", "/v1/vaults", "vaults", Vault)

    def get_vault(self, name: str) -> Vault:
        return self._json("GET", "/v1/vaults/" + quote(name), Vault)

    def delete_vault(self, name: str, force: bool = False) -> None:
        """Deletes a vault and its history; one sandboxes mount only with force."""
        self._do("DELETE", "/v1/vaults/" + quote(name), query=[("force", True)] if force else None)

    def vault_log(self, name: str, rev: Optional[str] = None, limit: int = 0) -> List[VaultCommit]:
        q: List[Tuple[str, Any]] = []
        if rev:
            q.append(("rev", rev))
        if limit:
            q.append(("limit", limit))
        return self._list("GET", "/v1/vaults/" + quote(name) + "/log", "commits", VaultCommit, query=q)

    def read_vault_file(self, name: str, path: str, rev: Optional[str] = None) -> bytes:
        segs = "/".join(quote(s) for s in path.split("/"))
        resp = self._t.request("GET", "/v1/vaults/" + quote(name) + "/files/" + segs,
                               query=[("rev", rev)] if rev else None)
        with resp:
            return resp.read()

    def vault_git_url(self, name: str) -> str:
        """The vault's git URL (clone it with the API key as the password)."""
        return self._t.base + "/git/" + quote(name) + ".git"

    def search_vault(self, name: str, q: str, limit: int = 0) -> Dict[str, Any]:
        """Notes of the vault's main branch matching q (SQLite FTS5 syntax), best first."""
        query: List[Tuple[str, Any]] = [("q", q)]
        if limit:
            query.append(("limit", limit))
        return self._json("GET", "/v1/vaults/" + quote(name) + "/search", query=query)

    def vault_links(self, name: str, path: Optional[str] = None) -> Dict[str, Any]:
        return self._json("GET", "/v1/vaults/" + quote(name) + "/links",
                          query=[("path", path)] if path else None)

    def vault_credentials(self, name: str, *, ttl_seconds: Optional[int] = None,
                          read_write: Optional[bool] = None) -> Dict[str, Any]:
        body = _drop_none({"ttl_seconds": ttl_seconds, "read_write": read_write})
        return self._json("POST", "/v1/vaults/" + quote(name) + "/credentials", json_body=body)

    def compact_vault(self, name: str, before: Optional[str] = None) -> Dict[str, Any]:
        return self._json("POST", "/v1/vaults/" + quote(name) + "/compact",
                          json_body=_drop_none({"before": before}))

    def update_vault(self, name: str, *, compact: Optional[str] = None,
                     summarizer: Optional[str] = None) -> Vault:
        """Changes a vault's compaction schedule or summarizer."""
        return self._json("PATCH", "/v1/vaults/" + quote(name), Vault,
                          json_body=_drop_none({"compact": compact, "summarizer": summarizer}))

    def vault_events(self, name: str, limit: int = 0) -> List[Dict[str, Any]]:
        """The vault's newest events (compactions), newest first."""
        v = self._json("GET", "/v1/vaults/" + quote(name) + "/events",
                       query=[("limit", limit)] if limit else None) or {}
        return v.get("events") or []

    # Usage, audit, events, webhooks.

    def usage(self, *, start: Optional[_dt.datetime] = None, end: Optional[_dt.datetime] = None,
              step: Optional[str] = None, group_by: Optional[str] = None,
              tenant: Optional[str] = None) -> Dict[str, Any]:
        """Metered use from start to end (default the last day), in buckets
        of step ("1m", "1h", "1d") per group_by ("sandbox",
        "tenant", "template", "label:KEY"). The report as the API gives it."""
        q: List[Tuple[str, Any]] = []
        for k, t in (("from", start), ("to", end)):
            if t is not None:
                q.append((k, int(t.timestamp())))
        for k, v in (("step", step), ("group_by", group_by), ("tenant", tenant)):
            if v:
                q.append((k, v))
        return self._json("GET", "/v1/usage", query=q)

    def audit(self, *, tenant: Optional[str] = None, sandbox: Optional[str] = None,
              action: Optional[str] = None, start: Optional[_dt.datetime] = None,
              end: Optional[_dt.datetime] = None, before: int = 0, limit: int = 0) -> Dict[str, Any]:
        """Audit log entries, newest first (admin keys): {"entries", "next"};
        next, if set, is before= of the next page."""
        q: List[Tuple[str, Any]] = []
        for k, v in (("tenant", tenant), ("sandbox", sandbox), ("action", action)):
            if v:
                q.append((k, v))
        for k, t in (("from", start), ("to", end)):
            if t is not None:
                q.append((k, t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")))
        if before:
            q.append(("before", before))
        if limit:
            q.append(("limit", limit))
        return self._json("GET", "/v1/audit", query=q)

    def events(self, *, after: Optional[int] = None, types: Optional[Sequence[str]] = None,
               sandbox: Optional[str] = None) -> "EventStream":
        """Lifecycle events as they happen (Server-Sent Events), from now,
        or after the event of seq after (to resume a broken stream)."""
        q: List[Tuple[str, Any]] = []
        if after is not None:
            q.append(("after", after))
        if types:
            q.append(("types", ",".join(types)))
        if sandbox:
            q.append(("sandbox", sandbox))
        resp = self._t.request("GET", "/v1/events", query=q)
        if not (resp.getheader("Content-Type") or "").startswith("text/event-stream"):
            resp.close()
            raise errors.Error("GET /v1/events: not an event stream")
        return EventStream(resp)

    def create_webhook(self, url: str, events: Optional[Sequence[str]] = None) -> Webhook:
        """Adds a webhook for the tenant's events of these types (none:
        all). Its secret, which signs deliveries, is shown only here."""
        return self._json("POST", "/v1/webhooks", Webhook,
                          json_body=_drop_none({"url": url, "events": list(events) if events else None}))

    def list_webhooks(self) -> List[Webhook]:
        return self._list("GET", "/v1/webhooks", "webhooks", Webhook)

    def delete_webhook(self, id: str) -> None:
        self._do("DELETE", "/v1/webhooks/" + quote(id))

    def webhook_deliveries(self, id: str, limit: int = 0) -> List[Delivery]:
        """A webhook's latest deliveries, newest first."""
        return self._list("GET", "/v1/webhooks/" + quote(id) + "/deliveries", "deliveries", Delivery,
                          query=[("limit", limit)] if limit else None)

    # Git.

    def git(self, id: str, *, user: Optional[str] = None, author_name: Optional[str] = None,
            author_email: Optional[str] = None) -> "Git":
        """The git client of a sandbox (atoll.git.Git)."""
        from .git import Git
        return Git(self, id, user=user, author_name=author_name, author_email=author_email)


def _read_events(resp, op: str, passed: Tuple[str, ...], tp: type,
                 on_event: Optional[Callable[[Any], Any]]) -> Template:
    """Reads a build's or an import's NDJSON stream up to its done or error event."""
    for ev in ndjson(resp):
        t = ev.get("type")
        if t == "done":
            if not ev.get("template"):
                raise errors.Error(f"{op}: done event without a template")
            return decode(Template, ev["template"])
        if t == "error":
            raise errors.error_of_code(ev.get("code", ""), ev.get("message", ""))
        if on_event is not None and t in passed:
            on_event(decode(tp, ev))
    raise errors.Error(f"{op}: the stream ended before the {op} finished")


def _tar_dir(local_dir: Union[str, os.PathLike], f: BinaryIO) -> None:
    if not os.path.isdir(local_dir):
        raise errors.invalid(f"{os.fspath(local_dir)!r} is not a directory")
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for entry in sorted(os.listdir(local_dir)):
            tf.add(os.path.join(local_dir, entry), arcname=entry)


def _extract_member(tf: tarfile.TarFile, m: tarfile.TarInfo, dest: str) -> None:
    """Extracts m under dest unless its path, or a link's target, leaves dest."""
    root = os.path.realpath(dest)
    target = os.path.realpath(os.path.join(root, m.name))
    if not (target == root or target.startswith(root + os.sep)):
        raise errors.Invalid(f"tar entry {m.name!r} leaves the directory", status=400)
    if m.issym() or m.islnk():
        base = root if m.islnk() else os.path.dirname(target)
        link = os.path.realpath(os.path.join(base, m.linkname))
        if not (link == root or link.startswith(root + os.sep)):
            raise errors.Invalid(f"tar link {m.name!r} points outside the directory", status=400)
    if m.isdev() or m.isfifo():
        return
    if hasattr(tarfile, "data_filter"):
        tf.extract(m, root, filter="data")
    else:
        tf.extract(m, root, set_attrs=not (m.issym() or m.islnk()))
