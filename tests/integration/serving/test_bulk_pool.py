"""The bulk class on the real batched CosyVoice2 engine (tiny random weights): bulk requests from two
clients run in their own slot threads on the shared engine, beside interactive ones, and all finish."""

from __future__ import annotations

import asyncio

import pytest

from app.engines.base import SynthesisRequest
from app.serving import EnginePool
from tests.support import configs
from tests.support.waiting import run

pytestmark = [pytest.mark.integration]


def test_bulk_and_interactive_share_a_batched_engine(tiny_models) -> None:
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    cfg = configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True, max_batch_size=4)

    async def one(pool: EnginePool, ticket, rid: str) -> int:
        req = SynthesisRequest(text="Hello there, a short test.", mode="sft", speaker=pool.presets[0],
                               request_id=rid)
        async with await pool.run(ticket, req) as job:
            return sum([len(chunk.pcm) async for chunk in job])

    async def main():
        pool = EnginePool(lambda i: CosyVoiceEngine(cfg), configs.pool(workers=2, max_queue=0, share_engine=True,
                                                                     admission="fixed"))
        await pool.start()
        try:
            async def bulk(rid: str, client: str) -> int:
                return await one(pool, await pool.gate.admit("bulk", client), rid)

            tasks = [bulk(f"a{i}", "a") for i in range(3)] + [bulk("b0", "b")]
            tasks.append(one(pool, pool.gate.admit_now(), "live"))
            sizes = await asyncio.gather(*tasks)
            assert all(n > 0 for n in sizes)
            c = pool.stats()["classes"]
            assert c["bulk"]["completed"] == 4 and c["interactive"]["completed"] == 1
            assert c["bulk"]["in_flight"] == 0 and pool.stats()["in_flight"] == 0
        finally:
            await pool.close()

    run(main(), timeout=300)
