"""Capacity follows compute: a stream's permit goes back when synthesis ends; unread audio is bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.engines.base import SynthesisRequest
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import EnginePool
from app.serving.bridge import BlockingStream
from app.serving.buffers import StreamBudget
from tests.support import configs
from tests.support.pool import synthesize
from tests.support.waiting import await_until, run


def req(rid: str) -> SynthesisRequest:
    return SynthesisRequest(text="hello", mode="sft", speaker="fake_female", request_id=rid)


def blocks(n: int, size: int, produced: list[int]):
    def gen(cancel: threading.Event) -> Iterator[bytes]:
        for i in range(n):
            produced.append(i)
            yield bytes(size)
    return gen


def test_a_stream_nobody_reads_gives_its_permit_back_when_synthesis_ends() -> None:
    async def main():
        pool = EnginePool(lambda i: FakeEngine(FakeBehaviour(chunks=20, chunk_s=0.2)),
                          configs.pool(workers=1, max_queue=0))
        await pool.start()
        try:
            job = await synthesize(pool, req("unread"))
            await await_until(lambda: job.done)  # the engine finished while nobody read a byte
            await asyncio.sleep(0)
            stats = pool.stats()
            assert stats["in_flight"] == 0, "the permit went back with the slot"
            assert pool.stream_budget.used == 0  # AudioChunks are not bytes: nothing counted here
            assert job.stream.buffered == 20  # the whole answer waits for its reader
            second = await synthesize(pool, req("next"))  # the one place is free for others meanwhile
            async with second:
                assert len([c async for c in second]) == 20
            async with job:
                assert len([c async for c in job]) == 20  # the late reader still gets every chunk
            assert job.outcome == "ok"
            assert pool.stats()["in_flight"] == 0
        finally:
            await pool.close()

    run(main())


def test_a_stream_holds_at_most_its_bytes_and_the_engine_waits_beyond() -> None:
    async def main():
        ex = ThreadPoolExecutor(1)
        produced: list[int] = []
        budget = StreamBudget(1 << 30)
        stream: BlockingStream[bytes] = BlockingStream(asyncio.get_running_loop(), 10_000, max_bytes=1000,
                                                       budget=budget, poll_s=0.01)
        done = stream.start(ex, blocks(50, 300, produced))
        await await_until(lambda: len(produced) == 4)  # 3 x 300 buffered, the 4th waits in the thread
        await asyncio.sleep(0.1)
        assert len(produced) == 4 and stream.buffered == 3 and budget.used == 900
        got = [x async for x in stream]
        await done
        assert len(got) == 50 and stream.max_buffered_bytes <= 1000 and budget.used == 0
        ex.shutdown()

    run(main())


def test_one_item_always_fits_even_above_the_limits() -> None:
    async def main():
        ex = ThreadPoolExecutor(1)
        budget = StreamBudget(10)
        stream: BlockingStream[bytes] = BlockingStream(asyncio.get_running_loop(), 100, max_bytes=10, budget=budget)
        done = stream.start(ex, blocks(3, 100, []))
        got = [x async for x in stream]  # each 100-byte item passes alone: a read stream keeps moving
        await done
        assert [len(x) for x in got] == [100, 100, 100] and budget.peak == 100
        ex.shutdown()

    run(main())


def test_all_streams_together_stay_within_the_budget_and_readers_free_it() -> None:
    async def main():
        ex = ThreadPoolExecutor(2)
        budget = StreamBudget(2000)
        loop = asyncio.get_running_loop()
        a_made: list[int] = []
        b_made: list[int] = []
        a: BlockingStream[bytes] = BlockingStream(loop, 10_000, max_bytes=1 << 20, budget=budget, poll_s=0.01)
        b: BlockingStream[bytes] = BlockingStream(loop, 10_000, max_bytes=1 << 20, budget=budget, poll_s=0.01)
        a_done = a.start(ex, blocks(20, 500, a_made))
        await await_until(lambda: len(a_made) == 5)  # 4 x 500 fill the budget; the 5th waits
        b_done = b.start(ex, blocks(20, 500, b_made))
        await await_until(lambda: b.buffered == 1)  # b may hold one item although the budget is full
        await asyncio.sleep(0.1)
        assert budget.used == 2500 and a.buffered == 4 and len(b_made) == 2
        assert budget.waits >= 1 and budget.peak <= 2500
        a.discard()  # a's client is gone: its bytes go back, b moves on
        a.cancel()
        got_b = [x async for x in b]
        await asyncio.gather(a_done, b_done)
        assert len(got_b) == 20 and budget.used == 0
        ex.shutdown()

    run(main())


def test_a_closed_job_gives_its_buffered_bytes_back() -> None:
    async def main():
        pool = EnginePool(lambda i: FakeEngine(FakeBehaviour(chunks=10)), configs.pool(workers=1, max_queue=0))
        await pool.start()
        try:
            job = await pool.run(pool.gate.admit_now(), req("bytes"), transform=lambda chunks, cancel: (
                c.pcm.tobytes() for c in chunks))
            await await_until(lambda: job.done)
            assert pool.stream_budget.used > 0 and pool.stats()["in_flight"] == 0
            await job.aclose()
            assert pool.stream_budget.used == 0
            assert pool.stream_budget.snapshot()["peak"] >= 10 * 2 * 4800
        finally:
            await pool.close()

    run(main())


def test_budget_rejects_a_nonsense_limit() -> None:
    with pytest.raises(ValueError):
        StreamBudget(0)
