"""BlockingStream (bridge.py): a blocking generator in an executor thread -> async iterator."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.serving.bridge import BlockingStream
from tests.support.waiting import await_until, run


async def with_executor(body):
    executor = ThreadPoolExecutor(1, thread_name_prefix="stream-test")
    try:
        return await body(executor)
    finally:
        executor.shutdown(wait=True)


def test_items_arrive_in_order_then_end() -> None:
    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 2)
            done = stream.start(ex, lambda cancel: iter(range(10)))
            items = [x async for x in stream]
            await done
            assert items == list(range(10))
            assert stream.exhausted and stream.error is None
            assert stream.max_buffered <= 2
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()

        await with_executor(body)

    run(main())


def test_engine_error_is_transported_after_earlier_items() -> None:
    def gen(cancel: threading.Event) -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("engine broke")

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 4)
            done = stream.start(ex, gen)
            got = []
            with pytest.raises(ValueError, match="engine broke"):
                async for x in stream:
                    got.append(x)
            await done
            assert got == [1, 2]
            assert not stream.exhausted
            # The error is delivered once; afterwards the stream is simply over.
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()

        await with_executor(body)

    run(main())


def test_stop_iteration_never_crosses_the_thread_boundary() -> None:
    def bad(cancel: threading.Event) -> Iterator[int]:
        yield 1
        raise StopIteration  # noqa: PLR1708 - PEP 479: becomes RuntimeError inside the generator

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 4)
            done = stream.start(ex, bad)
            with pytest.raises(RuntimeError):
                async for _ in stream:
                    pass
            assert await done is None  # the thread function itself returned normally

        await with_executor(body)

    run(main())


def test_factory_error_and_plain_iterables() -> None:
    def explode(cancel: threading.Event) -> Iterator[int]:
        raise KeyError("eager")

    async def main():
        async def body(ex):
            loop = asyncio.get_running_loop()
            s1: BlockingStream[int] = BlockingStream(loop, 1)
            d1 = s1.start(ex, explode)
            with pytest.raises(KeyError):
                await s1.__anext__()
            await d1
            s2: BlockingStream[int] = BlockingStream(loop, 1)
            d2 = s2.start(ex, lambda cancel: [])
            assert [x async for x in s2] == []
            await d2
            assert s2.exhausted

        await with_executor(body)

    run(main())


def test_cancel_wakes_a_producer_blocked_on_a_full_buffer_and_closes_the_generator() -> None:
    closed_in: list[str] = []
    pulled: list[int] = []

    def gen(cancel: threading.Event) -> Iterator[int]:
        try:
            for i in range(1000):
                pulled.append(i)
                yield i
        finally:
            closed_in.append(threading.current_thread().name)

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 3, poll_s=30.0)
            done = stream.start(ex, gen)
            await await_until(lambda: len(pulled) == 4)  # 3 buffered + 1 held by the blocked thread
            await asyncio.sleep(0.05)
            assert len(pulled) == 4 and stream.buffered == 3
            t0 = time.monotonic()
            stream.cancel()  # notifies the condition: no waiting for the 30 s poll
            await asyncio.wait_for(asyncio.shield(done), 2.0)
            assert time.monotonic() - t0 < 1.0
            assert closed_in and closed_in[0].startswith("stream-test")
            assert not stream.exhausted and stream.error is None

        await with_executor(body)

    run(main())


def test_abort_raises_at_once_and_drops_buffered_items() -> None:
    gate = threading.Event()

    def gen(cancel: threading.Event) -> Iterator[int]:
        yield 1
        yield 2
        gate.wait(5)
        yield 3

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 4)
            done = stream.start(ex, gen)
            assert await stream.__anext__() == 1
            await await_until(lambda: stream.buffered == 1)
            stream.abort(TimeoutError("deadline"))
            with pytest.raises(TimeoutError, match="deadline"):
                await stream.__anext__()
            gate.set()
            await done
            assert stream.cancel_event.is_set()
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()

        await with_executor(body)

    run(main())


def test_a_cancelled_consumer_can_read_again_and_slow_consumers_get_everything() -> None:
    gate = threading.Event()

    def gen(cancel: threading.Event) -> Iterator[int]:
        gate.wait(5)
        yield from range(20)

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 1)
            done = stream.start(ex, gen)
            reader = asyncio.create_task(stream.__anext__())
            await asyncio.sleep(0.01)
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            gate.set()
            got = []
            async for x in stream:
                got.append(x)
                await asyncio.sleep(0)  # slower than the producer: it keeps blocking on the buffer
            await done
            assert got == list(range(20)) and stream.max_buffered == 1

        await with_executor(body)

    run(main())


def test_one_consumer_at_a_time() -> None:
    gate = threading.Event()

    def gen(cancel: threading.Event) -> Iterator[int]:
        gate.wait(5)
        yield 1

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 1)
            done = stream.start(ex, gen)
            first = asyncio.create_task(stream.__anext__())
            await asyncio.sleep(0.01)
            with pytest.raises(RuntimeError, match="one consumer"):
                await stream.__anext__()
            gate.set()
            assert await first == 1
            await done

        await with_executor(body)

    run(main())


def test_blocked_time_counts_only_the_waits_for_a_slow_consumer() -> None:
    def gen(cancel: threading.Event) -> Iterator[int]:
        yield from range(3)

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 1)
            done = stream.start(ex, gen)
            await await_until(lambda: stream.buffered == 1)
            await asyncio.sleep(0.2)  # the producer holds item 1 and waits for room
            assert [x async for x in stream] == [0, 1, 2]
            await done
            assert 0.15 <= stream.blocked_s < 5.0

        await with_executor(body)

    run(main())


def test_a_consumer_that_keeps_up_leaves_no_blocked_time() -> None:
    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 8)
            done = stream.start(ex, lambda cancel: iter(range(5)))
            await done
            assert [x async for x in stream] == [0, 1, 2, 3, 4] and stream.blocked_s == 0.0

        await with_executor(body)

    run(main())


def test_pace_pauses_the_producer_after_each_item_by_the_work_it_took_and_cancel_wakes_it() -> None:
    worked: list[float] = []
    aheads: list[float] = []

    class Piece(int):
        duration_s = 1.0  # a second of audio each

    def gen(cancel: threading.Event) -> Iterator[int]:
        for i in range(3):
            time.sleep(0.05)  # the work of one item
            yield Piece(i)

    def pace(w: float, ahead: float) -> float:
        worked.append(w)
        aheads.append(ahead)
        return 0.1

    async def main():
        async def body(ex):
            stream: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 8)
            stream.pace = pace
            began = time.monotonic()
            done = stream.start(ex, gen)
            assert [x async for x in stream] == [0, 1, 2]
            await done
            assert time.monotonic() - began >= 3 * 0.05 + 2 * 0.1  # paused after each item it handed over
            assert len(worked) == 3 and all(0.04 <= w < 1.0 for w in worked)  # the item's work, not the pause
            assert stream.paused_s >= 0.25
            # its audio ahead of real time: 1, 2, 3 s made, less the time since the first item
            assert [round(a, 1) for a in aheads] == pytest.approx([1.0, 1.8, 2.7], abs=0.15)
            assert stream.produced_audio_s == 3.0

            long_pause: BlockingStream[int] = BlockingStream(asyncio.get_running_loop(), 8)
            long_pause.pace = lambda w, ahead: 60.0
            done = long_pause.start(ex, gen)
            assert await long_pause.__anext__() == 0
            began = time.monotonic()
            long_pause.cancel()  # wakes the pausing producer at once
            await asyncio.wait_for(done, 5)
            assert time.monotonic() - began < 2 and long_pause.paused_s < 2

        await with_executor(body)

    run(main())
