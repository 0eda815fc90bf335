"""The HTTP layer of the client: one request on one connection of
http.client, failover between a cluster's nodes, and error answers turned
into :mod:`atoll.errors` classes."""

from __future__ import annotations

import http.client
import io
import json
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import errors
from .types import encode

Body = Union[None, bytes, bytearray, str, io.IOBase, Iterable[bytes]]
Query = Optional[Sequence[Tuple[str, Any]]]


class Transport:
    """Sends requests to one of the servers in bases, moving to the next
    when one cannot be connected to (the Go SDK's rule: a request that
    never reached a server may go to another, unless its body is a stream
    already handed over)."""

    def __init__(self, bases: List[str], api_key: str, *, timeout: Optional[float],
                 user_agent: str, busy_retries: int, ssl_context: Optional[ssl.SSLContext]):
        self.bases = bases
        self.api_key = api_key
        self.timeout = timeout
        self.user_agent = user_agent
        self.busy_retries = busy_retries
        self.ssl_context = ssl_context
        self._cur = 0
        self._mu = threading.Lock()

    @property
    def base(self) -> str:
        return self.bases[self._cur % len(self.bases)]

    def headers(self) -> dict:
        h = {"User-Agent": self.user_agent}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def connection(self, base: str, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, str]:
        """A new connection to base and the path prefix of base."""
        u = urllib.parse.urlsplit(base)
        if u.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                u.hostname or "", u.port, timeout=timeout, context=self.ssl_context)
        elif u.scheme == "http":
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout)
        else:
            raise errors.invalid(f"server URL {base!r} is not http or https")
        return conn, u.path.rstrip("/")

    def request(self, method: str, path: str, *, query: Query = None, body: Body = None,
                ctype: str = "", json_body: Any = None, busy_retry: bool = False,
                timeout: Optional[float] = -1.0) -> http.client.HTTPResponse:
        """Sends the request and returns the response of a 2xx answer; the
        caller reads and closes it. Any other answer raises its Error."""
        if json_body is not None:
            body, ctype = json.dumps(encode(json_body)).encode(), "application/json"
        tries = 0
        while True:
            try:
                return self._send_once(method, path, query, body, ctype, timeout)
            except errors.Error as e:
                if not busy_retry or tries >= self.busy_retries or e.retry_after <= 0:
                    raise
                tries += 1
                # A little jitter spreads the clients refused together.
                time.sleep(e.retry_after * (1 + random.random() / 4))

    def _send_once(self, method, path, query, body, ctype, timeout) -> http.client.HTTPResponse:
        if timeout == -1.0:
            timeout = self.timeout
        target = path
        if query:
            target += "?" + urllib.parse.urlencode([(k, _qs(v)) for k, v in query])
        headers = self.headers()
        if ctype:
            headers["Content-Type"] = ctype
        if isinstance(body, str):
            body = body.encode()
        streamed = body is not None and not isinstance(body, (bytes, bytearray))
        for attempt in range(len(self.bases)):
            with self._mu:
                cur = self._cur
            base = self.bases[cur % len(self.bases)]
            conn, prefix = self.connection(base, timeout)
            conn.response_class = Response
            try:
                conn.connect()
            except OSError:
                conn.close()
                if attempt + 1 >= len(self.bases) or streamed:
                    raise
                with self._mu:
                    if self._cur == cur:
                        self._cur = (cur + 1) % len(self.bases)
                continue
            try:
                resp = _exchange(conn, method, prefix + target, body, headers)
            except BaseException:
                conn.close()
                raise
            # The response owns the socket from here on: closing it (or
            # reading it to its end and closing it) closes the connection.
            resp.sock, conn.sock = conn.sock, None
            if resp.status // 100 != 2:
                try:
                    raise errors.error_from(resp.status, resp.read(64 << 10),
                                            _retry_after(resp.getheader("Retry-After")))
                finally:
                    resp.close()
            return resp
        raise AssertionError("unreachable")


class Response(http.client.HTTPResponse):
    """An answer that closes its connection when it is closed."""

    sock: Optional[socket.socket] = None

    def close(self) -> None:
        super().close()
        s, self.sock = self.sock, None
        if s is not None:
            s.close()


def _exchange(conn: http.client.HTTPConnection, method: str, target: str, body: Body,
              headers: dict) -> http.client.HTTPResponse:
    try:
        conn.request(method, target, body=body, headers=headers)
    except (BrokenPipeError, ConnectionResetError):
        # The server answered before it read the whole body (a refusal)
        # and closed: its answer may still be there to read.
        try:
            return conn.getresponse()
        except (OSError, http.client.HTTPException):
            pass
        raise
    return conn.getresponse()


def _qs(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    return str(v)


def _retry_after(v: Optional[str]) -> float:
    try:
        secs = int(v or "")
    except ValueError:
        return 0.0
    return float(secs) if secs > 0 else 0.0


def read_json(resp: http.client.HTTPResponse) -> Any:
    """Reads and closes a JSON answer."""
    try:
        data = resp.read()
    finally:
        resp.close()
    return json.loads(data) if data.strip() else None


def ndjson(resp: http.client.HTTPResponse) -> Iterator[dict]:
    """The JSON objects of an NDJSON answer, one a line, as they arrive."""
    try:
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.strip()
            if line:
                yield json.loads(line)
    finally:
        resp.close()


def quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")
