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
cap rises, ``refill()`` hands idle slots to the waiters. Event-loop thread only.
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

    __slots__ = ("_slots", "_held", "slot")

    def __init__(self, slots: Slots, slot: Slot) -> None:
        self._slots = slots
        self.slot = slot
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        if not self._held:
            raise LeaseError(f"slot {self.slot.index}'s lease was released twice")
        self._held = False
        self._slots._hand_on(self.slot)


class Slots:
    """The idle slots and the FIFO of requests waiting for one."""

    def __init__(self, cap: Callable[[], int] | None = None) -> None:
        self._idle: deque[Slot] = deque()
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        self._closed = False
        self._cap = cap
        self.busy = 0  # slots leased now

    def _room(self) -> bool:
        """Another slot may be leased (the cap, if any, is not reached)."""
        return self._cap is None or self.busy < max(1, self._cap())

    def add_idle(self, slot: Slot) -> None:
        """A loaded slot joins the idle ones."""
        slot.state = "idle"
        self._idle.append(slot)

    @property
    def waiting(self) -> int:
        """Live waiters (not yet handed a slot, timed out or cancelled)."""
        return sum(1 for w in self._waiters if not w.done())

    def has_waiters(self) -> bool:
        return any(not w.done() for w in self._waiters)

    def try_acquire(self) -> Lease | None:
        """An idle slot now, if one is free and nobody waits for it; else None."""
        if self._closed or not self._idle or self.has_waiters() or not self._room():
            return None
        self.busy += 1
        return self._lease(self._idle.pop())

    async def acquire(self, timeout_s: float) -> Lease:
        """Wait FIFO for a slot; TimeoutError after ``timeout_s``, or what ``close`` fails waiters with."""
        lease = self.try_acquire()
        if lease is not None:
            return lease
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                return self._lease(await fut)
        except TimeoutError:
            if _handed(fut):
                return self._lease(fut.result())  # a slot arrived as the timer fired: keep it
            raise
        except BaseException:
            if _handed(fut):
                self._hand_on(fut.result())  # handed over as we were cancelled: pass it on
            raise
        finally:
            if not fut.done():
                fut.cancel()
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass

    def close(self, exc: BaseException) -> None:
        """Fail every waiter with ``exc``; from now on freed slots are not handed on (shutdown)."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
        self._idle.clear()

    def refill(self) -> None:
        """Hand idle slots to the oldest waiters while the cap allows (after the cap rose)."""
        while not self._closed and self._idle and self._room() and self.has_waiters():
            slot = self._idle.pop()
            self.busy += 1  # counted as leased while it is handed over (the waiter leases it)
            self._give(slot)

    def _lease(self, slot: Slot) -> Lease:
        slot.state = "busy"
        return Lease(self, slot)

    def _hand_on(self, slot: Slot) -> None:
        """A freed slot goes to the oldest live waiter (no barging) if the cap allows, or back to idle."""
        self.busy -= 1
        if self._closed:
            return
        if self._room() and self.has_waiters():
            self.busy += 1
            self._give(slot)
        else:
            self.add_idle(slot)

    def _give(self, slot: Slot) -> None:
        """Hand a slot counted as busy to the oldest live waiter, or back to idle (and uncount it)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self.busy -= 1
        self.add_idle(slot)


def _handed(fut: asyncio.Future[Slot]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None
