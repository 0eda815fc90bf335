"""An environment for Harbor, the eval harness behind Terminal-Bench, that
runs each trial in an atoll sandbox.

Harbor loads an environment outside its tree by import path:

    harbor run --dataset terminal-bench@2.0 --agent oracle \\
        --environment-import-path atoll.harbor:AtollEnvironment

with ATOLL_URL and ATOLL_API_KEY in the environment. :class:`AtollEnvironment`
has the shape of Harbor's ``BaseEnvironment`` (start, stop, exec,
upload_file, upload_dir, download_file, download_dir, the network-policy and
health-check hooks) and subclasses it when Harbor is installed; without
Harbor it stands alone, so that it can be imported and driven directly (as
the SDK's tests do).

``start`` builds the task's ``environment/Dockerfile`` as an atoll template
named for the task and the hash of the environment directory's contents, so
that every trial of a task after the first reuses it, and rebuilds only
when the files change (or ``force_build``); a task that names a
``docker_image`` instead imports that image. The sandbox gets the task's
cpus, memory_mb, storage_mb and internet settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from . import errors
from .client import Client
from .types import NetworkPolicy

try:  # Harbor, when installed: be one of its environments.
    from harbor.environments.base import BaseEnvironment as _Base  # type: ignore
    from harbor.environments.base import ExecResult as _HarborExecResult  # type: ignore
    HAVE_HARBOR = True
except ImportError:  # pragma: no cover - depends on the machine
    _Base = object
    _HarborExecResult = None
    HAVE_HARBOR = False


@dataclass
class ExecResult:
    """What a command did, as Harbor's ExecResult has it."""
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    return_code: int = 0


class HealthcheckError(RuntimeError):
    """The task's health check kept failing after the sandbox started."""


#: The exit code exec reports for a command killed by its timeout_sec, as
#: GNU timeout does.
TIMEOUT_EXIT_CODE = 124

# Directories Harbor's agents and verifiers write to in the environment
# (harbor.models.trial.paths.EnvironmentPaths).
_LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")

# One build of a template at a time in this process: concurrent trials of
# one task wait for the first one's build instead of building it again.
_build_locks: Dict[str, threading.Lock] = {}
_build_locks_mu = threading.Lock()


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    """A field of a Harbor EnvironmentConfig, or of a dict of one."""
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def load_task_config(task_dir: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The [environment] table of a task's task.toml ({} when none)."""
    path = Path(task_dir) / "task.toml"
    if not path.exists():
        return {}
    try:
        import tomllib
    except ImportError:  # Python < 3.11: pass task_env_config instead
        return {}
    with open(path, "rb") as f:
        return dict(tomllib.load(f).get("environment", {}))


def content_hash(directory: Union[str, os.PathLike]) -> str:
    """The sha256 of a directory's files: their paths, modes and contents."""
    h = hashlib.sha256()
    root = Path(directory)
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = Path(d) / name
            rel = p.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0" + oct(p.stat().st_mode & 0o777).encode() + b"\0")
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


class AtollEnvironment(_Base):  # type: ignore[misc,valid-type]
    """A Harbor environment of one trial in an atoll sandbox.

    The arguments are Harbor's: environment_dir is the task's environment
    directory (with its Dockerfile), environment_name the task's name,
    session_id the trial's, task_env_config the task's [environment]
    (Harbor's EnvironmentConfig, a dict, or None to read the task.toml
    next to environment_dir). The keyword-only ones are atoll's: a client,
    or url and api_key (default ATOLL_URL and ATOLL_API_KEY), the runtime
    ("ns", "gvisor", "vm"; default the server's) and labels for the
    sandbox.
    """

    def __init__(self, environment_dir: Union[str, os.PathLike], environment_name: str,
                 session_id: str, trial_paths: Any = None, task_env_config: Any = None,
                 logger: Optional[logging.Logger] = None, override_cpus: Optional[int] = None,
                 override_memory_mb: Optional[int] = None,
                 override_storage_mb: Optional[int] = None, override_gpus: Optional[int] = None,
                 suppress_override_warnings: bool = False,
                 persistent_env: Optional[Dict[str, str]] = None, *args: Any,
                 client: Optional[Client] = None, url: Optional[str] = None,
                 api_key: Optional[str] = None, runtime: Optional[str] = None,
                 labels: Optional[Dict[str, str]] = None, **kwargs: Any):
        self.client = client or Client(url, api_key)
        self.runtime = runtime
        self.labels = dict(labels or {})
        self.sandbox_id: Optional[str] = None
        #: the template start() used, and whether it built it
        self.template: Optional[str] = None
        self.built = False
        if task_env_config is None:
            task_env_config = load_task_config(Path(environment_dir).parent)
        if HAVE_HARBOR:
            super().__init__(Path(environment_dir), environment_name, session_id, trial_paths,
                             task_env_config, logger, override_cpus, override_memory_mb,
                             override_storage_mb, override_gpus, suppress_override_warnings,
                             persistent_env, *args, **kwargs)
            return
        self.environment_dir = Path(environment_dir)
        self.environment_name = environment_name
        self.session_id = session_id
        self.trial_paths = trial_paths
        self.task_env_config = task_env_config
        self.logger = (logger or logging.getLogger("atoll.harbor")).getChild(environment_name)
        self.default_user: Optional[Union[str, int]] = None
        self._persistent_env: Dict[str, str] = dict(persistent_env or {})
        env = _field(task_env_config, "env") or {}
        self._persistent_env = {**{k: os.path.expandvars(v) for k, v in env.items()},
                                **self._persistent_env}
        self._overrides = {"cpus": override_cpus, "memory_mb": override_memory_mb,
                           "storage_mb": override_storage_mb}
        self._validate_definition()

    # What Harbor asks of an environment type.

    @staticmethod
    def type() -> Any:
        """The environment's type: atoll (Harbor's EnvironmentType has no
        member for providers outside its tree)."""
        return _Type.ATOLL

    @property
    def is_mounted(self) -> bool:
        # The logs are in the sandbox; Harbor downloads them.
        return False

    @property
    def supports_gpus(self) -> bool:
        return False

    @property
    def can_disable_internet(self) -> bool:
        return True

    @property
    def supports_dynamic_network_policy(self) -> bool:
        return True

    def _validate_definition(self) -> None:
        dockerfile = self.environment_dir / "Dockerfile"
        if not dockerfile.exists() and not _field(self.task_env_config, "docker_image"):
            raise FileNotFoundError(f"{dockerfile} not found and the task names no docker_image")

    def _setting(self, name: str, default: Any) -> Any:
        if not HAVE_HARBOR and self._overrides.get(name) is not None:
            return self._overrides[name]
        v = _field(self.task_env_config, name)
        return default if v is None else v

    # The template.

    def template_name(self) -> str:
        """The task's template: its name and the hash of its environment
        directory (or of its docker_image)."""
        image = _field(self.task_env_config, "docker_image")
        if (self.environment_dir / "Dockerfile").exists():
            digest = content_hash(self.environment_dir)
        else:
            digest = hashlib.sha256(str(image).encode()).hexdigest()
        slug = re.sub(r"[^a-z0-9-]+", "-", self.environment_name.lower()).strip("-")[:40] or "task"
        return f"harbor-{slug}-{digest[:12]}"

    def ensure_template(self, force_build: bool = False) -> str:
        """Builds (or imports) the task's template unless it exists."""
        name = self.template_name()
        with _build_locks_mu:
            lock = _build_locks.setdefault(name, threading.Lock())
        with lock:
            if not force_build:
                try:
                    self.client.get_template(name)
                    self.template = name
                    return name
                except errors.NotFound:
                    pass
            image = _field(self.task_env_config, "docker_image")
            t0 = time.monotonic()
            if (self.environment_dir / "Dockerfile").exists():
                self.client.build_template(name, self.environment_dir,
                                           on_event=lambda ev: self._log_build(ev))
            else:
                self.client.import_template(name, image)
            self.logger.info("built template %s in %.1fs", name, time.monotonic() - t0)
            self.template, self.built = name, True
            return name

    def _log_build(self, ev: Any) -> None:
        if ev.type == "step":
            self.logger.debug("build step %d/%d: %s", ev.step, ev.steps, ev.instruction)

    # Lifecycle.

    def _create_request(self) -> Dict[str, Any]:
        storage_mb = int(self._setting("storage_mb", 10240))
        labels = {"harbor-task": self.environment_name[:63], "harbor-session": self.session_id[:63]}
        labels.update(self.labels)
        req: Dict[str, Any] = dict(
            template=self.template, cpu=float(self._setting("cpus", 1)),
            memory_mib=int(self._setting("memory_mb", 2048)),
            disk_gib=max(1, math.ceil(storage_mb / 1024)),
            env=self._persistent_env or None, labels=labels)
        if self.runtime:
            req["runtime"] = self.runtime
        policy = self._baseline_policy()
        if policy is not None:
            req["network"] = policy
        return req

    def _baseline_policy(self) -> Optional[NetworkPolicy]:
        mode = _field(self.task_env_config, "network_mode")
        hosts = list(_field(self.task_env_config, "allowed_hosts") or [])
        if mode is None and not self._setting("allow_internet", True):
            mode = "no-network"
        return _policy(str(getattr(mode, "value", mode)) if mode is not None else None, hosts)

    async def start(self, force_build: bool = False) -> None:
        """Builds the task's template unless it has one (or force_build),
        then starts the trial's sandbox and makes Harbor's log directories."""
        await asyncio.to_thread(self.start_sync, force_build)
        await self.run_healthcheck()

    def start_sync(self, force_build: bool = False) -> None:
        self.ensure_template(force_build)
        sb = self.client.create_sandbox(**self._create_request())
        self.sandbox_id = sb.id
        self.client.exec(sb.id, ["mkdir", "-p", *_LOG_DIRS])

    async def stop(self, delete: bool = True) -> None:
        """Deletes the sandbox, or with delete False stops it (its files stay)."""
        await asyncio.to_thread(self.stop_sync, delete)

    def stop_sync(self, delete: bool = True) -> None:
        if self.sandbox_id is None:
            return
        try:
            if delete:
                self.client.delete_sandbox(self.sandbox_id)
                self.sandbox_id = None
            else:
                self.client.stop_sandbox(self.sandbox_id)
        except errors.NotFound:
            self.sandbox_id = None

    def _id(self) -> str:
        if self.sandbox_id is None:
            raise RuntimeError("the environment is not started")
        return self.sandbox_id

    # Commands and files.

    async def exec(self, command: str, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, timeout_sec: Optional[float] = None,
                   user: Optional[Union[str, int]] = None) -> Any:
        """Runs command with bash -c (as Harbor's environments do) and
        returns its output and exit code; one killed by timeout_sec exits
        124."""
        return await asyncio.to_thread(self.exec_sync, command, cwd, env, timeout_sec, user)

    def exec_sync(self, command: str, cwd: Optional[str] = None,
                  env: Optional[Dict[str, str]] = None, timeout_sec: Optional[float] = None,
                  user: Optional[Union[str, int]] = None) -> Any:
        user = user if user is not None else self.default_user
        merged = {**self._persistent_env, **(env or {})} or None
        r = self.client.exec(self._id(), ["bash", "-c", command], cwd=cwd, env=merged,
                             user=str(user) if user is not None else None,
                             timeout=timeout_sec or None)
        code = TIMEOUT_EXIT_CODE if r.timed_out else r.exit_code
        out = r.stdout.decode(errors="replace")
        err = r.stderr.decode(errors="replace")
        if r.timed_out:
            err += f"\ncommand timed out after {timeout_sec} seconds\n"
        if _HarborExecResult is not None:
            return _HarborExecResult(stdout=out, stderr=err, return_code=code)
        return ExecResult(stdout=out, stderr=err, return_code=code)

    async def upload_file(self, source_path: Union[str, os.PathLike], target_path: str) -> None:
        """Copies a local file to target_path in the sandbox, with its mode."""
        await asyncio.to_thread(self.upload_file_sync, source_path, target_path)

    def upload_file_sync(self, source_path: Union[str, os.PathLike], target_path: str) -> None:
        mode = os.stat(source_path).st_mode & 0o7777
        with open(source_path, "rb") as f:
            self.client.write_file(self._id(), target_path, f, mode=mode)

    async def upload_dir(self, source_dir: Union[str, os.PathLike], target_dir: str) -> None:
        """Copies a local directory's contents under target_dir in the sandbox."""
        await asyncio.to_thread(self.client.upload_dir, self._id(), source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Union[str, os.PathLike]) -> None:
        """Copies a file of the sandbox to a local path."""
        await asyncio.to_thread(self.download_file_sync, source_path, target_path)

    def download_file_sync(self, source_path: str, target_path: Union[str, os.PathLike]) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        with self.client.open_file(self._id(), source_path) as r, open(target_path, "wb") as f:
            for chunk in iter(lambda: r.read(1 << 20), b""):
                f.write(chunk)

    async def download_dir(self, source_dir: str, target_dir: Union[str, os.PathLike]) -> None:
        """Copies a directory of the sandbox into a local one, overwriting."""
        await asyncio.to_thread(self.client.download_dir, self._id(), source_dir, target_dir)

    async def is_dir(self, path: str, user: Any = None) -> bool:
        return await asyncio.to_thread(self._is, path, "dir")

    async def is_file(self, path: str, user: Any = None) -> bool:
        return await asyncio.to_thread(self._is, path, "file")

    def _is(self, path: str, kind: str) -> bool:
        try:
            return self.client.stat(self._id(), path).type == kind
        except errors.NotFound:
            return False

    # Hooks.

    async def apply_network_policy(self, policy: Any) -> None:
        """Replaces the sandbox's egress policy: Harbor's NetworkPolicy (or
        a dict of one) with network_mode "public", "no-network" or
        "allowlist" and allowed_hosts."""
        mode = _field(policy, "network_mode", "public")
        p = _policy(str(getattr(mode, "value", mode)), list(_field(policy, "allowed_hosts") or []))
        await asyncio.to_thread(self.client.set_network, self._id(),
                                p or NetworkPolicy(egress="allow-all"))

    async def run_healthcheck(self) -> None:
        """Runs the task's health check (Docker HEALTHCHECK semantics)
        until it passes, or raises HealthcheckError after its retries."""
        if HAVE_HARBOR:
            return await super().run_healthcheck()  # type: ignore[misc]
        hc = _field(self.task_env_config, "healthcheck")
        if not hc:
            return
        command = _field(hc, "command")
        retries = int(_field(hc, "retries", 3))
        start_end = time.monotonic() + float(_field(hc, "start_period_sec", 0.0))
        failures = 0
        while True:
            r = await self.exec(command, timeout_sec=float(_field(hc, "timeout_sec", 30.0)))
            if r.return_code == 0:
                return
            if time.monotonic() < start_end:
                await asyncio.sleep(float(_field(hc, "start_interval_sec", 5.0)))
                continue
            failures += 1
            if failures >= retries:
                raise HealthcheckError(f"health check failed {retries} times: {command}")
            await asyncio.sleep(float(_field(hc, "interval_sec", 5.0)))

    async def prepare_logs_for_host(self) -> None:
        """Nothing to do: the logs are downloaded, not mounted."""

    @classmethod
    def preflight(cls) -> None:
        """Checks that the server answers before Harbor queues trials."""
        Client().health()


class _Type:
    """Harbor's environments name their type with an enum's member; this
    stands for one."""

    class _Member(str):
        @property
        def value(self) -> str:
            return str(self)

    ATOLL = _Member("atoll")


def _policy(mode: Optional[str], hosts: List[str]) -> Optional[NetworkPolicy]:
    """atoll's egress policy of Harbor's network mode: public is no policy
    (the server's default, allow-all), no-network denies all, allowlist
    denies all but the hosts."""
    if mode in (None, "public"):
        return None
    if mode == "no-network":
        return NetworkPolicy(egress="deny-all")
    if mode == "allowlist":
        return NetworkPolicy(egress="deny-all", allow=hosts)
    raise errors.invalid(f"unknown network_mode {mode!r}")
