"""No secret in any log line, at any level: a logging filter that redacts API keys.

uvicorn logs a WebSocket handshake at ``debug`` line by line (``< GET /path?api_key=KEY``,
``< x-api-key: KEY``, ``< authorization: Bearer KEY``), before any of our code runs, so
removing the key from the request is not enough. :class:`Redactor` rewrites a record's
message before any handler formats it:

* the value of a credential in a query string (``api_key=``, ``access_token=``, ``token=``, ``key=``);
* the value of an ``Authorization``, ``Proxy-Authorization`` or ``X-API-Key`` header, in
  the ``name: value`` shape and in the ``(b'name', b'value')`` shape of an ASGI scope;
* every configured key, wherever it appears (a key pasted into a text field, say).

:func:`install` puts it on every handler of the root logger (what ``cosyserve serve``
logs through) and on the loggers that log requests themselves (``uvicorn*``,
``websockets*``, ``cosyserve*``), so a record is redacted whichever handler takes it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

MASK = "***"
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "websockets", "websockets.server",
           "websockets.protocol", "cosyserve", "cosyserve.access", "cosyserve.ws")

_QUERY = re.compile(r"(?i)([?&;](?:api[_-]?key|access[_-]?token|token|key)=)[^&#\s'\"]*")
_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization|x-api-key)(\s*[:=]\s*)([^\r\n'\"]*)")
_SCOPE_HEADER = re.compile(r"(?i)(b?['\"](?:(?:proxy-)?authorization|x-api-key)['\"]\s*,\s*b?['\"])([^'\"]*)")


def redact(text: str, keys: Iterable[str] = ()) -> str:
    """``text`` with every credential it holds replaced by ``***``."""
    text = _QUERY.sub(lambda m: m.group(1) + MASK, text)
    text = _SCOPE_HEADER.sub(lambda m: m.group(1) + MASK, text)
    text = _HEADER.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    for key in keys:
        if key in text:
            text = text.replace(key, MASK)
    return text


class Redactor(logging.Filter):
    """Rewrites a record's message (and exception text) without its secrets; never drops a record."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        super().__init__("cosyserve.redact")
        # longest first, so a key that contains another is masked whole
        self.keys = tuple(sorted({k for k in keys if k}, key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_redacted", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string: leave it to the handler to report
            return True
        clean = redact(message, self.keys)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.keys)
        record._redacted = True
        return True


def install(keys: Iterable[str] = ()) -> Redactor:
    """Redact on the root logger's handlers and on the request loggers; replaces an earlier install."""
    redactor = Redactor(keys)
    targets: list[logging.Filterer] = [*logging.getLogger().handlers]
    targets += [logging.getLogger(name) for name in LOGGERS]
    for target in targets:
        for old in [f for f in target.filters if isinstance(f, Redactor)]:
            target.removeFilter(old)
        target.addFilter(redactor)
    return redactor
