"""Small helpers shared by the pool tests."""

from __future__ import annotations

from app.engines.base import SynthesisRequest
from app.serving import EnginePool, Job


async def synthesize(pool: EnginePool, req: SynthesisRequest) -> Job:
    """admit + run: a started job, or the refusal (the permit is back before it raises)."""
    return await pool.run(pool.admit(), req)


def assert_released(pool: EnginePool) -> None:
    """Every permit came back exactly once: none out, none released twice."""
    stats = pool.stats()
    assert stats["in_flight"] == 0 and stats["queued"] == 0 and stats["ticket_misuses"] == 0, stats
