"""Terminals: a pty process's input and output over a websocket, with a
websocket client (RFC 6455) of the standard library's sockets, as the
standard library has none."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import threading
import urllib.parse
from typing import Optional, Tuple

from . import errors
from ._http import Transport

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# Opcodes of RFC 6455 §5.2.
_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_MAX_MESSAGE = 4 << 20


class Terminal:
    """An interactive connection to a pty process. read() its output until
    it returns b"" (the process exited), then wait() for its exit code.

        p = c.start_process(sb.id, ["bash"], pty=(24, 80))
        with c.terminal(sb.id, p.pid) as t:
            t.write(b"echo hi; exit 3\\n")
            out = t.read_all()
            code = t.wait()
    """

    def __init__(self, sock: socket.socket, buffered: bytes = b""):
        self._sock = sock
        self._rbuf = bytearray(buffered)
        self._wmu = threading.Lock()
        self._exit: Optional[dict] = None
        self._closed = False

    @classmethod
    def connect(cls, t: Transport, path: str, *, timeout: Optional[float] = None) -> "Terminal":
        u = urllib.parse.urlsplit(t.base)
        host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
        sock = socket.create_connection((host, port), timeout=timeout)
        if u.scheme == "https":
            ctx = t.ssl_context or ssl.create_default_context()
            sock = ctx.wrap_socket(sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        hdrs = {"Host": u.netloc, "Upgrade": "websocket", "Connection": "Upgrade",
                "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
        hdrs.update(t.headers())
        req = f"GET {u.path.rstrip('/')}{path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        sock.sendall(req.encode())
        status, headers, rest = _read_head(sock)
        if status != 101:
            body = rest + _read_body(sock, headers, rest)
            sock.close()
            raise errors.error_from(status, body)
        want = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        if headers.get("sec-websocket-accept") != want:
            sock.close()
            raise errors.Error("terminal: the server's websocket handshake is wrong")
        return cls(sock, rest)

    def read(self) -> bytes:
        """The next piece of output; b"" once the process has exited."""
        while self._exit is None and not self._closed:
            op, payload = self._message()
            if op == _BINARY:
                return payload
            if op == _TEXT:
                try:
                    ev = json.loads(payload)
                except ValueError:
                    continue
                if ev.get("type") in ("exit", "error"):
                    self._exit = ev
                    self._send_frame(_CLOSE, struct.pack("!H", 1000))
            elif op == _CLOSE:
                self._closed = True
        return b""

    def read_all(self) -> bytes:
        """All output up to the process's exit."""
        out = bytearray()
        while True:
            b = self.read()
            if not b:
                return bytes(out)
            out.extend(b)

    def write(self, data: bytes | str) -> int:
        """Sends data to the terminal as typed input."""
        if isinstance(data, str):
            data = data.encode()
        self._send_frame(_BINARY, data)
        return len(data)

    def resize(self, rows: int, cols: int) -> None:
        self._send_frame(_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())

    def wait(self) -> int:
        """Waits for the process to exit and returns its exit code (-1 if
        a signal ended it); output not yet read is discarded."""
        while self.read():
            pass
        if self._exit is None:
            raise errors.Error("terminal: closed before the process exited")
        if self._exit.get("type") == "error":
            raise errors.Error("terminal: " + self._exit.get("message", ""))
        code = self._exit.get("exit_code")
        return -1 if code is None else int(code)

    def close(self) -> None:
        """Disconnects; the process keeps running."""
        if not self._closed:
            self._closed = True
            try:
                self._send_frame(_CLOSE, struct.pack("!H", 1000))
            except OSError:
                pass
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Frames.

    def _recv(self, n: int) -> bytes:
        while len(self._rbuf) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise errors.Error("terminal: the connection ended")
            self._rbuf.extend(chunk)
        b = bytes(self._rbuf[:n])
        del self._rbuf[:n]
        return b

    def _frame(self) -> Tuple[bool, int, bytes]:
        b0, b1 = self._recv(2)
        fin, op, masked, n = bool(b0 & 0x80), b0 & 0x0F, bool(b1 & 0x80), b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._recv(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._recv(8))
        if n > _MAX_MESSAGE:
            raise errors.Error("terminal: frame too large")
        mask = self._recv(4) if masked else b""
        payload = self._recv(n)
        if masked:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        return fin, op, payload

    def _message(self) -> Tuple[int, bytes]:
        """The next data or close message, answering pings on the way."""
        op0, buf = None, bytearray()
        while True:
            fin, op, payload = self._frame()
            if op == _PING:
                self._send_frame(_PONG, payload)
                continue
            if op == _PONG:
                continue
            if op == _CLOSE:
                return _CLOSE, payload
            if op != _CONT:
                op0 = op
            buf.extend(payload)
            if len(buf) > _MAX_MESSAGE:
                raise errors.Error("terminal: message too large")
            if fin:
                return op0 or _BINARY, bytes(buf)

    def _send_frame(self, op: int, payload: bytes) -> None:
        # Clients mask every frame (RFC 6455 §5.3).
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | op, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | op, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | op, 0x80 | 127, n)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        with self._wmu:
            self._sock.sendall(head + mask + masked)


def _read_head(sock: socket.socket) -> Tuple[int, dict, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise errors.Error("terminal: the server closed the connection")
        buf += chunk
        if len(buf) > 64 << 10:
            raise errors.Error("terminal: answer header too large")
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise errors.Error("terminal: malformed answer " + lines[0]) from None
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


def _read_body(sock: socket.socket, headers: dict, have: bytes) -> bytes:
    try:
        n = int(headers.get("content-length", "0")) - len(have)
    except ValueError:
        n = 0
    out = b""
    while n > 0:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            break
        out += chunk
        n -= len(chunk)
    return out
