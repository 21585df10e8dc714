"""1,000 mixed requests through one EnginePool: no slot, permit or thread may leak."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np

from app.engines.base import AudioChunk, EngineFailure, InvalidInput, SynthesisRequest
from app.engines.fake import FakeEngine
from app.serving import (
    DeadlineExceeded,
    EnginePool,
    Overloaded,
    QueueTimeout,
)
from tests.support import configs
from tests.support.pool import synthesize

# One batch of concurrent clients; 50 shuffled batches make 1,000 requests.
BATCH = ["ok"] * 6 + ["hang"] * 4 + ["stubborn"] * 2 + ["error"] * 2 + ["error_mid"] * 2 + ["invalid"] + ["cancel"] * 3


class ScriptedEngine(FakeEngine):
    """Behaves as the request's text says (``ok``, ``hang``, ...); counts generators that are still open."""

    def __init__(self) -> None:
        super().__init__()
        self.open_generators = 0
        self.opened = 0
        self.count_lock = threading.Lock()

    def _chunk(self) -> AudioChunk:
        return AudioChunk(pcm=np.zeros(240, dtype=np.int16), sample_rate=self.sample_rate)

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        if req.speaker not in self.b.speakers:
            raise InvalidInput("unknown speaker")  # eager, before any generator exists
        return self._run(req.text, cancel)

    def _run(self, kind: str, cancel: threading.Event) -> Iterator[AudioChunk]:
        with self.count_lock:
            self.open_generators += 1
            self.opened += 1
        try:
            if kind == "error":
                raise EngineFailure("scripted failure")
            if kind == "hang":
                cancel.wait(5)  # cooperative: returns when the deadline cancels it
                return
            if kind == "stubborn":
                cancel.wait(5)
                time.sleep(0.005)  # keeps the slot a little after the deadline
                yield self._chunk()
                return
            for i in range(3 if kind != "cancel" else 20):
                if cancel.wait(0.001 if kind == "cancel" else 0.0002):
                    return
                if kind == "error_mid" and i == 1:
                    raise EngineFailure("scripted mid-stream failure")
                yield self._chunk()
        finally:
            with self.count_lock:
                self.open_generators -= 1


def test_thousand_mixed_requests_leave_no_leaks() -> None:
    async def main() -> Counter:
        engine = ScriptedEngine()
        config = configs.pool(workers=4, max_queue=8, queue_timeout_s=0.01, request_timeout_s=0.03, stream_buffer_chunks=2)
        pool = EnginePool(lambda i: engine, config)
        await pool.start()
        rng = random.Random(1234)
        outcomes: Counter = Counter()

        async def plain_client(kind: str, rid: str) -> str:
            r = SynthesisRequest(text=kind, speaker="nobody" if kind == "invalid" else "fake_female",
                                 request_id=rid)
            async with await synthesize(pool, r) as job:
                n = len([c async for c in job])
            return "ok" if n else "empty"

        async def cancelling_client(rid: str) -> str:
            got_first = asyncio.Event()

            async def consume() -> None:
                r = SynthesisRequest(text="cancel", speaker="fake_female", request_id=rid)
                async with await synthesize(pool, r) as job:
                    async for _ in job:
                        got_first.set()

            task = asyncio.create_task(consume())
            first = asyncio.create_task(got_first.wait())
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
            first.cancel()
            task.cancel()  # the client disconnects while the stream is being read
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
            return "ok"

        async def client(kind: str, rid: str, delay: float) -> str:
            await asyncio.sleep(delay)
            try:
                return await (cancelling_client(rid) if kind == "cancel" else plain_client(kind, rid))
            except Overloaded:
                return "overloaded"
            except QueueTimeout:
                return "queue_timeout"
            except DeadlineExceeded:
                return "timeout"
            except (EngineFailure, InvalidInput):
                return "error"

        try:
            for b in range(50):
                kinds = BATCH[:]
                rng.shuffle(kinds)
                batch = [client(k, f"{b}-{i}", rng.choice([0, 0, 0.0005, 0.002])) for i, k in enumerate(kinds)]
                outcomes.update(await asyncio.gather(*batch))

            assert await pool.wait_idle(5.0)
            stats = pool.stats()
            assert stats["running"] == 0 and stats["queued"] == 0 and stats["in_flight"] == 0
            assert stats["ticket_misuses"] == 0  # every permit came back exactly once
            assert all(s["state"] == "idle" for s in stats["slots"])
            assert engine.open_generators == 0  # every started engine generator was closed
            assert sum(s["jobs_done"] for s in stats["slots"]) == stats["admitted"] - stats["rejected"].get(
                "queue_timeout", 0
            )
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert [t for t in others if t.get_coro().__name__ != "wait_for"] == []  # no stray tasks
            # ... and the pool still serves.
            r = SynthesisRequest(text="ok", speaker="fake_female", request_id="final")
            async with await synthesize(pool, r) as job:
                assert len([c async for c in job]) == 3
            assert job.outcome == "ok"
        finally:
            await pool.close()
        assert [t for t in threading.enumerate() if t.name.startswith("cosyserve-slot-")] == []
        return outcomes

    t0 = time.monotonic()
    outcomes = asyncio.run(asyncio.wait_for(main(), 60))
    assert sum(outcomes.values()) == 1000
    for outcome in ("ok", "error", "cancelled", "timeout", "queue_timeout", "overloaded"):
        assert outcomes[outcome] > 0, outcomes
    assert time.monotonic() - t0 < 15
