"""Small helpers shared by the pool tests."""

from __future__ import annotations

from typing import Any

from app.engines.base import SynthesisRequest
from app.serving import EnginePool, Job
from app.serving.encoded import OutputSpec
from app.serving.plan import Plan
from app.serving.speech import SpeechResult, SpeechService


async def synthesize(pool: EnginePool, req: SynthesisRequest) -> Job:
    """admit + run: a started job, or the refusal (the permit is back before it raises)."""
    return await pool.run(pool.gate.admit_now(), req)


def assert_released(pool: EnginePool) -> None:
    """Every permit came back exactly once: none out, none released twice."""
    stats = pool.stats()
    assert stats["in_flight"] == 0 and stats["queued"] == 0 and stats["ticket_misuses"] == 0, stats


async def admitted_run(service: SpeechService, plan: Plan, out: OutputSpec, **kw: Any) -> SpeechResult:
    """What the edge does before the speech service runs: an interactive permit at once, then run on it."""
    return await service.run(plan, out, ticket=service.pool.gate.admit_now(), **kw)
