"""Asynchronous use of the client: every method of :class:`atoll.Client`,
run in a worker thread by asyncio.to_thread, since the standard library
has no asynchronous HTTP client.

    async with atoll.AsyncClient(url, key) as c:
        sb = await c.create_sandbox(template="host")
        r = await c.exec(sb.id, shell="echo hi")

Methods that return streams (exec_stream, attach, watch, logs, open_file,
download_tar, terminal) return the same blocking objects as the
synchronous client; read them with asyncio.to_thread too.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from .client import Client


class AsyncClient:
    """The asynchronous twin of Client; same arguments, same methods, awaited."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.sync = Client(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(attr, *args, **kwargs)

        return call

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        pass
