"""The pool's small value types: its configuration, admission tickets and slot leases.

``Ticket`` and ``Lease`` call back into their pool (``_release_permit``,
``_return_slot``); they carry no logic of their own beyond releasing exactly once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.serving.pool import EnginePool


@dataclass
class PoolConfig:
    workers: int = 2
    max_queue: int = 8  # waiting requests beyond the running ones
    queue_timeout_s: float = 30.0
    request_timeout_s: float = 300.0  # 0 = no deadline
    share_engine: bool = False  # one engine instance shared by all slots
    stream_buffer_chunks: int = 4  # bounded queue between slot thread and consumer
    stream_buffer_bytes: int = 1 << 20  # ... and the encoded bytes it may hold
    health_timeout_s: float = 5.0  # check_health() gives up (and fails) after this long
    stuck_grace_s: float = 30.0  # a job past request_timeout_s + this, still in the engine, is stuck
    close_timeout_s: float = 30.0  # close(): how long to wait for slot threads to return

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.max_queue < 0:
            raise ValueError("max_queue must be 0 or more")
        if self.queue_timeout_s <= 0:
            raise ValueError("queue_timeout_s must be positive")
        if self.request_timeout_s < 0:
            raise ValueError("request_timeout_s must be 0 (no deadline) or positive")
        if self.stream_buffer_chunks < 1:
            raise ValueError("stream_buffer_chunks must be at least 1")
        if self.stream_buffer_bytes < 1:
            raise ValueError("stream_buffer_bytes must be at least 1")
        if self.health_timeout_s <= 0 or self.stuck_grace_s < 0:
            raise ValueError("health_timeout_s must be positive and stuck_grace_s 0 or more")


@dataclass(eq=False)
class Slot:
    index: int
    executor: ThreadPoolExecutor
    engine: Any = None  # app.engines.base.Engine
    state: str = "loading"  # loading | idle | busy | failed | closed
    jobs_done: int = 0


class Ticket:
    """An admission permit; released exactly once (idempotent ``release``)."""

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool
        self.state = "admitted"  # admitted -> leased -> released
        self.admitted_at = time.monotonic()

    @property
    def released(self) -> bool:
        return self.state == "released"

    def release(self) -> None:
        if self.state != "released":
            was_queued = self.state == "admitted"
            self.state = "released"
            self._pool._release_permit(was_queued)


class Lease:
    """A slot held for one ticket. ``release`` is for leases never passed to ``run``."""

    def __init__(self, pool: EnginePool, slot: Slot, ticket: Ticket, queue_wait_s: float) -> None:
        self._pool = pool
        self._slot = slot
        self.ticket = ticket
        self.queue_wait_s = queue_wait_s
        self._slot_held = True
        self._owned = False  # handed to a Job, which releases it

    @property
    def slot_index(self) -> int:
        return self._slot.index

    def _release_slot(self) -> None:
        if self._slot_held:
            self._slot_held = False
            self._pool._return_slot(self._slot, leased=True)

    def release(self) -> None:
        if not self._owned:
            self._release_slot()
            self.ticket.release()
