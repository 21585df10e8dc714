"""EnginePool: loading, admission, FIFO queueing, drain, close, health."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.engines.base import EngineFailure, SynthesisRequest
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import (
    Draining,
    EnginePool,
    NotReady,
    Overloaded,
    PermitError,
    QueueTimeout,
)
from app.serving.admission.limit.service_time import ServiceTimeEstimator
from tests.support import configs
from tests.support.pool import assert_released, synthesize
from tests.support.waiting import await_until, run


def req(rid: str = "r", **kw) -> SynthesisRequest:
    kw.setdefault("speaker", "fake_female")
    return SynthesisRequest(text="hello", mode="sft", request_id=rid, **kw)


def make_pool(b: FakeBehaviour | None = None, **cfg) -> tuple[EnginePool, list[FakeEngine], FakeBehaviour]:
    b = b or FakeBehaviour()
    engines: list[FakeEngine] = []

    def factory(index: int) -> FakeEngine:
        engine = FakeEngine(b, name=f"fake-{index}")
        engines.append(engine)
        return engine

    return EnginePool(factory, configs.pool(**cfg)), engines, b



def slot_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cosyserve-slot-")]


async def consume(pool: EnginePool, rid: str) -> int:
    async with await synthesize(pool, req(rid)) as job:
        return len([chunk async for chunk in job])


class RecordingObserver:
    def __init__(self) -> None:
        self.rejects: list[str] = []
        self.waits: list[float] = []
        self.starts = 0
        self.ends: list[str] = []
        self.depths: list[int] = []

    def on_reject(self, reason: str) -> None:
        self.rejects.append(reason)

    def on_queue_wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def on_job_start(self) -> None:
        self.starts += 1

    def on_job_end(self, outcome: str, seconds: float) -> None:
        self.ends.append(outcome)

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)


def test_start_loads_and_warms_every_slot_in_its_own_thread() -> None:
    async def main():
        pool, engines, _ = make_pool(FakeBehaviour(load_delay_s=0.2), workers=3)
        assert not pool.ready
        with pytest.raises(NotReady):
            pool.gate.admit_now()
        with pytest.raises(NotReady):
            pool.info  # noqa: B018 - known only once loaded
        t0 = time.monotonic()
        await pool.start()
        assert time.monotonic() - t0 < 0.55  # the three loads ran in parallel (serially: 0.6 s)
        try:
            assert pool.ready and not pool.draining
            assert sorted(e.threads.pop() for e in engines) == [f"cosyserve-slot-{i}" for i in range(3)]
            assert all(e.loaded and e.warmed for e in engines)
            assert pool.info.family == "fake"
            assert pool.presets == ("fake_female", "fake_male")
            stats = pool.stats()
            assert [s["state"] for s in stats["slots"]] == ["idle"] * 3
            assert stats["workers"] == 3 and stats["running"] == 0 and stats["queued"] == 0
            assert await consume(pool, "a") == 3
        finally:
            await pool.close()
        assert slot_threads() == []

    run(main())


def test_exact_admission_limits_and_fast_rejection() -> None:
    async def main():
        gate = threading.Event()
        pool, _, b = make_pool(FakeBehaviour(gate=gate), workers=2, max_queue=3)
        await pool.start()
        try:
            clients = [asyncio.create_task(consume(pool, f"c{i}")) for i in range(5)]
            await await_until(lambda: len(b.started) == 2 and pool.stats()["queued"] == 3)
            t0 = time.monotonic()
            with pytest.raises(Overloaded) as info:
                pool.gate.admit_now()
            assert time.monotonic() - t0 < 0.05
            assert info.value.retry_after_s >= 1 and info.value.retry_after_s == int(info.value.retry_after_s)
            with pytest.raises(Overloaded):
                await synthesize(pool, req("late"))
            assert len(b.started) == 2  # the engine was never touched by the rejected ones
            stats = pool.stats()
            assert stats["running"] == 2 and stats["queued"] == 3 and stats["in_flight"] == 5
            assert stats["rejected"] == {"queue_full": 2}
            gate.set()
            assert await asyncio.gather(*clients) == [3] * 5
            stats = pool.stats()
            assert stats["admitted"] == 5 and stats["in_flight"] == 0 and stats["running"] == 0
            pool.gate.admit_now().release()  # capacity is back
        finally:
            gate.set()
            await pool.close()

    run(main())


def test_retry_after_estimate() -> None:
    est = ServiceTimeEstimator(alpha=0.5)
    assert est.average_s is None and est.retry_after(0, 2) == 1.0  # default 1 s per job
    est.observe(4.0)
    assert est.retry_after(0, 2) == 4.0
    assert est.retry_after(4, 2) == 12.0  # (1 + 4/2) service times
    est.observe(0.0)
    assert est.average_s == 2.0
    est2 = ServiceTimeEstimator()
    est2.observe(0.001)
    assert est2.retry_after(0, 4) == 1.0  # never below one second
    assert est2.retry_after(5, 3) == 1.0
    est2.observe(10_000.0)
    assert est2.retry_after(100, 1) == 600.0  # capped


def test_queue_timeout_releases_the_permit() -> None:
    async def main():
        gate = threading.Event()
        obs = RecordingObserver()
        b = FakeBehaviour(gate=gate)
        pool = EnginePool(lambda i: FakeEngine(b), configs.pool(workers=1, max_queue=1, queue_timeout_s=0.05), obs)
        await pool.start()
        try:
            running = asyncio.create_task(consume(pool, "running"))
            await await_until(lambda: len(b.started) == 1)
            t0 = time.monotonic()
            with pytest.raises(QueueTimeout) as info:
                await synthesize(pool, req("waits"))
            assert 0.04 < time.monotonic() - t0 < 2.0
            assert info.value.retry_after_s >= 1
            stats = pool.stats()
            assert stats["queued"] == 0 and stats["in_flight"] == 1 and stats["rejected"] == {"queue_timeout": 1}
            assert obs.rejects == ["queue_timeout"]
            ticket = pool.gate.admit_now()  # the queue place is free again
            ticket.release()
            with pytest.raises(PermitError):
                ticket.release()  # a double release is a bug: refused and counted, not hidden
            assert pool.stats()["in_flight"] == 1 and pool.stats()["ticket_misuses"] == 1
            gate.set()
            assert await running == 3
            assert obs.depths[-1] == 0 and obs.starts == 1 and obs.ends == ["ok"] and len(obs.waits) == 1
        finally:
            gate.set()
            await pool.close()

    run(main())


def test_fifo_order_and_cancelled_waiters_give_their_place_back() -> None:
    async def main():
        pool, _, b = make_pool(FakeBehaviour(gate=threading.Event()), workers=1, max_queue=10)
        await pool.start()
        try:
            holder = await synthesize(pool, req("holder"))
            order: list[int] = []

            async def waiter(i: int) -> None:
                async with await synthesize(pool, req(f"w{i}")):
                    order.append(i)
                    await asyncio.sleep(0)

            tasks = []
            for i in range(6):
                tasks.append(asyncio.create_task(waiter(i)))
                await await_until(lambda n=i + 1: pool.stats()["queued"] == n)
            tasks[2].cancel()
            await await_until(lambda: pool.stats()["queued"] == 5)
            b.gate.set()
            await holder.aclose()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(results[2], asyncio.CancelledError)
            assert order == [0, 1, 3, 4, 5]
            stats = pool.stats()
            assert stats["in_flight"] == 0 and stats["running"] == 0 and stats["slots"][0]["state"] == "idle"
            assert_released(pool)
        finally:
            b.gate.set()
            await pool.close()

    run(main())


def test_a_waiter_cancelled_just_after_a_slot_was_handed_to_it_passes_the_slot_on() -> None:
    async def main():
        pool, _, b = make_pool(FakeBehaviour(gate=threading.Event()), workers=1, max_queue=4)
        await pool.start()
        try:
            holder = await synthesize(pool, req("holder"))
            w1 = asyncio.create_task(synthesize(pool, req("w1")))
            await await_until(lambda: pool.stats()["queued"] == 1)
            w2 = asyncio.create_task(synthesize(pool, req("w2")))
            await await_until(lambda: pool.stats()["queued"] == 2)
            # The holder's thread returns: its slot is handed to w1's future first (the job's own
            # callback), then w1 is cancelled before it could resume.
            holder.thread_returned.add_done_callback(lambda _: w1.cancel())
            b.gate.set()
            with pytest.raises(asyncio.CancelledError):
                await w1
            job2 = await w2
            await holder.aclose()
            assert job2.request_id == "w2"
            assert pool.stats()["running"] == 1 and pool.stats()["in_flight"] == 1
            async with job2:
                assert len([c async for c in job2]) == 3
            stats = pool.stats()
            assert stats["running"] == 0 and stats["in_flight"] == 0 and stats["slots"][0]["state"] == "idle"
            assert b.started == ["holder", "w2"]
            assert_released(pool)
        finally:
            b.gate.set()
            await pool.close()

    run(main())


def test_tickets_are_single_use() -> None:
    async def main():
        pool, _, _ = make_pool(workers=1)
        other, _, _ = make_pool(workers=1)
        await pool.start()
        await other.start()
        try:
            ticket = pool.gate.admit_now()
            job = await pool.run(ticket, req())
            assert not ticket.held  # moved into the job
            with pytest.raises(RuntimeError):
                await pool.run(ticket, req())
            await job.aclose()
            with pytest.raises(RuntimeError):
                await pool.run(other.gate.admit_now(), req())  # a ticket of another pool
            assert pool.stats()["in_flight"] == 0 and pool.stats()["slots"][0]["state"] == "idle"
            assert other.stats()["in_flight"] == 1  # the foreign ticket was not taken
        finally:
            await pool.close()
            await other.close()

    run(main())


def test_drain_stops_admission_and_lets_queued_and_running_work_finish() -> None:
    async def main():
        gate = threading.Event()
        pool, _, b = make_pool(FakeBehaviour(gate=gate), workers=1, max_queue=2)
        await pool.start()
        try:
            clients = [asyncio.create_task(consume(pool, f"c{i}")) for i in range(2)]
            await await_until(lambda: len(b.started) == 1 and pool.stats()["queued"] == 1)
            await pool.begin_drain()
            assert not pool.ready and pool.draining
            with pytest.raises(Draining) as info:
                pool.gate.admit_now()
            assert info.value.retry_after_s >= 1
            assert await pool.wait_idle(0.05) is False
            gate.set()
            assert await pool.wait_idle(5.0) is True
            assert await asyncio.gather(*clients) == [3, 3]
            assert pool.stats()["rejected"] == {"draining": 1}
        finally:
            gate.set()
            await pool.close()
        assert await pool.wait_idle(0) is True

    run(main())


class ClosingEngine(FakeEngine):
    def close(self) -> None:
        self.threads.add("close:" + threading.current_thread().name)
        super().close()


def test_close_cancels_running_work_fails_waiters_and_joins_threads() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        engines: list[ClosingEngine] = []

        def factory(i: int) -> ClosingEngine:
            engines.append(ClosingEngine(b))
            return engines[-1]

        pool = EnginePool(factory, configs.pool(workers=2, max_queue=2))
        await pool.start()
        assert len(slot_threads()) == 2
        jobs = [await synthesize(pool, req(f"r{i}")) for i in range(2)]
        waiting = asyncio.create_task(synthesize(pool, req("queued")))
        readers = [asyncio.create_task(job.first_chunk()) for job in jobs]
        await await_until(lambda: len(b.started) == 2 and pool.stats()["queued"] == 1)
        await pool.close()
        for reader in readers:
            with pytest.raises(Draining):
                await reader
        with pytest.raises(Draining):
            await waiting
        assert sorted(b.cancelled) == ["r0", "r1"]
        assert all(job.done and job.outcome == "cancelled" for job in jobs)
        for job in jobs:
            await job.aclose()  # still fine after close
        assert slot_threads() == []
        assert all(e.closed for e in engines)
        assert sorted(t for e in engines for t in e.threads if t.startswith("close:")) == [
            "close:cosyserve-slot-0",
            "close:cosyserve-slot-1",
        ]
        assert [s["state"] for s in pool.stats()["slots"]] == ["closed", "closed"]
        with pytest.raises(Draining):
            pool.gate.admit_now()
        await pool.close()  # idempotent

    run(main())


def test_share_engine_builds_and_loads_exactly_one_engine_used_by_all_slots() -> None:
    async def main():
        gate = threading.Event()
        pool, engines, b = make_pool(FakeBehaviour(gate=gate), workers=3, share_engine=True)
        await pool.start()
        try:
            assert len(engines) == 1 and engines[0].threads == {"cosyserve-slot-0"}
            clients = [asyncio.create_task(consume(pool, f"c{i}")) for i in range(3)]
            await await_until(lambda: len(b.started) == 3)
            gate.set()
            assert await asyncio.gather(*clients) == [3, 3, 3]
            assert engines[0].threads == {f"cosyserve-slot-{i}" for i in range(3)}
        finally:
            gate.set()
            await pool.close()
        assert len(engines) == 1 and engines[0].closed
        assert slot_threads() == []

    run(main())


def test_a_load_failure_makes_start_raise_and_closes_the_loaded_slots() -> None:
    async def main():
        engines: list[FakeEngine] = []

        def factory(i: int) -> FakeEngine:
            engines.append(FakeEngine(FakeBehaviour(fail_on_load=(i == 1)), name=f"fake-{i}"))
            return engines[-1]

        pool = EnginePool(factory, configs.pool(workers=3))
        with pytest.raises(EngineFailure, match="fail on load"):
            await pool.start()
        by_name = {e.name: e for e in engines}
        assert by_name["fake-0"].closed and by_name["fake-2"].closed
        assert not by_name["fake-1"].loaded and not by_name["fake-1"].closed
        assert slot_threads() == []
        assert not pool.ready
        assert [s["state"] for s in pool.stats()["slots"]] == ["closed", "failed", "closed"]
        with pytest.raises(NotReady):
            pool.gate.admit_now()
        with pytest.raises(RuntimeError):
            await pool.start()
        await pool.close()

    run(main())


class HealthEngine(FakeEngine):
    def health_check(self) -> None:
        self.threads.add("health:" + threading.current_thread().name)
        super().health_check()


def test_check_health_runs_in_an_idle_slot_thread_and_is_skipped_when_all_are_busy() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        engine = HealthEngine(b)
        pool = EnginePool(lambda i: engine, configs.pool(workers=1))
        with pytest.raises(NotReady):
            await pool.check_health()
        await pool.start()
        try:
            await pool.check_health()
            assert "health:cosyserve-slot-0" in engine.threads
            b.unhealthy = True
            with pytest.raises(EngineFailure):
                await pool.check_health()
            assert pool.stats()["slots"][0]["state"] == "idle"
            client = asyncio.create_task(consume(pool, "busy"))
            await await_until(lambda: len(b.started) == 1)
            await pool.check_health()  # no idle slot: the engine call is skipped
            gate.set()
            assert await client == 3
        finally:
            gate.set()
            await pool.close()
        with pytest.raises(Draining):
            await pool.check_health()

    run(main())


def test_stats_shape_and_observer_failures_do_not_break_serving() -> None:
    class Broken(RecordingObserver):
        def on_job_end(self, outcome: str, seconds: float) -> None:
            raise ValueError("metrics bug")

    async def main():
        pool = EnginePool(lambda i: FakeEngine(), configs.pool(workers=2), Broken())
        await pool.start()
        try:
            assert await consume(pool, "a") == 3
            stats = pool.stats()
            assert set(stats) >= {
                "workers", "slots", "running", "queued", "admitted", "rejected", "avg_service_s", "ready", "draining"
            }
            assert stats["admitted"] == 1 and stats["avg_service_s"] is not None
            assert sum(s["jobs_done"] for s in stats["slots"]) == 1
            assert stats["in_flight"] == 0 and stats["ready"] and not stats["draining"]
        finally:
            await pool.close()

    run(main())


def test_config_validation() -> None:
    for bad in ({"workers": 0}, {"max_queue": -1}, {"queue_timeout_s": 0}, {"request_timeout_s": -1},
                {"stream_buffer_chunks": 0}):
        with pytest.raises(ValueError):
            configs.pool(**bad)
