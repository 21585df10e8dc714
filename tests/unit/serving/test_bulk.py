"""The bulk queue (app/serving/admission/bulk.py): bounded, round-robin between clients, FIFO within one,
its own timeout, cancel and drain; bulk permits counted apart from the admission load."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.serving import Draining, Overloaded, PermitError
from app.serving.admission.bulk import BulkAccount, BulkQueue
from tests.support.waiting import await_until, run


class Harness:
    """A queue whose room the test sets (``room``: bulk permits out at once)."""

    def __init__(self, *, max_queue: int = 1000, timeout_s: float = 30.0, room: int = 0) -> None:
        self.room = room
        self.rejects: list[str] = []
        self.account = BulkAccount(time.monotonic, on_release=lambda: self.queue.pump())
        self.queue = BulkQueue(self.account, max_queue=max_queue, timeout_s=timeout_s,
                               can_grant=lambda: self.account.in_flight < self.room,
                               reject=self.rejects.append, retry_after_s=lambda depth: 1.0 + depth)

    def open(self, room: int) -> None:
        self.room = room
        self.queue.pump()


async def granted_in_order(h: Harness, tasks: dict[str, asyncio.Task], n: int) -> list[str]:
    """Let ``n`` permits through one at a time (room 1), releasing each: the names in grant order."""
    order: list[str] = []
    h.open(1)
    for _ in range(n):
        await await_until(lambda: any(t.done() and name not in order for name, t in tasks.items()))
        name = next(name for name, t in tasks.items() if t.done() and name not in order)
        order.append(name)
        tasks[name].result().release()  # the room passes to the next turn
    return order


def test_one_client_with_500_queued_does_not_shut_out_another() -> None:
    async def main():
        h = Harness()
        tasks = {f"a{i}": asyncio.create_task(h.queue.wait("key-a")) for i in range(500)}
        await await_until(lambda: h.queue.depth == 500)
        tasks["b0"] = asyncio.create_task(h.queue.wait("key-b"))
        tasks["b1"] = asyncio.create_task(h.queue.wait("key-b"))
        await await_until(lambda: h.queue.depth == 502)
        assert h.queue.clients == 2
        order = await granted_in_order(h, tasks, 6)
        assert order == ["a0", "b0", "a1", "b1", "a2", "a3"]  # round-robin; FIFO within a client
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        # the 7th (a4) was granted as the 6th went back; cancelled then, its permit went back too
        assert h.queue.depth == 0 and h.queue.clients == 0 and h.queue.left == 495 and h.queue.granted == 7
        assert h.account.in_flight == 0

    run(main())


def test_fifo_within_one_client() -> None:
    async def main():
        h = Harness()
        tasks = {}
        for i in range(5):
            tasks[f"r{i}"] = asyncio.create_task(h.queue.wait("one"))
            await await_until(lambda n=i + 1: h.queue.depth == n)
        assert await granted_in_order(h, tasks, 5) == [f"r{i}" for i in range(5)]
        assert h.account.in_flight == 0 and h.queue.granted == 5

    run(main())


def test_granted_at_once_when_there_is_room_and_nobody_waits() -> None:
    async def main():
        h = Harness(room=2)
        t1, t2 = await h.queue.wait("x"), await h.queue.wait("y")
        assert h.account.in_flight == 2 and h.queue.depth == 0
        waiting = asyncio.create_task(h.queue.wait("z"))  # no room left: it waits
        await await_until(lambda: h.queue.depth == 1)
        t1.release()
        t3 = await waiting
        assert h.account.in_flight == 2
        t2.release()
        t3.release()
        with pytest.raises(PermitError):
            t3.release()  # a double release is counted, as for interactive tickets
        assert h.account.misuses == 1 and h.account.in_flight == 0

    run(main())


def test_full_queue_refuses_at_once_with_retry_after() -> None:
    async def main():
        h = Harness(max_queue=3)
        waiting = [asyncio.create_task(h.queue.wait("c")) for _ in range(3)]
        await await_until(lambda: h.queue.depth == 3)
        assert h.queue.full
        with pytest.raises(Overloaded) as info:
            await h.queue.wait("other")  # even another client: the bound is the queue's
        assert info.value.retry_after_s == 4.0
        with pytest.raises(Overloaded):
            h.queue.check()  # the edge's check before the body: the same refusal, nothing taken
        assert h.rejects == ["bulk_queue_full", "bulk_queue_full"] and h.queue.depth == 3
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    run(main())


def test_a_wait_past_the_timeout_is_refused_and_leaves_the_queue() -> None:
    async def main():
        h = Harness(timeout_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(Overloaded) as info:
            await h.queue.wait("slow")
        assert 0.04 < time.monotonic() - t0 < 2.0 and info.value.retry_after_s >= 1
        assert h.rejects == ["bulk_timeout"] and h.queue.depth == 0 and h.queue.clients == 0

    run(main())


def test_a_client_that_leaves_takes_its_place_out_at_once() -> None:
    async def main():
        h = Harness()
        gone = asyncio.create_task(h.queue.wait("gone"))
        stays = asyncio.create_task(h.queue.wait("stays"))
        await await_until(lambda: h.queue.depth == 2)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert h.queue.depth == 1 and h.queue.left == 1 and h.queue.clients == 1
        h.open(1)
        (await stays).release()
        assert h.account.in_flight == 0 and h.rejects == []

    run(main())


def test_a_permit_granted_as_its_client_left_passes_on() -> None:
    async def main():
        h = Harness()
        first = asyncio.create_task(h.queue.wait("a"))
        second = asyncio.create_task(h.queue.wait("b"))
        await await_until(lambda: h.queue.depth == 2)
        h.open(1)  # the permit is set on first's future ...
        first.cancel()  # ... as its client leaves: it goes back, and the room to the next
        await asyncio.gather(first, return_exceptions=True)
        (await second).release()
        assert h.account.in_flight == 0 and h.queue.granted == 2 and h.queue.left == 0

    run(main())


def test_drain_fails_every_waiter_at_once() -> None:
    async def main():
        h = Harness()
        waiting = [asyncio.create_task(h.queue.wait(f"c{i % 3}")) for i in range(7)]
        await await_until(lambda: h.queue.depth == 7)
        assert h.queue.drain(Draining("draining")) == 7
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, Draining) for r in results)
        assert h.queue.depth == 0 and h.queue.clients == 0 and h.account.in_flight == 0

    run(main())


def test_bulk_permits_carry_no_weight_and_no_latency_sample() -> None:
    async def main():
        h = Harness(room=1)
        ticket = await h.queue.wait("x")
        ticket.charge(10_000)  # a long text: nothing to weigh (bulk is not in the admission load)
        assert ticket.permit.sampled is False  # never a latency sample for the limiter
        ticket.started()
        assert h.account.running == 1
        ticket.release()
        assert h.account.running == 0 and h.account.in_flight == 0
        await h.account.wait_idle()

    run(main())


def test_a_bulk_permit_never_pauses_its_job() -> None:
    account = BulkAccount(time.monotonic, on_release=lambda: None)
    ticket = account.issue("key-a", time.monotonic())
    ticket.open_ended()  # takes no lane either
    assert ticket.pause_s(5.0, 30.0) == 0.0 and not ticket.in_lane  # bulk yields in the engine, by its room
    ticket.release()
