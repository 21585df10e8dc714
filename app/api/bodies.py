"""Request bodies, read at the edge before any permit: bounded in size, time, number and bytes.

A synthesis permit is precious (the adaptive limit is 2 on a 2-core host), so no
permit may wait for a client's bytes. The edge (``app/api/admission.py``) reads
every request body with :meth:`BodyGate.read` first and hands the handler a
``receive`` that replays it; the permit is taken only once the body is in.
Reading a body holds a place of its own instead, which costs a coroutine and
the bytes received:

* **size**: a declared ``Content-Length`` over the limit is refused (413) before a
  byte of the body is read (a client that sent ``Expect: 100-continue`` never
  sends it); a chunked body is cut off at the limit (413), the rest never read.
  A multipart form (uploaded audio) may be ``server.max_upload_mb`` (+1 MB for its
  fields); any other body (JSON, a urlencoded form) is text and fields only, so its
  limit is what the longest valid request can take (``max_plain_bytes``): a 1 MB
  ``prompt_text`` is refused before it is read, not parsed first.
* **time**: the whole body must arrive within ``body_timeout_s`` (408): a
  dribbling client loses its place, it never had a permit.
* **number**: at most ``max_reads`` bodies are read at once; beyond, a body waits (FIFO) up to
  ``wait_s`` for a place (a burst of fast clients, e.g. a bulk backlog sent at once, is read in
  turn in milliseconds), and at most ``WAITERS_PER_READ`` x ``max_reads`` bodies wait; past
  either, 503. Clients that hold every place by dribbling make the others wait ``wait_s`` at
  most, then hear 503 as before.
* **bytes**: all the bodies being read hold at most ``max_buffered_bytes``
  together (a declared length is reserved up front, a chunked body as it
  grows); beyond, 503 at once. Memory held by bodies in flight stays bounded
  whatever clients do, and ``/metrics`` shows it (``tts_body_reads``,
  ``tts_body_buffered_bytes``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.serving.bounds import size_text
from app.serving.errors import BodyTimeout, Overloaded, PayloadTooLarge

Receive = Callable[[], Awaitable[dict[str, Any]]]

# The Retry-After of a refusal because too many bodies are being read: a body takes about this long.
BUSY_RETRY_AFTER_S = 1.0
# Bodies that may wait for a read place, per place: a waiter is a coroutine on a connection uvicorn already
# holds, so this bounds only the bookkeeping; 8 x 64 covers any burst a client pool sends at once.
WAITERS_PER_READ = 8


class ClientLeft(Exception):
    """The client disconnected before its body was complete: nothing to answer."""


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # one request's whole body (a multipart form with uploaded audio)
    timeout_s: float  # the whole body must arrive within this (0: no limit)
    max_plain_bytes: int = 1 << 20  # a body that is not multipart (JSON, urlencoded): fields only
    max_reads: int = 64  # bodies read at once
    max_buffered_bytes: int = 256 << 20  # bytes all bodies being read may hold together
    wait_s: float = 2.0  # how long a body may wait for a read place when all are taken (0: 503 at once)


def has_body(scope: dict[str, Any]) -> bool:
    """The request carries a body: a non-zero ``Content-Length`` or a chunked transfer."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return b"chunked" in value.lower()
    return False


def is_multipart(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.lower().startswith(b"multipart/")
    return False


def declared_length(scope: dict[str, Any]) -> int | None:
    """The ``Content-Length`` header's value (None: absent or unreadable; uvicorn rejects bad ones)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyGate:
    """The bounded reading of request bodies of one server. Event-loop thread only."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self.reading = 0  # bodies being read now
        self.buffered = 0  # bytes reserved by the bodies being read
        self.refused: dict[str, int] = {}  # too_large | timeout | busy
        self._waiters: deque[asyncio.Future[None]] = deque()  # bodies waiting for a read place, oldest first

    def count_refusal(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def limit_of(self, scope: dict[str, Any]) -> tuple[int, str]:
        """The body limit for this request, and what sets it (for the message)."""
        if is_multipart(scope):
            return self.limits.max_bytes, "server.max_upload_mb"
        return self.limits.max_plain_bytes, "a body without uploaded audio: server.max_text_chars and the field caps"

    def check_declared(self, scope: dict[str, Any]) -> None:
        """413 now for a declared length over the limit (nothing of the body read)."""
        declared = declared_length(scope)
        limit, why = self.limit_of(scope)
        if declared is not None and declared > limit:
            self.count_refusal("too_large")
            raise PayloadTooLarge("payload_too_large", f"the request body is {declared} bytes; the limit is "
                                  f"{size_text(limit)} ({why})")

    async def read(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """The whole body, or PayloadTooLarge / BodyTimeout / Overloaded / ClientLeft."""
        self.check_declared(scope)
        lim = self.limits
        reading = _Reading(self, declared_length(scope) or 0, *self.limit_of(scope))
        if self.buffered + reading.held > lim.max_buffered_bytes:
            self.count_refusal("busy")
            raise Overloaded(f"{self.reading} request bodies are being read; try again shortly", BUSY_RETRY_AFTER_S)
        if self.reading >= lim.max_reads or self._waiters:
            await self._wait_for_place()  # a place handed over counts in ``reading`` already
        else:
            self.reading += 1
        self.buffered += reading.held
        try:
            if lim.timeout_s <= 0:
                return await reading.collect(receive)
            try:
                async with asyncio.timeout(lim.timeout_s):
                    return await reading.collect(receive)
            except TimeoutError:
                self.count_refusal("timeout")
                raise BodyTimeout("body_timeout", f"the request body did not arrive within "
                                  f"{lim.timeout_s:g} s (server.body_timeout_s)") from None
        finally:
            self.buffered -= reading.held
            self._give_place()

    async def _wait_for_place(self) -> None:
        """Wait FIFO for a read place (handed over by a finished read), or Overloaded."""
        lim = self.limits
        if lim.wait_s <= 0 or len(self._waiters) >= WAITERS_PER_READ * lim.max_reads:
            self.count_refusal("busy")
            raise Overloaded(f"{self.reading} request bodies are being read; try again shortly", BUSY_RETRY_AFTER_S)
        place = asyncio.get_running_loop().create_future()
        self._waiters.append(place)
        try:
            async with asyncio.timeout(lim.wait_s):
                await place
        except BaseException as exc:
            handed = place.done() and not place.cancelled()  # a read ended and passed its place on
            if isinstance(exc, TimeoutError) and handed:
                return  # the place came as the wait ran out: take it
            if handed:
                self._give_place()  # handed a place, then cancelled (the client left): pass it on
            elif place in self._waiters:
                self._waiters.remove(place)
            if isinstance(exc, TimeoutError):
                self.count_refusal("busy")
                raise Overloaded(f"{self.reading} request bodies are being read and none finished within "
                                 f"{lim.wait_s:g} s; try again shortly", BUSY_RETRY_AFTER_S) from None
            raise

    def _give_place(self) -> None:
        """A read ended: its place goes to the oldest waiter, else back to the pool of places."""
        while self._waiters:
            place = self._waiters.popleft()
            if not place.done():
                place.set_result(None)
                return
        self.reading -= 1


class _Reading:
    """One body being read: its parts and the bytes it has reserved in the gate."""

    def __init__(self, gate: BodyGate, declared: int, limit: int, why: str) -> None:
        self.gate = gate
        self.held = declared  # a declared length is reserved up front
        self.limit, self.why = limit, why

    async def collect(self, receive: Receive) -> bytes:
        gate, lim = self.gate, self.gate.limits
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientLeft()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.limit:
                    gate.count_refusal("too_large")
                    raise PayloadTooLarge("payload_too_large", f"the request body is larger than "
                                          f"{size_text(self.limit)} ({self.why}); the rest was not read")
                if size > self.held:  # chunked (or longer than declared): reserve as it grows
                    grow = size - self.held
                    if gate.buffered + grow > lim.max_buffered_bytes:
                        gate.count_refusal("busy")
                        raise Overloaded("the server is reading too many request bodies; try again shortly",
                                         BUSY_RETRY_AFTER_S)
                    gate.buffered += grow
                    self.held = size
                parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` whole once, then the connection's own messages (disconnect)."""
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
