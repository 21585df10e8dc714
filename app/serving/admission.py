"""Admission: a non-blocking gate that hands out owned permits (or says 503 at once).

Capacity is ``workers + max_queue`` permits. ``Admission.admit()`` returns a
:class:`Ticket` or raises ``Overloaded``; it never waits, so a refusal costs
next to nothing (TEI's ``try_acquire_permit``).

A ticket is an owned handle on one permit (TEI's ``OwnedSemaphorePermit``):
exactly one holder has it at a time. ``take()`` moves the permit to a new
handle for the next holder and leaves the old one empty; ``release()`` gives
the permit back. Every holder follows one rule: move the ticket on with
``take()``, or release it when done. Releasing an empty (moved-from) handle does
nothing, as dropping a moved value does; releasing a handle twice, or moving a
released one, is a bug in its holders: it is counted (``ticket_misuses`` in the
pool's stats), logged and raised as :class:`PermitError`.

The holders of one request's permit, in order: the edge (``RequestContext``,
or a WebSocket session), the speech service, the pool's ``run``, and the
``Job``, which releases it once its slot thread has returned and its consumer is
done. A holder that never hands it on (a request refused while parsing, a
session that ends before it speaks) releases it itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

from app.serving.errors import Overloaded
from app.serving.stats import PoolObserver, ServiceTimeEstimator

log = logging.getLogger(__name__)


class PermitError(RuntimeError):
    """A ticket released twice, or moved after it was moved or released: a bug in its holders."""


class _Permit:
    """One unit of capacity. ``queued`` until its holder gets a slot."""

    __slots__ = ("admission", "admitted_at", "queued")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.admitted_at = time.monotonic()
        self.queued = True


class Ticket:
    """An owned handle on one admission permit: held, then moved on (``take``) or released, once."""

    __slots__ = ("_permit", "_state")

    def __init__(self, permit: _Permit) -> None:
        self._permit = permit
        self._state = "held"  # held -> moved | released

    @property
    def held(self) -> bool:
        """This handle holds its permit (it was neither moved on nor released)."""
        return self._state == "held"

    @property
    def admitted_at(self) -> float:
        return self._permit.admitted_at

    def issued_by(self, admission: Admission) -> bool:
        return self._permit.admission is admission

    def take(self) -> Ticket:
        """Move the permit to a new handle (the next holder's); this one is left empty."""
        self._check("take")
        self._state = "moved"
        return Ticket(self._permit)

    def started(self) -> None:
        """The holder got a slot: the permit leaves the queue (and counts as running)."""
        self._check("start")
        if self._permit.queued:
            self._permit.queued = False
            self._permit.admission._left_queue()

    def release(self) -> None:
        """Give the permit back. A moved-from handle: nothing to do. A released one: PermitError."""
        if self._state == "moved":
            return
        self._check("release")
        self._state = "released"
        self._permit.admission._give_back(self._permit)

    def _check(self, what: str) -> None:
        if self._state != "held":
            self._permit.admission._misuse(what, self._state)


class Admission:
    """The permits of one pool, their counters and the Retry-After estimate. Event-loop thread only."""

    def __init__(self, workers: int, max_queue: int, observer: PoolObserver) -> None:
        self.workers = workers
        self.max_queue = max_queue
        self.capacity = workers + max_queue
        self._observer = observer
        self._service_times = ServiceTimeEstimator()
        self.in_flight = 0  # permits out: queued, running or still being consumed
        self.queued = 0  # permits whose holder waits for a slot
        self.admitted = 0
        self.rejected: dict[str, int] = {}
        self.misuses = 0  # tickets released twice or moved after release (a bug if ever above 0)
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the gate -----------------------------------------------------------------------------
    def admit(self) -> Ticket:
        """A ticket at once, or Overloaded (counted as ``queue_full``)."""
        if self.in_flight >= self.capacity:
            self.reject("queue_full")
            raise Overloaded(f"all {self.workers} workers are busy and {self.max_queue} requests are waiting",
                             self.retry_after_s())
        self.in_flight += 1
        self.queued += 1
        self.admitted += 1
        self._idle.clear()
        self._observer.on_queue_depth(self.queued)
        return Ticket(_Permit(self))

    def reject(self, reason: str) -> None:
        """Count a refusal (one of ``stats.REJECT_REASONS``)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self._observer.on_reject(reason)

    def retry_after_s(self) -> float:
        return self._service_times.retry_after(self.queued, self.workers)

    def observe_service(self, seconds: float) -> None:
        """A job's service time, for the Retry-After estimate."""
        self._service_times.observe(seconds)

    @property
    def average_service_s(self) -> float | None:
        return self._service_times.average_s

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once every permit is back (nothing queued, running or still being consumed)."""
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return self.in_flight == 0
        return True

    # -- called by Ticket ------------------------------------------------------------------------
    def _left_queue(self) -> None:
        self.queued -= 1
        self._observer.on_queue_depth(self.queued)

    def _give_back(self, permit: _Permit) -> None:
        self.in_flight -= 1
        if permit.queued:
            permit.queued = False
            self._left_queue()
        if self.in_flight == 0:
            self._idle.set()

    def _misuse(self, what: str, state: str) -> None:
        self.misuses += 1
        log.error("admission ticket misused: %s on a ticket already %s", what, state, stack_info=True)
        raise PermitError(f"{what}() on an admission ticket that was already {state}")
