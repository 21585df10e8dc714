"""A request's traffic class at the edge: header, key default, the body's field; and whose request it is.

The class (``app/serving/admission/classes.py``) of an HTTP request is, first to last: the body's
``priority`` field (a JSON body's top-level field, a urlencoded or multipart form field, or
on the upstream GET routes a query field), the ``X-Priority`` header, the API key's default
(``server.api_keys_file``: ``KEY priority=bulk``), else ``interactive``.

The edge (``app/api/admission.py``) learns the header and the key's default before the body,
and sniffs the body's field from the bytes it already holds: a body that does not mention
``priority`` is never parsed here, and a multipart body (uploaded audio) is searched for the
one field, never split. An invalid header is refused here (400 ``invalid_priority``); an
invalid body value is left to the router, whose schema refuses it like any other field.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

from app.serving.admission.classes import Priority, parse_priority
from app.serving.errors import BadRequest

HEADER = b"x-priority"
FIELD = "priority"
_MENTION = FIELD.encode()
_BOUNDARY = re.compile(rb'boundary="?([^";\s]+)"?', re.IGNORECASE)


def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """The value of the request's header ``name`` (lower-case bytes, as ASGI gives names), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


def header_priority(scope: dict[str, Any]) -> Priority | None:
    """The ``X-Priority`` header's class; None without one; BadRequest for an unknown one."""
    raw = header(scope, HEADER)
    if raw is None:
        return None
    try:
        return parse_priority(raw.decode("latin-1"))
    except ValueError as exc:
        raise BadRequest("invalid_priority", f"X-Priority: {exc}", param="X-Priority") from None


def _valid(value: Any) -> Priority | None:
    try:
        return parse_priority(value)
    except ValueError:
        return None  # the router's schema refuses it with the surface's own field error


def _form_value(raw: bytes) -> Priority | None:
    for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if key == FIELD:
            return _valid(value)
    return None


def _multipart_value(body: bytes, content_type: bytes) -> Priority | None:
    found = _BOUNDARY.search(content_type)
    if found is None:
        return None
    delimiter = b"\r\n--" + found.group(1)
    field = re.search(rb'form-data;\s*name="priority"[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n', body)
    if field is None:
        return None
    end = body.find(delimiter, field.end())
    return _valid(body[field.end():end if end >= 0 else len(body)].decode("utf-8", "replace"))


def body_priority(scope: dict[str, Any], body: bytes) -> Priority | None:
    """The class the body (or, without one, the query string) names; None when it names none or an invalid one."""
    query = scope.get("query_string", b"")
    if not body:
        return _form_value(query) if _MENTION in query else None
    if _MENTION not in body:
        return None  # the common case: nothing to parse
    ctype = (header(scope, b"content-type") or b"").lower()
    if ctype.startswith(b"multipart/form-data"):
        return _multipart_value(body, header(scope, b"content-type") or b"")
    if ctype.startswith(b"application/x-www-form-urlencoded"):
        return _form_value(body)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the router answers the parse error
    return _valid(data.get(FIELD)) if isinstance(data, dict) and FIELD in data else None


def client_of(scope: dict[str, Any], key_id: str | None) -> str:
    """Whose request, for fairness between bulk clients: the API key's id, else the client's address."""
    if key_id:
        return key_id
    client = scope.get("client")
    return client[0] if client else "-"
