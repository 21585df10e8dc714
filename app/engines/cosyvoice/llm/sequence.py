"""One request's speech-token generation, shared by its consumer (a slot thread) and the LLM scheduler.

The consumer reads ``tokens`` and blocks in :meth:`Sequence.wait_for`; it may
:meth:`Sequence.cancel`. The scheduler (``scheduler.py``) pushes tokens, finishes the
sequence and keeps its batch bookkeeping in ``row``, ``started`` and ``saved``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.engines.cosyvoice.llm.bistream import BistreamFeed
from app.engines.cosyvoice.llm.kv import SavedRow
from app.engines.cosyvoice.llm.sampling import Sampler


@dataclass(eq=False)
class Sequence:
    """One request's speech-token generation, shared by its consumer and the scheduler."""

    lm_input: Any  # kept while it runs: an out-of-memory step may send it back to the queue (rebuilt from it)
    min_len: int
    max_len: int
    sampler: Sampler
    cancel_flag: threading.Event | None = None
    ready: Any = None  # CUDA: an event after which lm_input (made on the submitter's stream) is complete
    request_id: str = ""
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    cancelled: bool = False
    logp_trace: list[Any] | None = None  # testing: every step's log-probs, when asked for
    submitted_at: float = field(default_factory=time.perf_counter)
    finished_at: float | None = None  # when it ended (done, cancelled or failed)
    feed: BistreamFeed | None = None  # bistream: text arrives while it decodes (see bistream.py)
    bulk: bool = False  # traffic class bulk: steps only in the room interactive work leaves (bulk.py)
    since: float = field(default_factory=time.monotonic)  # its request's start: older bulk rows step first
    _cond: threading.Condition = field(default_factory=threading.Condition)
    row: int | None = None  # its cache row while in the batch
    started: float = 0.0  # when it (last) joined the batch
    saved: SavedRow | None = None  # bistream: the cache while it waits out of the batch for text
    notify: Any = None  # wakes the scheduler (bistream: a waiting sequence may have to leave)

    # -- consumer side -------------------------------------------------------------------------
    def cancel(self) -> None:
        """Leave the batch at the next step (idempotent, any thread)."""
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()
        if self.notify is not None:
            self.notify()

    def wait_for(self, count: int, timeout: float | None = None) -> int:
        """Block until at least ``count`` tokens exist or the sequence ended; returns how many exist."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self.tokens) < count and not self.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if self.error is not None:
                raise self.error
            return len(self.tokens)

    @property
    def should_stop(self) -> bool:
        return self.cancelled or (self.cancel_flag is not None and self.cancel_flag.is_set())

    # -- scheduler side (only the scheduler thread calls these) ----------------------------------
    def push(self, token: int) -> None:
        with self._cond:
            self.tokens.append(token)
            self._cond.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.finished_at = time.perf_counter()
            self.done = True
            self.error = error
            self._cond.notify_all()
