"""atoll's code interpreter service: E2B's code-interpreter protocol on
port 49999, over Jupyter kernels (jupyter_client), with the standard
library's HTTP server. The npm package @e2b/code-interpreter and atoll's own
API (/v1/sandboxes/{id}/code/...) speak to it.

  GET    /health                  200 once the default Python kernel runs
  POST   /execute                 {code, context_id | language, env_vars}:
                                  JSON lines, one per kernel output, as E2B
                                  streams them
  POST   /contexts                {language, cwd}: a new context (kernel)
  GET    /contexts                the contexts
  DELETE /contexts/{id}           removes one
  POST   /contexts/{id}/restart   restarts its kernel (its state is lost)

A context is one kernel; its executions run one at a time, in order. An
execution whose client goes away (E2B's SDKs close the request when their
timeoutMs passes) interrupts its kernel, which stays usable.
"""

import json
import os
import queue
import select
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

PORT = int(os.environ.get("ATOLL_CODE_PORT", "49999"))
DEFAULT_CWD = os.environ.get("ATOLL_CODE_CWD", "/home/user")
MAX_BODY = 16 << 20
# Debian's debugpy warns about frozen modules at each kernel's start.
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
# The kernelspecs of this directory (kernels/bash, kernels/deno), before
# the system's: jupyter_client looks in $JUPYTER_PATH/kernels first.
HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("JUPYTER_PATH")]))

# The kernels of each language (their kernelspecs' names). Deno's kernel
# runs JavaScript and TypeScript alike, as on E2B; it is there if the
# template's build installed deno (install_deno.py).
KERNELS = {"python": "python3", "bash": "bash", "javascript": "deno", "typescript": "deno"}
# How long an execution keeps listening after its kernel said idle, for
# output that comes after: deno's kernel sends an execution's result and
# console output from tasks of their own, which can trail its idle status
# by milliseconds (they are the execution's still: no next request has
# changed the parent deno gives them). Each late message restarts the wait.
SETTLE = {"javascript": 0.05, "typescript": 0.05}
# What E2B's SDKs and users call the languages (E2B's server maps js too).
LANGUAGE_NAMES = {"python3": "python", "py": "python", "sh": "bash", "shell": "bash",
                  "js": "javascript", "ts": "typescript", "deno": "typescript"}

# Kernel output → E2B's result fields, as E2B's own server names them.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


class HTTPError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def installed(kernel):
    """Whether kernel's spec is there and its program installed."""
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel)
    except NoSuchKernel:
        return False
    return shutil.which(spec.argv[0]) is not None


def normal_language(lang):
    lang = (lang or "python").strip().lower()
    lang = LANGUAGE_NAMES.get(lang, lang)
    if lang not in AVAILABLE:
        raise HTTPError(400, "language %r is not supported here: %s" % (lang, ", ".join(sorted(AVAILABLE))))
    return lang


class Context:
    """One kernel, its client, and the lock its executions take turns by."""

    def __init__(self, language, cwd, ctx_id=None):
        self.id = ctx_id or str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = None
        self.kc = None
        self.start()

    def start(self):
        if not os.path.isdir(self.cwd):
            raise HTTPError(400, "cwd %s is not a directory" % self.cwd)
        km = KernelManager(kernel_name=KERNELS[self.language])
        km.start_kernel(cwd=self.cwd)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc

    def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        self.km = self.kc = None

    def restart(self):
        with self.lock:
            self.stop()
            self.start()

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def silent(self, code):
        """Runs code in the kernel without output, and waits for it."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        self.kc.get_shell_msg(timeout=30)  # its execute_reply
        while True:
            msg = self.kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"]["execution_state"] == "idle":
                return


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.all = {}
        self.defaults = {}  # language → its default context's id

    def default(self, language):
        """The default context of language, started on first use."""
        with self.lock:
            ctx = self.all.get(self.defaults.get(language))
            if ctx is None:
                ctx = Context(language, DEFAULT_CWD)
                self.all[ctx.id] = ctx
                self.defaults[language] = ctx.id
            return ctx

    def create(self, language, cwd):
        ctx = Context(language, cwd or DEFAULT_CWD)
        with self.lock:
            self.all[ctx.id] = ctx
        return ctx

    def get(self, ctx_id):
        with self.lock:
            ctx = self.all.get(ctx_id)
        if ctx is None:
            raise HTTPError(404, "context %s not found" % ctx_id)
        return ctx

    def remove(self, ctx_id):
        with self.lock:
            ctx = self.all.pop(ctx_id, None)
            for lang, d in list(self.defaults.items()):
                if d == ctx_id:
                    del self.defaults[lang]
        if ctx is None:
            raise HTTPError(404, "context %s not found" % ctx_id)
        ctx.stop()

    def list(self):
        with self.lock:
            return [c.view() for c in self.all.values()]


contexts = Contexts()
# The languages this template has kernels for.
AVAILABLE = {lang for lang, kernel in KERNELS.items() if installed(kernel)}


def env_code(language, envs):
    """Code that sets envs for one execution, and code that undoes it."""
    if language in ("javascript", "typescript"):
        return (
            "globalThis._atollEnv = Object.fromEntries(%s.map((k) => [k, Deno.env.get(k)]));\n"
            "for (const [k, v] of Object.entries(%s)) Deno.env.set(k, v);\n" % (json.dumps(sorted(envs)), json.dumps(envs)),
            "for (const [k, v] of Object.entries(globalThis._atollEnv)) v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);\n"
            "delete globalThis._atollEnv;\n",
        )
    if language == "python":
        keys = json.dumps(sorted(envs))
        return (
            "import os as _atoll_os\n"
            "_atoll_env = {k: _atoll_os.environ.get(k) for k in %s}\n"
            "_atoll_os.environ.update(%s)\n" % (keys, json.dumps(envs)),
            "for _k, _v in _atoll_env.items():\n"
            "    _atoll_os.environ.pop(_k, None) if _v is None else _atoll_os.environ.__setitem__(_k, _v)\n"
            "del _atoll_env, _atoll_os, _k, _v\n",
        )
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"
    names = sorted(envs)
    save = "".join("_atoll_old_%d=${%s-__atoll_unset__}; export %s=%s\n" % (i, k, k, q(envs[k])) for i, k in enumerate(names))
    undo = "".join(
        'if [ "$_atoll_old_%d" = __atoll_unset__ ]; then unset %s; else export %s="$_atoll_old_%d"; fi; unset _atoll_old_%d\n'
        % (i, k, k, i, i) for i, k in enumerate(names))
    return save, undo


def result_of(data, main):
    out = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
            continue
        if field == "text" and len(value) >= 2 and value[0] == "'" and value[-1] == "'":
            value = value[1:-1]  # as E2B's server: a string's repr unquoted
        out[field] = value
    if extra:
        out["extra"] = extra
    return out


def client_gone(sock):
    """Whether the client closed its side of the connection."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def execute(ctx, code, envs, emit, gone):
    """Runs code in ctx, calling emit with each of E2B's output messages.
    gone tells whether the client went away: then the kernel is interrupted
    and what it still says is read and dropped, so that the context is idle
    when the next execution starts."""
    with ctx.lock:
        kc = ctx.kc
        undo = None
        if envs:
            setup, undo = env_code(ctx.language, envs)
            ctx.silent(setup)
        # Not stop_on_error: executions never queue here (the context's
        # lock), and after an error ipykernel would abort the requests that
        # reach it until a callback of its event loop runs, which on a busy
        # machine can be the next execution: answered idle, with nothing run.
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        interrupted = False
        settle = SETTLE.get(ctx.language, 0)
        idle_until = None  # after idle, with settle: when to stop listening
        try:
            while True:
                timeout = 0.25
                if idle_until is not None:
                    timeout = idle_until - time.monotonic()
                    if timeout <= 0:
                        break
                try:
                    msg = kc.get_iopub_msg(timeout=timeout)
                except queue.Empty:
                    if idle_until is not None:
                        break
                    if not ctx.km.is_alive():
                        # The code ended its kernel (os._exit, a crash):
                        # the context gets a new one, its state lost.
                        ctx.stop()
                        ctx.start()
                        if not interrupted:
                            emit({"type": "error", "name": "KernelDied", "traceback": "",
                                  "value": "the kernel died during the execution and was restarted; the context's state is lost"})
                        undo = None
                        break
                    if not interrupted and gone():
                        ctx.km.interrupt_kernel()
                        interrupted = True
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if idle_until is not None:
                    idle_until = time.monotonic() + settle
                kind, content = msg["msg_type"], msg["content"]
                out = None
                if kind == "stream":
                    out = {"type": content["name"], "text": content["text"]}
                elif kind == "execute_result":
                    out = result_of(content["data"], True)
                elif kind == "display_data":
                    out = result_of(content["data"], False)
                elif kind == "error":
                    out = {"type": "error", "name": content["ename"], "value": content["evalue"],
                           "traceback": "\n".join(content["traceback"])}
                elif kind == "execute_input":
                    out = {"type": "number_of_executions", "execution_count": content["execution_count"]}
                elif kind == "status" and content["execution_state"] == "idle":
                    if not settle or interrupted:
                        break
                    idle_until = time.monotonic() + settle
                if out is not None and not interrupted:
                    try:
                        emit(out)
                    except OSError:
                        ctx.km.interrupt_kernel()
                        interrupted = True
            # The execute_reply, so that the shell channel holds no stale one.
            while ctx.kc is kc:
                try:
                    reply = kc.get_shell_msg(timeout=10)
                except queue.Empty:
                    break
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
        finally:
            if undo:
                ctx.silent(undo)
        if not interrupted:
            emit({"type": "end_of_execution"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "atoll-code-interpreter"
    # The stream is many small writes: with Nagle's algorithm each would
    # wait for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise HTTPError(413, "the request body is larger than %d bytes" % MAX_BODY)
        raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        try:
            v = json.loads(raw)
        except ValueError as e:
            raise HTTPError(400, "the request body is not JSON: %s" % e)
        if not isinstance(v, dict):
            raise HTTPError(400, "the request body is not a JSON object")
        return v

    def route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/health":
            return self.send_json(200, "OK")
        if method == "POST" and path == "/execute":
            return self.execute()
        if parts[0] == "contexts":
            if len(parts) == 1 and method == "GET":
                return self.send_json(200, contexts.list())
            if len(parts) == 1 and method == "POST":
                b = self.body()
                ctx = contexts.create(normal_language(b.get("language")), str_field(b, "cwd"))
                return self.send_json(200, ctx.view())
            if len(parts) == 2 and method == "DELETE":
                contexts.remove(parts[1])
                return self.send_json(200, None)
            if len(parts) == 3 and parts[2] == "restart" and method == "POST":
                contexts.get(parts[1]).restart()
                return self.send_json(200, None)
        raise HTTPError(404, "no route %s %s" % (method, path))

    def execute(self):
        b = self.body()
        code = b.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "code must be a string")
        ctx_id, lang = str_field(b, "context_id"), str_field(b, "language")
        if ctx_id and lang:
            raise HTTPError(400, "give a context_id or a language, not both")
        envs = b.get("env_vars") or {}
        if not isinstance(envs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise HTTPError(400, "env_vars must map names to strings")
        ctx = contexts.get(ctx_id) if ctx_id else contexts.default(normal_language(lang))

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.flush()

        def emit(msg):
            line = (json.dumps(msg) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        execute(ctx, code, envs, emit, lambda: client_gone(self.connection))
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def handle_method(self, method):
        try:
            self.route(method)
        except HTTPError as e:
            self.send_json(e.status, {"message": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            traceback.print_exc()
            self.send_json(500, {"message": "%s: %s" % (type(e).__name__, e)})

    def do_GET(self):
        self.handle_method("GET")

    def do_POST(self):
        self.handle_method("POST")

    def do_DELETE(self):
        self.handle_method("DELETE")


def str_field(b, name):
    v = b.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise HTTPError(400, "%s must be a string" % name)
    return v


def main():
    # The default Python context starts before the port opens: the
    # template's ready command waits for /health, so that a sandbox's first
    # execution does not wait for a kernel.
    contexts.default("python")
    srv = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    srv.daemon_threads = True
    print("code interpreter listening on port %d" % PORT, file=sys.stderr, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
