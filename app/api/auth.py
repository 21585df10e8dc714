"""API keys: a plain ASGI middleware in front of every route, HTTP and WebSocket alike.

With ``server.api_keys`` (or ``server.api_keys_file``) set, a request must carry
one of the keys, as ``Authorization: Bearer KEY`` (what the OpenAI SDK sends) or
``X-API-Key: KEY``. A browser cannot set headers on a WebSocket, so WebSocket
handshakes (only they) may also carry it as the query parameter ``api_key``,
which is then removed from the scope so no handler or log downstream sees it.

A missing or wrong key gets 401 with the usual error envelope (OpenAI's error
object on OpenAI routes) and ``WWW-Authenticate: Bearer``; a WebSocket is
refused before it is accepted (an HTTP 401 where the server supports denial
responses, else close code 1008). Keys are compared in constant time
(``hmac.compare_digest``, against every configured key) and never logged: the
access log names the path only, never headers or the query string.

Open without a key: the probes (``/health/*``), the playground page and its
assets (it asks for a key and sends it with every call), the API docs
(``/docs``, ``/openapi.json``), and ``/metrics`` unless ``metrics.require_key``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from app.api.context import context_of
from app.api.errors import classify, render_scope
from app.serving.errors import Unauthorized

QUERY_PARAM = "api_key"  # WebSocket handshakes only
UNAUTHORIZED_REASONS = ("missing_api_key", "invalid_api_key")  # the 401's error codes
REALM = 'Bearer realm="cosyserve"'
OPEN_PATHS = frozenset({"/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/favicon.ico"})
OPEN_PREFIXES = ("/health/", "/playground/")


def is_open(path: str, metrics_open: bool) -> bool:
    """Paths served without a key."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return True
    return metrics_open and path == "/metrics"


def key_id(key: str) -> str:
    """A key's name in logs and fairness (``key-`` and 8 hex digits of its SHA-256): stable, never the key."""
    return "key-" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:8]


class KeyChecker:
    """Constant-time membership test over the configured keys."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(k.encode("utf-8") for k in keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def valid(self, key: str) -> bool:
        return self.find(key) is not None

    def find(self, key: str) -> str | None:
        """The configured key equal to ``key``, or None."""
        candidate = key.encode("utf-8", "surrogateescape")
        found = None
        for k in self._keys:  # no early exit: the time taken does not say which key came close
            if hmac.compare_digest(candidate, k):
                found = k
        return None if found is None else found.decode("utf-8")


def presented_keys(scope: dict) -> list[str]:
    """The keys a request carries: the Bearer token, X-API-Key, and (WebSocket only) ?api_key=."""
    keys = []
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                keys.append(token.strip())
        elif name == b"x-api-key" and value.strip():
            keys.append(value.decode("latin-1").strip())
    if scope["type"] == "websocket":
        keys.extend(v for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                            keep_blank_values=True) if k == QUERY_PARAM and v)
    return keys


def scrub_query_key(scope: dict) -> None:
    """Take ``api_key`` out of the scope's query string, in place.

    In place on purpose: the server logs WebSocket handshakes from this same dict
    (uvicorn: ``"WebSocket /path?query" 101``), so a copy would leave the key there.
    """
    query = scope.get("query_string", b"").decode("latin-1")
    if QUERY_PARAM not in query:
        return
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != QUERY_PARAM]
    scope["query_string"] = urlencode(kept).encode("latin-1")


class APIKeyMiddleware:
    def __init__(self, app: Callable, keys: Iterable[str], metrics_open: bool = True,
                 on_refused: Callable[[str], None] | None = None,
                 priorities: Mapping[str, str] | None = None) -> None:
        self.app = app
        self.checker = KeyChecker(keys)
        self.priorities = dict(priorities or {})  # key -> its default traffic class (the keys file)
        self.metrics_open = metrics_open
        self.on_refused = on_refused  # (reason) -> None: counts the 401s, WebSocket ones included

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind == "websocket":
            keys = presented_keys(scope)
            scrub_query_key(scope)  # keys on or off: a key in a URL is never logged or seen downstream
        if kind not in ("http", "websocket") or not self.checker or is_open(scope["path"], self.metrics_open):
            await self.app(scope, receive, send)
            return
        if kind == "http":
            keys = presented_keys(scope)
        found = next((k for k in map(self.checker.find, keys) if k is not None), None)
        if found is not None:
            ctx = context_of(scope)  # whose request (bulk fairness) and its default class, never the key itself
            ctx.key_id, ctx.key_priority = key_id(found), self.priorities.get(found)
            await self.app(scope, receive, send)
            return
        if keys:
            exc = Unauthorized("invalid_api_key", "the API key is not valid")
            challenge = f'{REALM}, error="invalid_token"'
        else:
            exc = Unauthorized("missing_api_key", "an API key is required: send 'Authorization: Bearer KEY' "
                                                  "or 'X-API-Key: KEY'")
            challenge = REALM
        if self.on_refused is not None:
            self.on_refused(exc.code)
        response = render_scope(scope, classify(exc), headers={"WWW-Authenticate": challenge})
        if kind == "http":
            await response(scope, receive, send)
            return
        message = await receive()  # the handshake's websocket.connect; refuse before any accept
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await response(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": exc.code})


SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY (the OpenAI SDK's api_key)"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}


def document_keys(app: Any, metrics_open: bool) -> None:
    """With keys on, the OpenAPI schema says so: two security schemes, open routes marked open.

    Swagger UI (``/docs``) then shows an Authorize button and sends the key with "Try it out".
    """
    build = app.openapi

    def openapi() -> dict:
        schema = build()
        if "security" not in schema:
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            schema["security"] = [{"bearer": []}, {"apiKey": []}]
            for path, operations in schema.get("paths", {}).items():
                if is_open(path, metrics_open):
                    for operation in operations.values():
                        operation["security"] = []
        return schema

    app.openapi = openapi


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable from elsewhere


def exposure_warning(host: str, keys: Iterable[str]) -> str | None:
    """The warning to log at startup when the server is reachable beyond this host without keys."""
    if any(True for _ in keys) or is_loopback(host):
        return None
    return (f"listening on {host}, beyond this machine, with no API keys: anyone who can reach it can use it. "
            "Set server.api_keys or server.api_keys_file (env COSYSERVE_SERVER__API_KEYS / __API_KEYS_FILE).")
