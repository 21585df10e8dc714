"""``StreamBudget``: the bytes every stream's buffer may hold together, server-wide.

Audio a slot thread has produced waits in its stream's buffer
(``app/serving/bridge.py``) until the client reads it. Each buffer is bounded on
its own (``pool.stream_buffer_mb``, sized so a whole long answer fits and the
engine never waits for a listener at real time); this budget bounds them all
together (``pool.stream_buffer_total_mb``), so a crowd of clients that read
nothing cannot grow the server's memory past it. A stream may always hold one
item whatever the budget says, so the streams that are read keep moving; past
the budget the other producers wait (backpressure) until readers take bytes or
stalled clients are disconnected (``server.send_timeout_s``).

Thread-safe: producers add in slot threads, consumers take on the event loop.
"""

from __future__ import annotations

import threading


class StreamBudget:
    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError("limit_bytes must be at least 1")
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self.used = 0  # bytes buffered by all streams now
        self.peak = 0  # the most ever buffered at once
        self.waits = 0  # times a producer found the budget full
        self.stalled = 0  # streams closed because their client read nothing for server.send_timeout_s

    def fits(self, nbytes: int) -> bool:
        """Would ``nbytes`` more stay within the budget? (A hint: the caller adds under its own lock.)"""
        return self.used + nbytes <= self.limit_bytes

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def sub(self, nbytes: int) -> None:
        if nbytes:
            with self._lock:
                self.used = max(0, self.used - nbytes)

    def note_wait(self) -> None:
        with self._lock:
            self.waits += 1

    def note_stalled(self) -> None:
        """A stream was closed because its client read nothing (on the loop)."""
        self.stalled += 1

    def snapshot(self) -> dict[str, int]:
        return {"used": self.used, "peak": self.peak, "limit": self.limit_bytes, "waits": self.waits,
                "stalled": self.stalled}
