"""Job (through EnginePool.run): chunks, first and rest, errors, client cancel, deadline, aclose, backpressure."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from app.engines.base import AudioChunk, EngineFailure, InvalidInput, SynthesisRequest
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import DeadlineExceeded, EnginePool
from app.text.stream import TextStream
from tests.support import configs
from tests.support.pool import synthesize
from tests.support.waiting import await_until, run


def req(rid: str = "r", **kw) -> SynthesisRequest:
    kw.setdefault("speaker", "fake_female")
    return SynthesisRequest(text="hello", mode="sft", request_id=rid, **kw)



def assert_idle(pool: EnginePool) -> None:
    stats = pool.stats()
    assert stats["running"] == 0 and stats["queued"] == 0 and stats["in_flight"] == 0
    assert all(s["state"] == "idle" for s in stats["slots"])


async def started_pool(engine_or_behaviour, **cfg) -> EnginePool:
    if isinstance(engine_or_behaviour, FakeBehaviour):
        b = engine_or_behaviour
        pool = EnginePool(lambda i: FakeEngine(b), configs.pool(**cfg))
    else:
        pool = EnginePool(lambda i: engine_or_behaviour, configs.pool(**cfg))
    await pool.start()
    return pool


async def still_works(pool: EnginePool) -> None:
    async with await synthesize(pool, req("after")) as job:
        assert len([c async for c in job]) >= 1
    assert job.outcome == "ok"
    assert_idle(pool)


def test_first_chunk_returns_the_first_and_the_rest_and_timings_are_recorded() -> None:
    async def main():
        pool = await started_pool(FakeBehaviour(chunks=3, chunk_s=0.2), workers=1)
        try:
            async with await synthesize(pool, req("a")) as job:
                first, rest = await job.first_chunk()
                with pytest.raises(RuntimeError):
                    await job.first_chunk()  # handed out once, never re-delivered
                chunks = [first] + [c async for c in rest]
            assert chunks[0] is first and len(chunks) == 3 and all(c is not first for c in chunks[1:])
            assert job.request_id == "a" and job.outcome == "ok"
            assert job.time_to_first_chunk_s is not None and job.time_to_first_chunk_s >= 0
            assert job.audio_s == pytest.approx(0.6) and job.queue_wait_s >= 0
            await job.aclose()  # idempotent
            assert_idle(pool)
            job2 = await synthesize(pool, SynthesisRequest(text="x", speaker="fake_male"))
            assert job2.request_id  # generated when the request has none
            await job2.aclose()
            assert_idle(pool)
        finally:
            await pool.close()

    run(main())


class EmptyEngine(FakeEngine):
    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        return iter(())


def test_first_chunk_is_none_when_the_engine_yields_nothing() -> None:
    async def main():
        pool = await started_pool(EmptyEngine(), workers=1)
        try:
            async with await synthesize(pool, req()) as job:
                first, rest = await job.first_chunk()
                assert first is None
                assert [c async for c in rest] == []
            assert job.outcome == "ok" and job.audio_s == 0
            assert_idle(pool)
        finally:
            await pool.close()

    run(main())


@pytest.mark.parametrize("case", ["invalid_input", "fail_at_first", "fail_mid_stream"])
def test_engine_errors_reach_the_consumer_and_free_the_slot(case: str) -> None:
    async def main():
        b = FakeBehaviour(chunks=3, fail_at_chunk={"fail_at_first": 0, "fail_mid_stream": 2}.get(case))
        pool = await started_pool(b, workers=1)
        try:
            r = req("e", speaker="nobody") if case == "invalid_input" else req("e")
            expected = InvalidInput if case == "invalid_input" else EngineFailure
            got = []
            async with await synthesize(pool, r) as job:
                with pytest.raises(expected):
                    first, rest = await job.first_chunk()
                    got.append(first)
                    async for chunk in rest:
                        got.append(chunk)
                # The consumer saw the error and the thread returned: released even before aclose.
                await await_until(lambda: pool.stats()["in_flight"] == 0)
                assert [c async for c in job] == []  # the stream is over
            assert len(got) == (2 if case == "fail_mid_stream" else 0)
            assert job.outcome == "error"
            assert_idle(pool)
            b.fail_at_chunk = None
            await still_works(pool)
        finally:
            await pool.close()

    run(main())


@pytest.mark.parametrize("calls_aclose", [True, False])
def test_a_client_cancelled_while_iterating_frees_the_slot(calls_aclose: bool) -> None:
    async def main():
        b = FakeBehaviour(chunks=50, chunk_delay_s=0.01)
        pool = await started_pool(b, workers=1)
        try:
            got_first = asyncio.Event()

            async def client() -> None:
                job = await synthesize(pool, req("c"))
                try:
                    async for _ in job:
                        got_first.set()
                finally:
                    if calls_aclose:
                        await job.aclose()

            task = asyncio.create_task(client())
            await got_first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await await_until(lambda: pool.stats()["in_flight"] == 0)
            assert b.cancelled == ["c"] and b.finished == []
            assert_idle(pool)
            b.chunks = 1
            await still_works(pool)
        finally:
            await pool.close()

    run(main())


class StubbornEngine(FakeEngine):
    """Ignores its cancel flag until ``release`` is set (a model stuck in one long step)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.entered = threading.Event()
        self.returned = threading.Event()

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        if req.request_id != "stuck":
            yield from super().synthesize(req, cancel)
            return
        try:
            self.entered.set()
            self.release.wait(5)
            yield AudioChunk(pcm=np.zeros(10, dtype=np.int16), sample_rate=self.sample_rate)
        finally:
            self.returned.set()


def test_deadline_raises_deadline_exceeded_and_frees_the_slot_only_when_the_thread_returned() -> None:
    async def main():
        release = threading.Event()
        engine = StubbornEngine(release)
        pool = await started_pool(engine, workers=1, max_queue=1, request_timeout_s=0.1)
        try:
            job = await synthesize(pool, req("stuck"))
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                await job.first_chunk()
            assert 0.09 < time.monotonic() - t0 < 2.0
            stats = pool.stats()
            assert stats["running"] == 1 and stats["slots"][0]["state"] == "busy" and not job.done
            closer = asyncio.create_task(job.aclose())
            await asyncio.sleep(0.05)
            assert not closer.done()  # aclose waits for the slot thread
            release.set()
            await asyncio.wait_for(closer, 5)
            assert engine.returned.is_set() and job.done and job.outcome == "timeout"
            assert_idle(pool)
            await still_works(pool)
        finally:
            release.set()
            await pool.close()

    run(main())


def test_a_caller_cancelled_during_a_bounded_close_finishes_it_before_unwinding() -> None:
    async def main():
        release = threading.Event()
        engine = StubbornEngine(release)
        pool = await started_pool(engine, workers=1, request_timeout_s=0)
        try:
            job = await synthesize(pool, req("stuck"))
            await await_until(engine.entered.is_set)
            closer = asyncio.create_task(job.aclose(wait_s=5))
            await await_until(lambda: job.stream.cancel_event.is_set())  # aclose has begun its wait
            closer.cancel()
            await asyncio.sleep(0.05)
            assert not closer.done()  # still waiting for the slot thread, within its bound
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await closer
            assert job.done and job.outcome == "cancelled"
            assert_idle(pool)  # slot and permit were back before the cancellation propagated
        finally:
            release.set()
            await pool.close()

    run(main())


def test_deadline_with_a_cooperative_engine_and_a_late_reader() -> None:
    async def main():
        gate = threading.Event()
        b = FakeBehaviour(gate=gate)
        pool = await started_pool(b, workers=1, request_timeout_s=0.05)
        try:
            async with await synthesize(pool, req("slow")) as job:
                await await_until(lambda: job.done)  # nobody reads; the deadline cancels the engine
                with pytest.raises(DeadlineExceeded):
                    async for _ in job:
                        pass
            assert b.cancelled == ["slow"] and job.outcome == "timeout"
            assert_idle(pool)
        finally:
            gate.set()
            await pool.close()

    run(main())


def test_a_job_whose_text_still_arrives_has_its_deadline_from_the_last_text() -> None:
    """A WebSocket utterance: a client that types for longer than request_timeout_s is not cut off;
    one that stops typing is, request_timeout_s after its last text."""

    async def main():
        pool = await started_pool(FakeBehaviour(), workers=1, request_timeout_s=0.3)
        try:
            typed = TextStream()
            async with await synthesize(pool, req("typed", text_stream=typed)) as job:
                for _ in range(8):  # 0.8 s of typing, well past the 0.3 s deadline
                    typed.put("One sentence. ")
                    await asyncio.sleep(0.1)
                typed.end()
                assert len([c async for c in job]) >= 8
            assert job.outcome == "ok"
            stalled = TextStream()
            stalled.put("Half a sen")
            t0 = time.monotonic()
            async with await synthesize(pool, req("stalled", text_stream=stalled)) as job:
                await asyncio.sleep(0.2)
                stalled.put("tence")  # the last text: the deadline is 0.3 s from here
                last = time.monotonic()
                with pytest.raises(DeadlineExceeded, match="of its last text"):
                    async for _ in job:
                        pass
                assert time.monotonic() - last >= 0.29 and time.monotonic() - t0 < 3.0
                assert job.deadline_s >= 0.49  # started_at + deadline_s = the last text + 0.3 s
            assert job.outcome == "timeout"
            assert_idle(pool)
        finally:
            await pool.close()

    run(main())


class CountingEngine(FakeEngine):
    def __init__(self, behaviour: FakeBehaviour) -> None:
        super().__init__(behaviour)
        self.yielded = 0

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        for chunk in super().synthesize(req, cancel):
            self.yielded += 1
            yield chunk


def test_backpressure_bounds_what_a_slow_consumer_makes_the_engine_produce() -> None:
    async def main():
        engine = CountingEngine(FakeBehaviour(chunks=50, chunk_s=0.5))
        pool = await started_pool(engine, workers=1, stream_buffer_chunks=4)
        try:
            async with await synthesize(pool, req("slow-reader")) as job:
                await await_until(lambda: engine.yielded == 5)  # 4 buffered + 1 held by the thread
                await asyncio.sleep(0.2)
                assert engine.yielded == 5  # the engine is not pulled further: memory stays bounded
                got = 0
                async for _ in job:
                    got += 1
                    assert engine.yielded <= got + 5
                assert got == 50
            assert job.outcome == "ok"
            # A non-reading consumer that gives up: aclose wakes the blocked thread at once.
            job = await synthesize(pool, req("gives-up"))
            await await_until(lambda: engine.yielded == 55)
            t0 = time.monotonic()
            await job.aclose()
            assert time.monotonic() - t0 < 0.5 and job.outcome == "cancelled"
            assert_idle(pool)
        finally:
            await pool.close()

    run(main())


def test_no_deadline_when_request_timeout_is_zero() -> None:
    async def main():
        pool = await started_pool(FakeBehaviour(chunks=2, chunk_delay_s=0.05), workers=1, request_timeout_s=0)
        try:
            async with await synthesize(pool, req()) as job:
                assert len([c async for c in job]) == 2
            assert job.outcome == "ok"
        finally:
            await pool.close()

    run(main())


def test_close_gives_up_on_a_stuck_slot_thread_after_close_timeout() -> None:
    async def main():
        release = threading.Event()
        engine = StubbornEngine(release)
        pool = await started_pool(engine, workers=1, request_timeout_s=0, close_timeout_s=0.1)
        try:
            job = await synthesize(pool, req("stuck"))
            await await_until(engine.entered.is_set)
            t0 = time.monotonic()
            await pool.close()  # the stuck thread ignores its cancel flag
            assert time.monotonic() - t0 < 2.0
            assert not job.done and not engine.closed  # never closed under a running generator
        finally:
            release.set()
        await asyncio.wait_for(asyncio.shield(job.thread_returned), 5)
        await job.aclose()
        await await_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("cosyserve-slot-")])

    run(main())


def test_call_runs_a_function_in_a_slot_thread_and_frees_the_slot():
    import asyncio
    import threading

    from app.engines.fake import FakeBehaviour, FakeEngine
    from app.serving.pool import EnginePool

    async def main():
        pool = EnginePool(lambda i: FakeEngine(FakeBehaviour()), configs.pool(workers=1, max_queue=0))
        await pool.start()
        try:
            name = await pool.call(lambda engine: (threading.current_thread().name, engine.sample_rate))
            assert name == ("cosyserve-slot-0", 24000)

            def boom(engine):
                raise ValueError("bad")

            try:
                await pool.call(boom)
            except ValueError as exc:
                assert str(exc) == "bad"
            else:
                raise AssertionError("call() must re-raise")
            stats = pool.stats()
            assert stats["running"] == 0 and stats["in_flight"] == 0
            assert await pool.call(lambda engine: 42) == 42
        finally:
            await pool.close()

    asyncio.run(main())
