"""Errors of atoll's API, one class per error code.

Every error answer of the server is ``{"code", "message"}``; the code picks
the class from :data:`KINDS`, the one table here, which mirrors the Go
SDK's and ``api.ErrorCodes`` (a Go test compares them). An answer without
a JSON body, e.g. from a proxy in front of the server, is classified by its
HTTP status through :data:`STATUSES`.

    try:
        c.get_sandbox("sb-nope")
    except atoll.NotFound as e:
        print(e.code, e.message)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type


class Error(Exception):
    """An error answer of the server, or a failure the SDK classified the
    same way (e.g. a bad argument refused before any request)."""

    #: the API's error code, e.g. ``"not_found"``
    code: str = ""

    def __init__(self, message: str = "", *, status: int = 0, code: str = "",
                 retry_after: float = 0.0, quota: Optional[Dict[str, Any]] = None):
        super().__init__(message or (f"{status} {code}".strip()))
        self.message = message
        self.status = status
        if code:
            self.code = code
        #: seconds the server asked to wait (Retry-After) before the same
        #: request may succeed: it was busy (503) or over a rate (429)
        self.retry_after = retry_after
        #: on quota_exceeded: the quota's name, limit, use and request
        self.quota = quota


class Invalid(Error):
    """A bad argument (400)."""
    code = "invalid"


class Unauthorized(Error):
    """No API key, or one the server does not accept (401)."""
    code = "unauthorized"


class Forbidden(Error):
    """The key may not do this, e.g. an admin call with a tenant key (403)."""
    code = "forbidden"


class NotFound(Error):
    """No such sandbox, snapshot, template, file, process, ... (404)."""
    code = "not_found"


class Conflict(Error):
    """The thing is not in a state that allows this, or exists (409)."""
    code = "conflict"


class TooLarge(Error):
    """A body or header block above the server's limits (413, 431)."""
    code = "too_large"


class QuotaExceeded(Error):
    """Over a tenant quota or rate (429); ``quota`` says which."""
    code = "quota_exceeded"


class Unavailable(Error):
    """The server cannot do this now, or is not configured to (503)."""
    code = "unavailable"


class Internal(Error):
    """A failure inside the server (500)."""
    code = "internal"


#: KINDS maps each of the API's error codes to its class and HTTP status,
#: and the other statuses that mean it (api.ErrorCodes in Go).
KINDS: List[tuple] = [
    # (code, class, status, also)
    ("invalid", Invalid, 400, ()),
    ("unauthorized", Unauthorized, 401, ()),
    ("forbidden", Forbidden, 403, ()),
    ("not_found", NotFound, 404, ()),
    ("conflict", Conflict, 409, ()),
    ("too_large", TooLarge, 413, (431,)),
    ("quota_exceeded", QuotaExceeded, 429, ()),
    ("unavailable", Unavailable, 503, (502, 504)),
    ("internal", Internal, 500, ()),
]

_BY_CODE: Dict[str, Type[Error]] = {code: cls for code, cls, _, _ in KINDS}
#: STATUSES maps an HTTP status to the code an answer without a JSON body
#: is read as.
STATUSES: Dict[int, str] = {}
for _code, _cls, _status, _also in KINDS:
    STATUSES[_status] = _code
    for _s in _also:
        STATUSES[_s] = _code


def status_of(code: str) -> int:
    """The HTTP status the server answers errors of code with."""
    for c, _, status, _ in KINDS:
        if c == code:
            return status
    return 500


def error_from(status: int, body: bytes, retry_after: float = 0.0) -> Error:
    """The Error an answer with status and body describes."""
    import json
    code, message, quota = "", "", None
    try:
        doc = json.loads(body or b"{}")
        if isinstance(doc, dict):
            code = str(doc.get("code") or "")
            message = str(doc.get("message") or "")
            quota = doc.get("quota")
    except ValueError:
        pass
    if code not in _BY_CODE:
        code = STATUSES.get(status, code)
    if not message:
        message = f"{status} {code}".strip()
    return error_of_code(code, message, status=status, retry_after=retry_after, quota=quota)


def error_of_code(code: str, message: str, *, status: int = 0,
                  retry_after: float = 0.0, quota: Optional[Dict[str, Any]] = None) -> Error:
    """The Error of code, for errors that arrive inside a stream that had
    already begun with 200 (a build's or an exec's error event)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, status=status or status_of(code), code=code,
               retry_after=retry_after, quota=quota)


def invalid(message: str) -> Invalid:
    """A bad argument the SDK refuses before sending anything."""
    return Invalid(message, status=400)
