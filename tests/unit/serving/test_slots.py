"""Slots: FIFO hand-off of freed slots (no barging), leases that return themselves once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.serving.errors import Draining
from app.serving.slots import Lease, LeaseError, Slot, Slots
from tests.support.waiting import await_until, run


def make_slots(n: int = 1) -> tuple[Slots, list[Slot]]:
    slots = Slots()
    made = [Slot(i, ThreadPoolExecutor(1)) for i in range(n)]
    for slot in made:
        slots.add_idle(slot)
    return slots, made


def shutdown(made: list[Slot]) -> None:
    for slot in made:
        slot.executor.shutdown(wait=True)


def test_fifo_order_and_cancelled_waiters_give_their_place_back() -> None:
    async def main():
        slots, made = make_slots(1)
        try:
            holder = await slots.acquire(5)
            assert made[0].state == "busy"
            order: list[int] = []
            queued: list[asyncio.Task] = []

            async def waiter(i: int) -> None:
                lease = await slots.acquire(5)
                order.append(i)
                await asyncio.sleep(0)
                lease.release()

            for i in range(6):
                queued.append(asyncio.create_task(waiter(i)))
                await await_until(lambda n=i + 1: slots.waiting == n)  # each one queues before the next
            queued[2].cancel()
            await await_until(lambda: slots.waiting == 5)
            holder.release()
            results = await asyncio.gather(*queued, return_exceptions=True)
            assert isinstance(results[2], asyncio.CancelledError)
            assert order == [0, 1, 3, 4, 5]
            assert made[0].state == "idle" and not slots.has_waiters()
        finally:
            shutdown(made)

    run(main())


def test_a_freed_slot_goes_to_the_oldest_waiter_not_to_a_later_arrival() -> None:
    async def main():
        slots, made = make_slots(1)
        try:
            order: list[str] = []

            async def take(name: str) -> None:
                lease = await slots.acquire(5)
                order.append(name)
                lease.release()

            holder = await slots.acquire(5)
            first = asyncio.create_task(take("first"))
            await await_until(slots.has_waiters)
            holder.release()  # handed straight to "first", which has not resumed yet
            assert slots.try_acquire() is None  # nothing idle for a later arrival to barge in on
            late = asyncio.create_task(take("late"))
            await asyncio.gather(first, late)
            assert order == ["first", "late"]
        finally:
            shutdown(made)

    run(main())


def test_a_waiter_cancelled_just_after_a_slot_was_handed_to_it_passes_the_slot_on() -> None:
    async def main():
        slots, made = make_slots(1)
        try:
            holder = await slots.acquire(5)
            w1 = asyncio.create_task(slots.acquire(5))
            await await_until(slots.has_waiters)
            w2 = asyncio.create_task(slots.acquire(5))
            await await_until(lambda: slots.waiting == 2)
            holder.release()  # w1's future now holds the slot ...
            w1.cancel()  # ... and w1 is cancelled before it could resume
            with pytest.raises(asyncio.CancelledError):
                await w1
            lease2 = await w2
            assert lease2.slot is made[0] and made[0].state == "busy"
            lease2.release()
            assert made[0].state == "idle" and slots.try_acquire() is not None
        finally:
            shutdown(made)

    run(main())


def test_a_lease_returns_itself_once() -> None:
    async def main():
        slots, made = make_slots(1)
        try:
            lease = await slots.acquire(5)
            assert isinstance(lease, Lease) and lease.held and slots.try_acquire() is None
            lease.release()
            assert not lease.held and made[0].state == "idle"
            with pytest.raises(LeaseError):
                lease.release()  # a double release is a bug, not a no-op
            again = slots.try_acquire()
            assert again is not None and slots.try_acquire() is None  # the slot was not added twice
        finally:
            shutdown(made)

    run(main())


def test_the_most_recently_used_idle_slot_is_handed_out_first() -> None:
    async def main():
        slots, made = make_slots(4)
        try:
            first = slots.try_acquire()
            assert first is not None and first.slot is made[3]  # the last one added
            first.release()
            again = slots.try_acquire()
            assert again is not None and again.slot is made[3]  # the same, warm one: not made[0]
            other = slots.try_acquire()
            assert other is not None and other.slot is made[2]
            other.release()
            again.release()
            assert slots.try_acquire().slot is made[3]  # the last released
        finally:
            shutdown(made)

    run(main())


def test_timeout_and_close() -> None:
    async def main():
        slots, made = make_slots(1)
        try:
            holder = await slots.acquire(5)
            with pytest.raises(TimeoutError):
                await slots.acquire(0.02)
            assert not slots.has_waiters()  # a timed-out waiter leaves the queue
            waiter = asyncio.create_task(slots.acquire(5))
            await await_until(slots.has_waiters)
            slots.close(Draining("the server is shutting down"))
            with pytest.raises(Draining):
                await waiter
            holder.release()  # after close a freed slot is not handed on or made idle
            assert slots.try_acquire() is None
        finally:
            shutdown(made)

    run(main())


def test_a_cap_below_the_loaded_slots_keeps_waiters_queued_until_it_rises() -> None:
    async def main():
        cap = [1]
        slots = Slots(cap=lambda: cap[0])
        made = [Slot(i, ThreadPoolExecutor(1)) for i in range(3)]
        for slot in made:
            slots.add_idle(slot)
        try:
            first = slots.try_acquire()
            assert first is not None and slots.busy == 1
            assert slots.try_acquire() is None  # two idle slots, but the cap is 1
            second = asyncio.create_task(slots.acquire(5))
            third = asyncio.create_task(slots.acquire(5))
            await await_until(lambda: slots.waiting == 2)
            cap[0] = 2
            slots.refill()  # the cap rose: the oldest waiter gets an idle slot, the next still waits
            lease2 = await second
            assert slots.busy == 2 and slots.waiting == 1 and not third.done()
            cap[0] = 1
            first.release()  # busy 1 after it, the cap is 1: the freed slot goes idle, not to the waiter
            await asyncio.sleep(0)
            assert slots.busy == 1 and slots.waiting == 1 and not third.done()
            lease2.release()  # busy 0 < 1: the waiter gets it
            lease3 = await third
            assert slots.busy == 1
            lease3.release()
            assert slots.busy == 0 and slots.waiting == 0
        finally:
            shutdown(made)

    run(main())


def test_a_waiter_cancelled_as_it_was_handed_a_capped_slot_passes_it_on() -> None:
    async def main():
        slots = Slots(cap=lambda: 1)
        made = [Slot(i, ThreadPoolExecutor(1)) for i in range(2)]
        for slot in made:
            slots.add_idle(slot)
        try:
            holder = slots.try_acquire()
            a = asyncio.create_task(slots.acquire(5))
            b = asyncio.create_task(slots.acquire(5))
            await await_until(lambda: slots.waiting == 2)
            holder.release()  # handed to a ...
            a.cancel()  # ... which is cancelled before it runs: it passes the slot to b
            lease = await b
            assert isinstance((await asyncio.gather(a, return_exceptions=True))[0], asyncio.CancelledError)
            assert slots.busy == 1
            lease.release()
            assert slots.busy == 0
        finally:
            shutdown(made)

    run(main())


def test_bulk_leases_wait_behind_interactive_waiters_and_do_not_count_against_the_cap() -> None:
    async def main():
        slots = Slots(cap=lambda: 1)
        made = [Slot(i, ThreadPoolExecutor(1)) for i in range(2)]
        for slot in made:
            slots.add_idle(slot)
        try:
            bulk = slots.try_acquire(bulk=True)
            assert bulk is not None and bulk.bulk and slots.bulk_busy == 1
            live = slots.try_acquire()  # the cap (1) counts interactive leases only
            assert live is not None and slots.busy == 2
            bulk_waiter = asyncio.create_task(slots.acquire(5, bulk=True))
            await await_until(lambda: slots.waiting == 1)
            live_waiter = asyncio.create_task(slots.acquire(5))  # came later, served first
            await await_until(lambda: slots.waiting == 2)
            live.release()
            live2 = await live_waiter
            assert not bulk_waiter.done()
            bulk.release()  # the interactive cap is reached: a freed slot still goes to the bulk waiter
            bulk2 = await bulk_waiter
            assert slots.busy == 2 and slots.bulk_busy == 1
            bulk2.release()
            live2.release()
            assert slots.busy == 0 and slots.bulk_busy == 0 and slots.waiting == 0
        finally:
            shutdown(made)

    run(main())
