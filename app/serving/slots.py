"""Engine slots and the FIFO hand-off of free ones: a ``Lease`` returns its slot itself.

A slot is one preloaded engine and the single thread that may call it. ``Slots``
keeps the idle ones, the most recently used handed out first (with more slots than the
adaptive limit lets run, the same few threads stay warm, their allocator arenas and caches
with them, instead of the work rotating through all of them), and the waiters, oldest
first: a freed slot goes straight to
the oldest live waiter, never to a later arrival (no barging), and a waiter
cancelled just after a slot was handed to it passes the slot on. A ``Lease`` is
one slot held by one holder; ``release()`` gives it back exactly once (a second
release is a bug and raises). An optional ``cap`` (a callable, read at each hand-out)
bounds how many slots are leased at once below the number loaded: adaptive admission
runs only as many requests as its limit and keeps the rest waiting here, FIFO; when the
cap rises, ``refill()`` hands idle slots to the waiters. Bulk leases (``bulk=True``, issue 39) wait
in a queue of their own, served only when no interactive waiter can take the slot, and do not count
against the cap: the pool grants a bulk permit only into the room interactive work leaves
(``app/serving/admission/bulk.py``), so the cap stays the interactive requests' alone. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


class LeaseError(RuntimeError):
    """A lease released twice: a bug in its holder."""


@dataclass(eq=False)
class Slot:
    index: int
    executor: ThreadPoolExecutor
    engine: Any = None  # app.engines.base.Engine
    state: str = "loading"  # loading | idle | busy | failed | closed
    jobs_done: int = 0


class Lease:
    """One slot, held by one holder until ``release()`` hands it to the next waiter (or back to idle)."""

    __slots__ = ("_slots", "_held", "slot", "bulk")

    def __init__(self, slots: Slots, slot: Slot, bulk: bool = False) -> None:
        self._slots = slots
        self.slot = slot
        self.bulk = bulk
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        if not self._held:
            raise LeaseError(f"slot {self.slot.index}'s lease was released twice")
        self._held = False
        self._slots._hand_on(self.slot, self.bulk)


class Slots:
    """The idle slots and the FIFO of requests waiting for one."""

    def __init__(self, cap: Callable[[], int] | None = None) -> None:
        self._idle: deque[Slot] = deque()
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        self._bulk_waiters: deque[asyncio.Future[Slot]] = deque()  # served after the interactive ones
        self._closed = False
        self._cap = cap
        self.busy = 0  # slots leased now
        self.bulk_busy = 0  # ... of them by bulk requests (not counted against the cap)

    def _room(self) -> bool:
        """Another interactive slot may be leased (the cap, if any, is not reached by interactive leases)."""
        return self._cap is None or self.busy - self.bulk_busy < max(1, self._cap())

    def add_idle(self, slot: Slot) -> None:
        """A loaded slot joins the idle ones."""
        slot.state = "idle"
        self._idle.append(slot)

    @property
    def waiting(self) -> int:
        """Live waiters (not yet handed a slot, timed out or cancelled), both classes."""
        return sum(1 for w in (*self._waiters, *self._bulk_waiters) if not w.done())

    def has_waiters(self) -> bool:
        return _live(self._waiters) or _live(self._bulk_waiters)

    def try_acquire(self, bulk: bool = False) -> Lease | None:
        """An idle slot now, if one is free and nobody it would pass waits for it; else None.

        Interactive: no interactive waiter and the cap not reached. Bulk: no bulk waiter (an interactive
        one waits for the cap, not for this slot: the pool grants bulk only into the room below the cap).
        """
        if self._closed or not self._idle:
            return None
        if bulk:
            if _live(self._bulk_waiters):
                return None
        elif _live(self._waiters) or not self._room():
            return None
        self.busy += 1
        self.bulk_busy += bulk
        return self._lease(self._idle.pop(), bulk)

    async def acquire(self, timeout_s: float, bulk: bool = False) -> Lease:
        """Wait FIFO (within the class) for a slot; TimeoutError after ``timeout_s``, or what ``close``
        fails waiters with."""
        lease = self.try_acquire(bulk)
        if lease is not None:
            return lease
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiters = self._bulk_waiters if bulk else self._waiters
        waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                return self._lease(await fut, bulk)
        except TimeoutError:
            if _handed(fut):
                return self._lease(fut.result(), bulk)  # a slot arrived as the timer fired: keep it
            raise
        except BaseException:
            if _handed(fut):
                self._hand_on(fut.result(), bulk)  # handed over as we were cancelled: pass it on
            raise
        finally:
            if not fut.done():
                fut.cancel()
            try:
                waiters.remove(fut)
            except ValueError:
                pass

    def close(self, exc: BaseException) -> None:
        """Fail every waiter with ``exc``; from now on freed slots are not handed on (shutdown)."""
        self._closed = True
        for waiters in (self._waiters, self._bulk_waiters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(exc)
        self._idle.clear()

    def refill(self) -> None:
        """Hand idle slots to the oldest waiters while the cap allows (after the cap rose)."""
        while not self._closed and self._idle:
            slot = self._idle.pop()
            if not self._give(slot):
                self._idle.append(slot)
                return

    def _lease(self, slot: Slot, bulk: bool = False) -> Lease:
        slot.state = "busy"
        return Lease(self, slot, bulk)

    def _hand_on(self, slot: Slot, bulk: bool = False) -> None:
        """A freed slot goes to the oldest live waiter (no barging) if the cap allows, or back to idle."""
        self.busy -= 1
        self.bulk_busy -= bulk
        if self._closed:
            return
        if not self._give(slot):
            self.add_idle(slot)

    def _give(self, slot: Slot) -> bool:
        """Hand an idle slot to the oldest live interactive waiter the cap allows, else to the oldest bulk
        waiter (counted as leased from here: the waiter leases it); False if it goes to nobody."""
        if self._room():
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    self.busy += 1
                    waiter.set_result(slot)
                    return True
        while self._bulk_waiters:
            waiter = self._bulk_waiters.popleft()
            if not waiter.done():
                self.busy += 1
                self.bulk_busy += 1
                waiter.set_result(slot)
                return True
        return False


def _live(waiters: deque[asyncio.Future[Slot]]) -> bool:
    return any(not w.done() for w in waiters)


def _handed(fut: asyncio.Future[Slot]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None
