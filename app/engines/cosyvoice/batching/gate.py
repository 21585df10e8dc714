"""A gate that bounds how many token2wav calls run at once, most urgent first.

With batching, many requests are in flight (so the LLM batch fills), but on a CPU
flow + HiFT are compute-bound: running all of them at once only shares the cores
so that every request finishes late together. The gate lets ``limit`` calls run
(about one per core) and hands a freed place to the most urgent waiter: a
request's *first* chunk before later chunks (time to first audio), and among
equals the one that asked first (FIFO), so requests finish one after another
instead of all at the end.
"""

from __future__ import annotations

import heapq
import itertools
import threading


class PriorityGate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._cond = threading.Condition()
        self._running = 0
        self._waiting: list[tuple[int, float, int]] = []  # (chunk index, request start, ticket)
        self._tickets = itertools.count()
        self.max_running = 0  # observable: never above limit

    def acquire(self, chunk_index: int, started: float, cancel: threading.Event | None = None) -> bool:
        """Wait for one of ``limit`` places; False (and no place taken) if ``cancel`` is set first.

        ``(chunk_index, started)`` orders the waiters: lower first.
        """
        entry = (chunk_index, started, next(self._tickets))
        with self._cond:
            heapq.heappush(self._waiting, entry)
            while self._running >= self.limit or self._waiting[0] is not entry:
                if cancel is not None and cancel.is_set():
                    self._waiting.remove(entry)
                    heapq.heapify(self._waiting)
                    self._cond.notify_all()
                    return False
                self._cond.wait(0.05 if cancel is not None else None)
            heapq.heappop(self._waiting)
            self._running += 1
            self.max_running = max(self.max_running, self._running)
            self._cond.notify_all()  # the next waiter may fit as well
            return True

    def release(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)
