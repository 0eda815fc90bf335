"""A Jupyter kernel for bash, for the code interpreter's bash contexts.
Debian packages no bash kernel (bash_kernel is on PyPI only), so this one is
small and written here: one bash process per kernel, which keeps variables,
functions and the working directory between executions. Each execution is
a file that bash sources; then bash prints a marker with the exit status on
stdout and on stderr, which tells the kernel that the execution is over.
stdout and stderr stay apart (pipes, not a terminal).

Interrupts: jupyter_client signals the kernel's process group, bash
included. bash's INT trap returns from the sourced file (a loop of builtins
stops too) and the commands it ran die of the signal.
"""

import os
import select
import signal
import subprocess
import tempfile
import uuid

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

PRELUDE = "trap 'return 130 2>/dev/null' INT\nPS1= PS2=\n"


class BashKernel(Kernel):
    implementation = "atoll-bash"
    implementation_version = "1.0"
    language = "bash"
    language_version = "5"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh"}
    banner = "bash (atoll code interpreter)"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.dir = tempfile.mkdtemp(prefix="atoll-bash-")
        self.start_bash()

    def start_bash(self):
        self.bash = subprocess.Popen(
            ["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0,
            # The kernel ignores SIGINT between executions, and an ignored
            # signal stays ignored in bash, where traps could not take it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.bash.stdin.write(PRELUDE.encode())

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, *, cell_id=None):
        if self.bash.poll() is not None:
            self.start_bash()
        marker = "__atoll_done_%s__" % uuid.uuid4().hex
        cell = os.path.join(self.dir, "cell")
        with open(cell, "w") as f:
            f.write(code + "\n")
        self.bash.stdin.write(
            ("source %s </dev/null\n_atoll_rc=$?\nprintf '\\n%s %%d\\n' $_atoll_rc; printf '\\n%s\\n' >&2\n"
             % (cell, marker, marker)).encode())
        status = None
        pending = {self.bash.stdout: b"", self.bash.stderr: b""}
        open_ = dict(pending)
        names = {self.bash.stdout: "stdout", self.bash.stderr: "stderr"}
        mark = ("\n" + marker).encode()
        while open_:
            try:
                ready, _, _ = select.select(list(open_), [], [])
            except KeyboardInterrupt:
                continue  # bash got the signal too; its trap ends the cell
            for f in ready:
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    del open_[f]  # bash exited
                    continue
                buf = pending[f] + chunk
                i = buf.find(mark)
                if i >= 0:
                    rest = buf[i + len(mark):]
                    if f is self.bash.stdout:
                        if b"\n" not in rest:
                            pending[f] = buf  # the status is still coming
                            continue
                        status = int(rest.split(b"\n", 1)[0].strip() or b"0")
                    self.emit(silent, names[f], buf[:i])
                    pending[f] = b""
                    del open_[f]
                    continue
                # Keep what could be the start of the marker for later.
                keep = len(mark) + 16
                out, pending[f] = buf[:-keep], buf[-keep:]
                if len(buf) <= keep:
                    out, pending[f] = b"", buf
                self.emit(silent, names[f], out)
        for f, rest in pending.items():
            self.emit(silent, names[f], rest)
        if status is None:  # bash died
            status = self.bash.wait()
        if status == 0:
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        if status == 130:
            ename, evalue = "KeyboardInterrupt", "interrupted"
        else:
            ename, evalue = "Error", "exit status %d" % status
        if not silent:
            self.send_response(self.iopub_socket, "error", {"ename": ename, "evalue": evalue, "traceback": []})
        return {"status": "error", "execution_count": self.execution_count, "ename": ename, "evalue": evalue, "traceback": []}

    def emit(self, silent, name, data):
        if data and not silent:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": data.decode("utf-8", "replace")})

    def do_shutdown(self, restart):
        try:
            self.bash.kill()
        except OSError:
            pass
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=BashKernel)
