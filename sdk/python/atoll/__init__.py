"""atoll: the Python client of atoll's HTTP API.

Sandboxes, commands (streaming, background, stdin, signals), terminals,
files (streams, tar, watch), snapshots, forks, templates, network, ports,
keys, tenants, memory vaults, git in a sandbox, and the code
interpreter (run_code, code contexts); standard library only.

    import atoll

    c = atoll.Client("http://localhost:7070", "ak_...")
    sb = c.create_sandbox(template="host")
    r = c.exec(sb.id, shell="echo hello")
    assert r.stdout == b"hello\\n"
    c.delete_sandbox(sb.id)

Errors of the server are :class:`atoll.Error` subclasses named for their
code: :class:`NotFound`, :class:`Conflict`, :class:`Invalid`, ...
"""

from .aio import AsyncClient
from .client import Client, EventStream, Stream
from .errors import (KINDS, Conflict, Error, Forbidden, Internal, Invalid, NotFound,
                     QuotaExceeded, TooLarge, Unauthorized, Unavailable)
from .git import Git, GitAuth, GitBranches, GitError, GitFileStatus, GitStatus
from .terminal import Terminal
from .types import (APIKey, Bandwidth, BuildEvent, CodeContext, Delivery, Event, ExecEvent, ExecResult, Execution, ExecutionError,
                    FileInfo, Health, ImportEvent, Logs, Result, LogEntry, Metric, NetworkPolicy, Node, PortAccess, PortURL, Process,
                    Runtime, RuntimeCapabilities, Sandbox, SandboxNetwork, Snapshot, Template,
                    TemplateRemoved, TemplateVersion, Tenant, TenantQuota, TenantUsage, Vault,
                    VaultCommit, VaultMount, WatchEvent, Webhook)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "Client", "EventStream", "Stream", "Terminal", "Git", "GitAuth", "GitBranches", "GitError",
    "GitFileStatus", "GitStatus", "KINDS", "Error", "Invalid", "Unauthorized", "Forbidden",
    "NotFound", "Conflict", "TooLarge", "QuotaExceeded", "Unavailable", "Internal",
    "APIKey", "Bandwidth", "BuildEvent", "ExecEvent", "ExecResult", "FileInfo", "Health",
    "ImportEvent", "LogEntry", "Metric", "NetworkPolicy", "Node", "PortAccess", "PortURL", "Process",
    "Runtime", "RuntimeCapabilities", "Sandbox", "SandboxNetwork", "Snapshot", "Template",
    "TemplateRemoved", "TemplateVersion", "Tenant", "TenantQuota", "TenantUsage", "Vault",
    "VaultCommit", "VaultMount", "WatchEvent", "Event", "Webhook", "Delivery",
    "CodeContext", "Execution", "ExecutionError", "Logs", "Result",
]
