"""Bounded request heads: uvicorn's httptools protocol with a size, a field count and a deadline.

uvicorn (httptools) takes a head of any size, any number of fields and any duration: a
100 MB header was read whole and answered 200 (~15 CPU-s, +200 MB RSS), and a client that
sends a byte now and then holds its connection forever, because the keep-alive timer stops
at the first byte and a connection that sends nothing has no timer at all.

``HeadLimitedProtocol`` keeps uvicorn's protocol and adds, per request head:

* **size**: the request line and header fields together at most ``max_bytes``
  (``server.max_header_bytes``), counted as they arrive, so an endless header is
  refused within one read past the limit, never buffered whole: 431;
* **fields**: at most ``max_headers`` (``server.max_headers``): 431;
* **time**: the head must be in ``timeout_s`` (``server.header_timeout_s``) after the
  connection opens, or after the first byte of a later request on a kept-alive
  connection: 408; a new connection that sends nothing in that time is closed without an
  answer. An idle kept-alive connection is closed after uvicorn's ``timeout_keep_alive``
  (``server.keep_alive_s``).

A refusal is the error table's envelope with ``Connection: close``, one log line and a count
in ``tts_head_refused_total{reason}``. The server stops reading at once, sends its answer
and end of stream, and closes the socket ``LINGER_S`` later, so a client still sending can
read the answer before the reset. Pass it to ``uvicorn.Config(http=...)`` via ``protocol()``.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from asyncio import TimerHandle, Transport
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httptools
from prometheus_client.core import CounterMetricFamily, Metric
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from app.api.errors import ErrorInfo, envelope

log = logging.getLogger("cosyserve.http")

# Seconds between a refusal's answer (and end of stream) and the socket's close: long enough for
# a client that is still sending to read the answer, short enough to hold nothing for long.
LINGER_S = 1.0

REASONS = ("too_large", "too_many", "timeout", "idle")


@dataclass(frozen=True)
class HeadLimits:
    max_bytes: int = 65536  # request line + header fields
    max_headers: int = 100
    timeout_s: float = 10.0


class HeadRefusals:
    """Refused heads by reason, read by ``HeadRefusalCollector`` at scrape time."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()


class HeadRefusalCollector:
    def __init__(self, refusals: HeadRefusals) -> None:
        self.refusals = refusals

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "tts_head_refused", "Request heads refused: too_large (431, server.max_header_bytes), too_many "
            "(431, server.max_headers), timeout (408, server.header_timeout_s), idle (a connection that sent "
            "nothing within server.header_timeout_s, closed)", labels=["reason"])
        for reason in REASONS:
            family.add_metric([reason], float(self.refusals.counts[reason]))
        yield family


class HeadRefused(Exception):
    def __init__(self, status: int, code: str, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.reason = status, code, message, reason


def protocol(limits: HeadLimits, refusals: HeadRefusals) -> Callable[..., HeadLimitedProtocol]:
    """What ``uvicorn.Config(http=...)`` takes: it builds one protocol per connection."""
    return functools.partial(HeadLimitedProtocol, limits=limits, refusals=refusals)


class HeadLimitedProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: Any = None, *, limits: HeadLimits, refusals: HeadRefusals) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.refusals = refusals
        self._timer: TimerHandle | None = None  # the head's deadline (or, when refused, the close)
        self._got_bytes = False  # bytes arrived since the deadline was set
        self._in_head = False  # a request has begun and its head is not complete
        self._head_number = 0  # which head that is, one per request on this connection
        self._raw = 0  # bytes of reads that fell wholly inside the head
        self._parsed = 0  # bytes of the request target and complete header fields
        self._fields = 0
        self._refused = False

    # -- the connection -------------------------------------------------------------------------------
    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._set_deadline()  # a first request, whether or not a byte ever comes

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, plus: a deadline from the first byte between requests, the size counted per read."""
        if self._refused:
            return  # its answer is out; nothing more is read
        if self._timer is None and not self._busy():
            self._set_deadline()  # the first byte after a response (uvicorn's keep-alive timer stops here)
        self._got_bytes = True
        head_before = self._head_number if self._in_head else None
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, HeadRefused):
                self._refuse(exc.__context__)
            else:
                self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head and self._head_number == head_before:  # all of this read is the same head
            self._raw += len(data)
            if self._raw > self.limits.max_bytes:
                self._refuse(self._too_large())

    def _bad_request(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    # -- the parser's callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_number = True, self._head_number + 1
        self._raw = self._parsed = self._fields = 0
        if self._timer is None:
            self._set_deadline()  # a request pipelined behind a running one

    def on_url(self, url: bytes) -> None:
        self._parsed += len(url)
        if self._parsed > self.limits.max_bytes:
            raise self._too_large()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        self._parsed += len(name) + len(value) + 4  # ": " and CRLF
        if self._fields > self.limits.max_headers:
            raise HeadRefused(431, "too_many_headers", f"the request has over {self.limits.max_headers} header "
                              "fields (server.max_headers)", "too_many")
        if self._parsed > self.limits.max_bytes:
            raise self._too_large()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_timer()
        self._got_bytes = False
        super().on_headers_complete()

    # -- the deadline and the refusal -----------------------------------------------------------------
    def _busy(self) -> bool:
        """A response is being produced (or a pipelined one waits): nothing else may be written now."""
        return self.cycle is not None and not self.cycle.response_complete

    def _set_deadline(self) -> None:
        self._cancel_timer()
        self._got_bytes = False
        self._timer = self.loop.call_later(self.limits.timeout_s, self._deadline_passed)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _deadline_passed(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._in_head or self._got_bytes:
            self._refuse(HeadRefused(408, "header_timeout", f"the request head did not arrive within "
                                     f"{self.limits.timeout_s:g} s (server.header_timeout_s)", "timeout"))
        else:
            self.refusals.counts["idle"] += 1
            log.info("idle connection from %s sent no request within %g s, closed", self._client(),
                     self.limits.timeout_s)
            self.transport.close()

    def _too_large(self) -> HeadRefused:
        return HeadRefused(431, "request_head_too_large", f"the request head is over {self.limits.max_bytes} "
                           "bytes (server.max_header_bytes)", "too_large")

    def _client(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "an unknown client"

    def _refuse(self, refused: HeadRefused) -> None:
        """Stop reading; answer ``refused`` with ``Connection: close`` (after the response in flight, if any,
        which then ends the connection); one log line."""
        self._refused = True
        self._cancel_timer()
        self.refusals.counts[refused.reason] += 1
        log.info("%d: %s from %s, connection closed", refused.status, refused.message, self._client())
        self.flow.pause_reading()
        if self._busy():
            self.cycle.keep_alive = False  # the connection ends with the responses already owed
            return
        request_id = uuid.uuid4().hex
        info = ErrorInfo(refused.status, refused.code, refused.message)
        body = json.dumps(envelope(self._path(), info, request_id), separators=(",", ":")).encode()  # as JSONResponse
        head = [STATUS_LINE[refused.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\nx-request-id: ", request_id.encode(), b"\r\n\r\n", body]
        self.transport.write(b"".join(head))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    def _path(self) -> str:
        """The request's path once its target is complete (a header field followed it), else ''."""
        if not self._fields:
            return ""
        try:
            return httptools.parse_url(self.url).path.decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            return ""
