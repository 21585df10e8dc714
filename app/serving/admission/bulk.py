"""The bulk class (issue 39): a bounded queue, fair between clients, granted permits only into spare room.

A bulk request does not get an answer at once as an interactive one does (a permit or a 503): it waits
here, in a queue of ``max_queue`` places, for at most ``timeout_s``, until the pool says there is room
for it (``can_grant``: the places interactive work leaves, ``EnginePool.bulk_room``). The queue is fair
between clients: one deque per client (FIFO within it), and the clients are served round-robin, so one
client with 500 queued requests takes every other turn beside a second client with one.

Refusals, each counted under its reason: the queue full (``bulk_queue_full``), the wait past its
timeout (``bulk_timeout``), both 503 with ``Retry-After``; the pool draining (every waiter at once). A
waiter whose client leaves (its task cancelled) leaves the queue at once and is counted (``left``).

A bulk permit is an ordinary :class:`~app.serving.admission.Ticket` whose permit is counted here, by
``BulkAccount``, and never in :class:`~app.serving.admission.Admission`: not in its load, its queue,
its running count nor its latency samples, so bulk work moves neither the adaptive limit nor the
waiting room. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.serving.admission.permits import Permit, PermitError, Ticket
from app.serving.errors import Overloaded

log = logging.getLogger(__name__)


class BulkPermit(Permit):
    """A bulk request's permit: who sent it and when it joined the queue (its wait counts from there)."""

    __slots__ = ("client", "enqueued_at")


class BulkAccount:
    """The bulk permits out: the ``admission`` their tickets call back (start, charge, release)."""

    def __init__(self, clock: Callable[[], float], on_release: Callable[[], None]) -> None:
        self.clock = clock
        self.in_flight = 0  # bulk permits out: granted, running or still being consumed
        self.running = 0  # ... of them holding a slot (or still being consumed)
        self.starts = 0  # bulk permits that ever got a slot (admission: an interactive request ran alone?)
        self.misuses = 0
        self._on_release = on_release
        self._idle = asyncio.Event()
        self._idle.set()

    def issue(self, client: str, enqueued_at: float) -> Ticket:
        permit = BulkPermit(self)
        permit.sampled = False  # never a latency sample for the limiter
        permit.client = client
        permit.enqueued_at = enqueued_at
        self.in_flight += 1
        self._idle.clear()
        return Ticket(permit)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    # -- called by Ticket ------------------------------------------------------------------------
    def permit_charged(self, permit: Permit, units: float) -> None:
        pass  # bulk carries no weight in the admission load

    def permit_open_ended(self, permit: Permit) -> None:
        pass  # nor takes a lane: it runs only in the room interactive work leaves

    def lane_pause_s(self, permit: Permit, worked_s: float, ahead_s: float) -> float:
        return 0.0  # bulk yields inside the engine (its room), not by pausing

    def permit_started(self, permit: Permit) -> None:
        self.running += 1
        self.starts += 1

    def permit_released(self, permit: Permit) -> None:
        self.in_flight -= 1
        if not permit.queued:
            self.running -= 1
        permit.queued = False
        if self.in_flight == 0:
            self._idle.set()
        self._on_release()

    def permit_misused(self, what: str, state: str) -> None:
        self.misuses += 1
        log.error("bulk ticket misused: %s on a ticket already %s", what, state, stack_info=True)
        raise PermitError(f"{what}() on a bulk ticket that was already {state}")


@dataclass(eq=False)
class _Waiter:
    client: str
    enqueued_at: float
    fut: asyncio.Future[Ticket] = field(repr=False)


class BulkQueue:
    """Bulk requests waiting for room: bounded, round-robin between clients, FIFO within one."""

    def __init__(self, account: BulkAccount, *, max_queue: int, timeout_s: float,
                 can_grant: Callable[[], bool], reject: Callable[[str], None],
                 retry_after_s: Callable[[int], float]) -> None:
        self.account = account
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._can_grant = can_grant  # one more bulk permit fits the room now
        self._reject = reject  # count a refusal under its reason
        self._retry_after_s = retry_after_s  # (queue depth) -> seconds
        self._clients: OrderedDict[str, deque[_Waiter]] = OrderedDict()  # the next client's turn first
        self.depth = 0  # live waiters
        self.granted = 0
        self.left = 0  # waiters whose client went away
        self._pumping = False

    @property
    def full(self) -> bool:
        return self.depth >= self.max_queue

    @property
    def clients(self) -> int:
        return len(self._clients)

    def check(self) -> None:
        """Raise Overloaded (counted as ``bulk_queue_full``) if ``wait`` would refuse at once."""
        if self.full:
            self._reject("bulk_queue_full")
            raise Overloaded(f"the bulk queue is full ({self.max_queue} requests wait)",
                             self._retry_after_s(self.depth))

    async def wait(self, client: str) -> Ticket:
        """A bulk permit once there is room and it is this client's turn; Overloaded if full or too late."""
        self.check()
        now = self.account.clock()
        if self.depth == 0 and self._can_grant():
            self.granted += 1
            return self.account.issue(client, now)
        waiter = _Waiter(client, now, asyncio.get_running_loop().create_future())
        self._clients.setdefault(client, deque()).append(waiter)
        self.depth += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                return await waiter.fut
        except TimeoutError:
            if _handed(waiter.fut):
                return waiter.fut.result()  # granted as the timer fired: keep it
            self._reject("bulk_timeout")
            raise Overloaded(f"no room for this bulk request within {self.timeout_s:g} s",
                             self._retry_after_s(self.depth)) from None
        except asyncio.CancelledError:
            if _handed(waiter.fut):
                waiter.fut.result().release()  # granted as its client left: the room goes to the next
            else:
                self.left += 1
            raise
        finally:
            if not waiter.fut.done():
                waiter.fut.cancel()
            self._remove(waiter)

    def pump(self) -> None:
        """Grant permits to the waiters, one client's turn at a time, while the room allows."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while self._clients and self._can_grant():
                client, waiters = next(iter(self._clients.items()))
                waiter = waiters.popleft()
                if waiters:
                    self._clients.move_to_end(client)  # its next request waits for everyone else's turn
                else:
                    del self._clients[client]
                self.depth -= 1
                if not waiter.fut.done():
                    self.granted += 1
                    waiter.fut.set_result(self.account.issue(waiter.client, waiter.enqueued_at))
        finally:
            self._pumping = False

    def drain(self, exc: BaseException) -> int:
        """Fail every waiter with ``exc`` at once (draining, closing); how many there were."""
        failed = 0
        for waiters in self._clients.values():
            for waiter in waiters:
                if not waiter.fut.done():
                    waiter.fut.set_exception(exc)
                    failed += 1
        self._clients.clear()
        self.depth = 0
        return failed

    def _remove(self, waiter: _Waiter) -> None:
        """Take a waiter that gave up (timeout, cancel) out of its client's deque, if it is still there."""
        waiters = self._clients.get(waiter.client)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return
        self.depth -= 1
        if not waiters:
            del self._clients[waiter.client]


def _handed(fut: asyncio.Future[Ticket]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None
