"""A gate that bounds how many token2wav calls run at once, oldest request first.

With batching, many requests are in flight (so the LLM batch fills), but on a CPU
flow + HiFT are compute-bound: running all of them at once only shares the cores
so that every request finishes late together. The gate lets ``limit`` calls run
(about one per core) and hands a freed place to the waiter whose *request* is
oldest (FIFO across requests), so requests finish one after another instead of
all at the end, and a stream that has started keeps going.

A request's first chunk (its time to first audio) gets a bounded head start: it
ranks as if its request had begun ``first_chunk_lead_s`` earlier. So a newcomer's
first chunk may pass the later chunks of streams that began less than that long
before it, never those of older streams: however many requests arrive, a started
stream waits behind at most the first chunks of requests admitted within
``first_chunk_lead_s`` after it. (A "first chunks always first" order starved
older streams behind a steady flow of newcomers.)

Traffic classes: every waiting interactive call goes before every waiting bulk call
(then the order above within the class), so a bulk hop delays an interactive one only
when it already holds a place (a running call is never interrupted). Bulk calls run in
the places interactive work leaves; how many bulk requests run at all is the pool's
admission (``docs/concurrency.md``).
"""

from __future__ import annotations

import heapq
import itertools
import threading

FIRST_CHUNK_LEAD_S = 1.0


class PriorityGate:
    def __init__(self, limit: int, first_chunk_lead_s: float = FIRST_CHUNK_LEAD_S) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if first_chunk_lead_s < 0:
            raise ValueError("first_chunk_lead_s must be 0 or more")
        self.limit = limit
        self.first_chunk_lead_s = first_chunk_lead_s
        self._cond = threading.Condition()
        self._running = 0
        # (bulk, rank: request start less the lead for a first chunk, ticket): interactive first, then by rank
        self._waiting: list[tuple[bool, float, int]] = []
        self._tickets = itertools.count()
        self.max_running = 0  # observable: never above limit

    def rank(self, chunk_index: int, started: float) -> float:
        """Lower goes first: the request's start, ``first_chunk_lead_s`` earlier for its first chunk."""
        return started - self.first_chunk_lead_s if chunk_index == 0 else started

    def acquire(self, chunk_index: int, started: float, cancel: threading.Event | None = None,
                bulk: bool = False) -> bool:
        """Wait for one of ``limit`` places; False (and no place taken) if ``cancel`` is set first.

        ``started`` is when the request began (``time.monotonic()``), the same for all its chunks;
        ``chunk_index`` 0 is its first chunk; ``bulk``: its class (see the module doc for the order).
        """
        entry = (bool(bulk), self.rank(chunk_index, started), next(self._tickets))
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
