"""The pool's bulk class (issue 39): granted only into the room interactive work leaves, invisible to
interactive admission and to the limiter, its own slot threads on a shared engine, drained at once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.engines.base import SynthesisRequest
from app.engines.fake import FakeBehaviour, FakeEngine
from app.metrics import Metrics
from app.serving import Draining, EnginePool, Overloaded
from app.serving.admission.classes import Priority
from tests.support import configs
from tests.support.waiting import await_until, run


def req(rid: str) -> SynthesisRequest:
    return SynthesisRequest(text="hello", mode="sft", speaker="fake_female", request_id=rid)


class RoomEngine(FakeEngine):
    """A fake engine that can make bulk work yield: it keeps the room callable the pool hands it."""

    room = None

    def set_bulk_room(self, fn) -> None:
        RoomEngine.room = fn


def make_pool(b: FakeBehaviour, engine=FakeEngine, **cfg) -> EnginePool:
    cfg.setdefault("admission", "fixed")
    return EnginePool(lambda i: engine(b, name=f"fake-{i}"), configs.pool(**cfg))


async def consume(pool: EnginePool, ticket, rid: str) -> int:
    async with await pool.run(ticket, req(rid)) as job:
        return len([chunk async for chunk in job])


def classes(pool: EnginePool) -> dict:
    return pool.stats()["classes"]


def test_bulk_is_granted_only_into_the_room_interactive_work_leaves() -> None:
    async def main():
        pool = make_pool(FakeBehaviour(), workers=3, max_queue=2)  # capacity 5, room counts the 3 workers
        await pool.start()
        try:
            live = [pool.gate.admit_now(), pool.gate.admit_now()]
            assert pool.gate.bulk_room() == 1
            first = await pool.gate.admit(Priority.BULK, "key-1")
            second = asyncio.create_task(pool.gate.admit("bulk", "key-1"))
            await await_until(lambda: classes(pool)["bulk"]["queued"] == 1)
            assert classes(pool)["bulk"]["in_flight"] == 1
            live.pop().release()  # interactive load falls: the room grows, the queue is re-checked
            third = await second
            assert classes(pool)["bulk"] == {**classes(pool)["bulk"], "queued": 0, "in_flight": 2, "granted": 2}
            for t in (first, third, *live):
                t.release()
            assert pool.stats()["in_flight"] == 0 and classes(pool)["bulk"]["in_flight"] == 0
        finally:
            await pool.close()

    run(main())


def test_interactive_admission_is_exactly_as_without_bulk_and_gets_its_own_threads() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        pool = make_pool(b, workers=2, max_queue=0, share_engine=True)
        await pool.start()
        try:
            bulk = [asyncio.create_task(consume(pool, await pool.gate.admit("bulk", f"c{i}"), f"bulk{i}"))
                    for i in range(2)]
            await await_until(lambda: len(b.started) == 2)
            assert classes(pool)["bulk"]["running"] == 2 and pool.gate.bulk_room() == 2
            queued = asyncio.create_task(pool.gate.admit("bulk", "c9"))
            await await_until(lambda: classes(pool)["bulk"]["queued"] == 1)
            # interactive: admitted up to its own capacity, and started at once beside the running bulk
            live = [asyncio.create_task(consume(pool, pool.gate.admit_now(), f"live{i}")) for i in range(2)]
            await await_until(lambda: len(b.started) == 4)
            assert {"live0", "live1"} <= set(b.started)
            with pytest.raises(Overloaded):
                pool.gate.admit_now()  # refused at its own ceiling, as it would be without bulk
            assert pool.stats()["rejected"] == {"queue_full": 1} and pool.gate.bulk_room() == 0
            threads = {t.name for t in threading.enumerate()}
            assert any(n.startswith("cosyserve-bulk-") for n in threads)
            gate.set()
            assert await asyncio.gather(*live, *bulk) == [3] * 4
            await consume(pool, await queued, "bulk9")  # room came back: the queued one ran
            c = classes(pool)
            assert c["bulk"]["completed"] == 3 and c["interactive"]["completed"] == 2
            assert c["bulk"]["running"] == 0 and c["bulk"]["in_flight"] == 0
            assert pool.stats()["in_flight"] == 0 and pool.stats()["ticket_misuses"] == 0
        finally:
            gate.set()
            await pool.close()

    run(main())


def test_bulk_shares_the_slots_of_an_engine_per_slot_served_after_interactive_waiters() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        pool = make_pool(b, workers=2, max_queue=2)  # an engine per slot: no threads of its own for bulk
        await pool.start()
        try:
            one = asyncio.create_task(consume(pool, await pool.gate.admit("bulk", "c"), "bulk0"))
            await await_until(lambda: len(b.started) == 1)
            live = [asyncio.create_task(consume(pool, pool.gate.admit_now(), f"live{i}")) for i in range(2)]
            await await_until(lambda: len(b.started) == 2 and pool.stats()["queued"] == 1)
            assert pool.gate.bulk_room() == 0  # no bulk grant while interactive work needs the places
            gate.set()
            assert await asyncio.gather(one, *live) == [3] * 3
        finally:
            gate.set()
            await pool.close()

    run(main())


def test_bulk_samples_never_reach_the_limiter_nor_its_load() -> None:
    async def main():
        pool = make_pool(FakeBehaviour(chunk_delay_s=0.01), workers=2, admission="adaptive")
        await pool.start()
        try:
            for i in range(4):
                await consume(pool, await pool.gate.admit("bulk", "c"), f"b{i}")
            adm = pool.gate.admission
            assert adm.limiter.average_s is None and adm.limiter.steps == 0  # no latency sample
            assert adm.admitted == 0 and adm.load == 0.0 and adm.average_service_s is None
            assert classes(pool)["bulk"]["completed"] == 4
            await consume(pool, pool.gate.admit_now(), "live")
            assert adm.limiter.average_s is not None  # an interactive one is a sample, as before
        finally:
            await pool.close()

    run(main())


def test_the_engine_gets_the_room_callable_and_it_follows_interactive_load() -> None:
    async def main():
        RoomEngine.room = None
        pool = make_pool(FakeBehaviour(), RoomEngine, workers=4, max_queue=0)
        await pool.start()
        try:
            room = RoomEngine.room
            assert room is not None and room() == 4
            tickets = [pool.gate.admit_now() for _ in range(3)]
            assert room() == 1
            tickets[0].charge(1)  # a size known: the weighted load, and at least one place per request
            for t in tickets:
                t.release()
            assert room() == 4
        finally:
            await pool.close()

    run(main())


def test_drain_refuses_queued_bulk_at_once_and_lets_running_bulk_finish() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        pool = make_pool(b, workers=1, max_queue=0, share_engine=True)
        await pool.start()
        try:
            running = asyncio.create_task(consume(pool, await pool.gate.admit("bulk", "c"), "running"))
            await await_until(lambda: len(b.started) == 1)
            queued = [asyncio.create_task(pool.gate.admit("bulk", f"c{i}")) for i in range(3)]
            await await_until(lambda: classes(pool)["bulk"]["queued"] == 3)
            await pool.begin_drain()
            results = await asyncio.gather(*queued, return_exceptions=True)
            assert all(isinstance(r, Draining) for r in results)
            assert pool.stats()["rejected"] == {"draining": 3}
            with pytest.raises(Draining):
                await pool.gate.admit("bulk", "late")
            assert not await pool.wait_idle(0.05)  # the running one still runs
            gate.set()
            assert await running == 3
            assert await pool.wait_idle(2.0)
        finally:
            gate.set()
            await pool.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("cosyserve-bulk-")]  # joined

    run(main())


def test_gate_check_before_the_body() -> None:
    async def main():
        pool = make_pool(FakeBehaviour(), workers=1, max_queue=0, bulk_max_queue=1)
        await pool.start()
        try:
            live = pool.gate.admit_now()
            with pytest.raises(Overloaded):
                pool.gate.check(Priority.INTERACTIVE)
            pool.gate.check(None)  # the body may still name bulk, whose queue has a place
            pool.gate.check("bulk")
            waiting = asyncio.create_task(pool.gate.admit("bulk", "c"))
            await await_until(lambda: classes(pool)["bulk"]["queued"] == 1)
            with pytest.raises(Overloaded):
                pool.gate.check(Priority.BULK)  # its queue is full
            with pytest.raises(Overloaded):
                pool.gate.check(None)  # no class would admit it
            assert pool.stats()["rejected"] == {"queue_full": 2, "bulk_queue_full": 1}
            live.release()
            (await waiting).release()
        finally:
            await pool.close()

    run(main())


def test_per_class_metrics() -> None:
    async def main():
        pools: list[EnginePool] = []
        metrics = Metrics(stats=lambda: pools[0].stats(), process=False)
        b = FakeBehaviour()
        pool = EnginePool(lambda i: FakeEngine(b), configs.pool(workers=2, max_queue=0, admission="fixed"),
                          metrics.pool_observer())
        pools.append(pool)
        await pool.start()
        try:
            await consume(pool, await pool.gate.admit("bulk", "c"), "b")
            await consume(pool, pool.gate.admit_now(), "i")
            text = metrics.render().decode()
        finally:
            await pool.close()
        for line in ('tts_class_completed_total{priority="bulk"} 1.0',
                     'tts_class_completed_total{priority="interactive"} 1.0',
                     'tts_class_queue_depth{priority="bulk"} 0.0', 'tts_class_running{priority="bulk"} 0.0',
                     'tts_class_wait_seconds_count{priority="bulk"} 1.0',
                     'tts_class_wait_seconds_count{priority="interactive"} 1.0',
                     'tts_rejected_total{reason="bulk_queue_full"} 0.0', "tts_bulk_room 2.0"):
            assert line in text, line

    run(main())


def test_a_bulk_jobs_deadline_adds_its_class_timeout() -> None:
    """A started bulk request the engine holds back while interactive work fills the room is waiting:
    its deadline (504, and the stuck-slot check) is request_timeout_s + bulk_queue_timeout_s."""

    async def main():
        pool = make_pool(FakeBehaviour(chunk_delay_s=0.2), workers=2, request_timeout_s=5,
                         bulk_queue_timeout_s=50, stuck_grace_s=1)
        await pool.start()
        try:
            live = await pool.run(pool.gate.admit_now(), req("live"))
            bulk = await pool.run(await pool.gate.admit(Priority.BULK, "key-1"), req("bulk"))
            assert (live.deadline_s, bulk.deadline_s) == (5, 55)
            for job in (live, bulk):
                async with job:
                    [c async for c in job]
        finally:
            await pool.close()

    run(main())
