"""The API's wire types as dataclasses (api/api.go in Go).

Answers are decoded with :func:`decode`, which takes the fields a class
declares and leaves out any it does not know, so that a newer server's
answers still decode. Times are timezone-aware :class:`datetime.datetime`;
the ``data`` of exec and build events is :class:`bytes`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Sandbox states.
STATE_CREATING = "creating"
STATE_RUNNING = "running"
STATE_PAUSED = "paused"
STATE_SUSPENDED = "suspended"
STATE_SHELVED = "shelved"
STATE_STOPPED = "stopped"
STATE_ARCHIVED = "archived"
STATE_ERROR = "error"


def _parse_time(v: str) -> _dt.datetime:
    # Go writes RFC 3339 with up to nine fraction digits; Python reads six.
    s = v.replace("Z", "+00:00")
    if "." in s:
        head, rest = s.split(".", 1)
        i = 0
        while i < len(rest) and rest[i].isdigit():
            i += 1
        s = head + "." + rest[:i][:6].ljust(6, "0") + rest[i:]
    return _dt.datetime.fromisoformat(s)


def decode(tp: Any, v: Any) -> Any:
    """Decodes the JSON value v as type tp (a dataclass, a typing alias of
    lists, dicts and Optionals, or a plain type)."""
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return decode(args[0], v) if len(args) == 1 else v
    if origin in (list, List):
        (a,) = typing.get_args(tp) or (Any,)
        return [decode(a, x) for x in v]
    if origin in (dict, Dict):
        _, a = typing.get_args(tp) or (Any, Any)
        return {k: decode(a, x) for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        kw = {}
        for f in dataclasses.fields(tp):
            if f.name in v:
                kw[f.name] = decode(hints[f.name], v[f.name])
        return tp(**kw)
    if tp is _dt.datetime:
        return _parse_time(v)
    if tp is bytes:
        return base64.b64decode(v)
    if tp is float and isinstance(v, int):
        return float(v)
    return v


_hint_cache: Dict[type, Dict[str, Any]] = {}


def _hints(tp: type) -> Dict[str, Any]:
    h = _hint_cache.get(tp)
    if h is None:
        h = typing.get_type_hints(tp, vars(sys.modules[tp.__module__]))
        _hint_cache[tp] = h
    return h


def encode(v: Any) -> Any:
    """The JSON value of v: dataclasses become objects without their None
    fields, bytes base64, times RFC 3339."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: encode(getattr(v, f.name)) for f in dataclasses.fields(v)
                if getattr(v, f.name) is not None}
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    return v


@dataclass
class Bandwidth:
    egress_mbit: Optional[float] = None
    ingress_mbit: Optional[float] = None


@dataclass
class NetworkPolicy:
    """A sandbox's egress policy: ``egress`` "allow-all" (default) or
    "deny-all"; ``allow`` lists addresses, prefixes and domain names let
    through under deny-all, ``deny`` those refused either way."""
    egress: Optional[str] = None
    allow: Optional[List[str]] = None
    deny: Optional[List[str]] = None
    bandwidth: Optional[Bandwidth] = None


@dataclass
class SandboxNetwork:
    ipv4: str = ""
    ipv6: str = ""
    policy: NetworkPolicy = field(default_factory=NetworkPolicy)


@dataclass
class PortAccess:
    public: bool = False


@dataclass
class PortURL:
    port: int = 0
    url: str = ""
    public: bool = False
    token: str = ""
    signed_url: str = ""
    expires_at: Optional[_dt.datetime] = None


@dataclass
class VaultMount:
    name: str = ""
    read_only: Optional[bool] = None
    path: Optional[str] = None
    # Set by the server: the commit whose read-only layer is under the clone.
    commit: Optional[str] = None


@dataclass
class Progress:
    op: str = ""
    done_bytes: int = 0
    total_bytes: int = 0


@dataclass
class Sandbox:
    id: str = ""
    state: str = ""
    template: str = ""
    template_version: str = ""
    runtime: str = ""
    cpu: float = 0.0
    memory_mib: int = 0
    disk_gib: int = 0
    pids: int = 0
    env: Dict[str, str] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    error: str = ""
    created_at: Optional[_dt.datetime] = None
    started_at: Optional[_dt.datetime] = None
    stopped_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    ephemeral: bool = False
    auto_delete_sec: int = 0
    auto_stop_sec: int = 0
    auto_archive_sec: int = 0
    auto_resume: bool = False
    checkpoint_every_sec: int = 0
    restored_from: str = ""
    progress: Optional[Progress] = None
    network: Optional[SandboxNetwork] = None
    ports: PortAccess = field(default_factory=PortAccess)
    node: str = ""
    vaults: List[VaultMount] = field(default_factory=list)
    template_pull: Optional[Dict[str, Any]] = None
    snapshot_pull: Optional[Dict[str, Any]] = None
    placement: Optional[Dict[str, Any]] = None


@dataclass
class Metric:
    time: Optional[_dt.datetime] = None
    cpu_count: int = 0
    cpu_used_pct: float = 0.0
    memory_used_bytes: int = 0
    memory_cache_bytes: int = 0
    memory_total_bytes: int = 0
    disk_used_bytes: int = 0
    disk_total_bytes: int = 0
    # Bytes received and sent since its network was attached (counters).
    network_rx_bytes: int = 0
    network_tx_bytes: int = 0


@dataclass
class LogEntry:
    """A line the sandbox's start command or a background process printed
    (Client.logs): seq numbers the lines kept, stream is "stdout" or
    "stderr"."""
    seq: int = 0
    time: Optional[_dt.datetime] = None
    pid: int = 0
    tag: str = ""
    stream: str = ""
    line: str = ""


@dataclass
class ExecEvent:
    """One event of a command's stream: "start" (pid), "stdout" and
    "stderr" (data), "exit" (exit_code, signal, timed_out) or "error"
    (message)."""
    type: str = ""
    pid: int = 0
    data: bytes = b""
    exit_code: Optional[int] = None
    signal: str = ""
    timed_out: bool = False
    message: str = ""


@dataclass
class ExecResult:
    """What a command that ran to its end did. exit_code is -1 when a
    signal ended it."""
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    signal: str = ""
    timed_out: bool = False
    pid: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class Process:
    pid: int = 0
    cmd: List[str] = field(default_factory=list)
    tag: str = ""
    pty: bool = False
    running: bool = False
    exit_code: Optional[int] = None
    started_at: Optional[_dt.datetime] = None


@dataclass
class FileInfo:
    name: str = ""
    path: str = ""
    type: str = ""  # "file", "dir", "symlink", ...
    size: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    mod_time: Optional[_dt.datetime] = None
    target: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)


@dataclass
class WatchEvent:
    """A change under a watched path: type "create", "write", "remove",
    "rename" or "chmod"."""
    type: str = ""
    path: str = ""
    entry: Optional[FileInfo] = None


@dataclass
class Health:
    status: str = ""
    version: str = ""


@dataclass
class RuntimeCapabilities:
    pause: bool = False
    memory_snapshot: bool = False
    memory_fork: bool = False
    process_oom: bool = False
    shared_kernel: bool = False
    network: bool = False
    emulated: bool = False


@dataclass
class Runtime:
    name: str = ""
    available: bool = False
    reason: str = ""
    default: bool = False
    capabilities: RuntimeCapabilities = field(default_factory=RuntimeCapabilities)


@dataclass
class TemplateVersion:
    id: str = ""
    number: int = 0
    current: bool = False
    source: str = ""
    digest: str = ""
    layers: List[str] = field(default_factory=list)
    size: int = 0
    sandboxes: int = 0
    snapshots: int = 0
    created_at: Optional[_dt.datetime] = None


@dataclass
class Template:
    name: str = ""
    version: int = 0
    version_id: str = ""
    old_versions: int = 0
    removed: bool = False
    versions: List[TemplateVersion] = field(default_factory=list)
    source: str = ""
    digest: str = ""
    layers: List[str] = field(default_factory=list)
    size: int = 0
    shared_layers: int = 0
    env: List[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""
    entrypoint: List[str] = field(default_factory=list)
    cmd: List[str] = field(default_factory=list)
    start_cmd: str = ""
    ready_cmd: str = ""
    pool_size: int = 0
    setuid: bool = False
    sandboxes: int = 0
    created_at: Optional[_dt.datetime] = None


@dataclass
class TemplateRemoved:
    name: str = ""
    held: List[TemplateVersion] = field(default_factory=list)


@dataclass
class BuildEvent:
    """A template build's progress: "step" (step, steps, instruction,
    cached) and "log" (data)."""
    type: str = ""
    step: int = 0
    steps: int = 0
    instruction: str = ""
    cached: bool = False
    data: bytes = b""


@dataclass
class ImportEvent:
    """A template import's progress ("progress")."""
    type: str = ""
    layer: str = ""
    bytes: int = 0
    total: int = 0
    layers_done: int = 0
    layers: int = 0


@dataclass
class Snapshot:
    id: str = ""
    name: str = ""
    sandbox_id: str = ""
    template: str = ""
    template_version: str = ""
    state: str = ""
    sandboxes: int = 0
    created_at: Optional[_dt.datetime] = None


@dataclass
class APIKey:
    id: str = ""
    name: str = ""
    tenant: str = ""
    admin: bool = False
    created_at: Optional[_dt.datetime] = None
    #: the key itself, only in the answer of create_key
    key: str = ""


@dataclass
class TenantQuota:
    """A tenant's limits; 0 is no limit."""
    max_sandboxes: int = 0
    max_cpu: float = 0.0
    max_memory_mib: int = 0
    max_disk_gib: int = 0
    creates_per_second: float = 0.0


@dataclass
class TenantUsage:
    sandboxes: int = 0
    cpu: float = 0.0
    memory_mib: int = 0
    disk_gib: int = 0


@dataclass
class Tenant:
    name: str = ""
    admin: bool = False
    quota: TenantQuota = field(default_factory=TenantQuota)
    used: TenantUsage = field(default_factory=TenantUsage)


@dataclass
class Vault:
    name: str = ""
    layout: str = ""
    allow_rewrite: bool = False
    git_path: str = ""
    head: str = ""
    refs: Dict[str, str] = field(default_factory=dict)
    packs: int = 0
    created_at: Optional[_dt.datetime] = None


@dataclass
class VaultCommit:
    id: str = ""
    author: str = ""
    email: str = ""
    time: Optional[_dt.datetime] = None
    subject: str = ""


@dataclass
class Node:
    name: str = ""
    address: str = ""
    version: str = ""
    runtimes: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    capacity: Dict[str, Any] = field(default_factory=dict)
    committed: Dict[str, Any] = field(default_factory=dict)
    state: str = ""
    schedule: str = ""
    epoch: int = 0


@dataclass
class Event:
    """A lifecycle event: a sandbox's state change, a template's, ..."""
    seq: int = 0
    id: str = ""
    type: str = ""
    time: Optional[_dt.datetime] = None
    tenant: str = ""
    sandbox: str = ""
    state: str = ""
    reason: str = ""


@dataclass
class Webhook:
    id: str = ""
    tenant: str = ""
    url: str = ""
    events: List[str] = field(default_factory=list)
    #: the secret that signs deliveries, only in the answer of create_webhook
    secret: str = ""
    created_at: Optional[_dt.datetime] = None


@dataclass
class Delivery:
    event: Event = field(default_factory=Event)
    state: str = ""
    attempts: int = 0
    next_at: Optional[_dt.datetime] = None
    last_status: int = 0
    last_error: str = ""
    done_at: Optional[_dt.datetime] = None


# The code interpreter (docs/code-interpreter.md), as E2B's code-interpreter
# SDK has it.

@dataclass
class CodeContext:
    """A code context: one kernel, whose variables, imports and working
    directory last between executions."""
    id: str = ""
    language: str = ""
    cwd: str = ""


@dataclass
class Result:
    """One result of an execution: a display, or the value of the code's
    last expression (is_main_result). text is its text/plain; png, jpeg
    and pdf are base64."""
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    javascript: Optional[str] = None
    extra: Optional[Dict[str, Any]] = None
    is_main_result: bool = False

    def formats(self) -> List[str]:
        """The formats it has, e.g. ["text", "png"]."""
        return [f for f in ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex",
                            "json", "javascript") if getattr(self, f) is not None]


@dataclass
class Logs:
    """An execution's output, in the pieces it came in."""
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """The exception the code raised (in bash, a non-zero exit status)."""
    name: str = ""
    value: str = ""
    traceback: str = ""


@dataclass
class Execution:
    """What an execution produced. An exception in the code is error, not
    an exception of the call."""
    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the main result, if there is one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None
