"""The client side of ``WS /v1/audio/speech/stream``, with no framework and no socket library.

The messages a plugin sends, the URL it connects to, and what a server ``error`` event means
for a client: its HTTP-like status and whether the same request may succeed later. The
protocol itself is documented in docs/api.md ("Streaming text in").
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PATH = "/v1/audio/speech/stream"

INPUT_DONE = json.dumps({"type": "input.done"})
INPUT_CANCEL = json.dumps({"type": "input.cancel"})

# The codes a server error event carries, by the status the same error has over HTTP (app/api/errors.py);
# any other code is the client's (400): the same message fails again.
_STATUS = {"session_limit": 503, "overloaded": 503, "queue_timeout": 503, "draining": 503, "not_ready": 503,
           "idle_timeout": 503, "session_expired": 503,  # the session ended: a new one may succeed
           "deadline_exceeded": 504, "engine_failure": 500, "invalid_api_key": 401}


def stream_url(base_url: str) -> str:
    """The route's ``ws://``/``wss://`` URL from a server's base URL (``http://host:8000``, ``.../v1`` or ``ws://``)."""
    parts = urlsplit(base_url.rstrip("/"))
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"base_url must be an http(s) or ws(s) URL, not {base_url!r}")
    path = parts.path.removesuffix("/v1")
    return urlunsplit((scheme, parts.netloc, path + PATH, "", ""))


def config_message(**fields: Any) -> str:
    """``session.config`` with the given fields; a field that is None is left to the server."""
    return json.dumps({"type": "session.config", **{k: v for k, v in fields.items() if v is not None}})


def text_message(text: str) -> str:
    return json.dumps({"type": "input.text", "text": text})


class ServerError(Exception):
    """An ``error`` event: ``code`` and ``message`` as the server wrote them."""

    def __init__(self, event: dict[str, Any]) -> None:
        body = event.get("error") or {}
        self.event = event
        self.code: str = str(body.get("code", "error"))
        self.message: str = str(body.get("message", self.code))
        self.request_id: str | None = body.get("request_id")
        self.retry_after_s: float | None = body.get("retry_after_s")
        self.utterance: int | None = event.get("utterance")
        super().__init__(f"{self.code}: {self.message}")

    @property
    def status(self) -> int:
        return _STATUS.get(self.code, 400)

    @property
    def retryable(self) -> bool:
        return self.status >= 500
