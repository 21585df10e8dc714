"""Probes: liveness (the process answers and no slot is wedged) and readiness.

``/health/live`` is 503 while a slot is stuck in the engine past
``request_timeout_s + stuck_grace_s`` (its deadline fired, its cancel flag is
set, yet its thread never returned): only a restart frees it, so the
orchestrator should restart the process. ``/health/ready`` is 200 only when every
slot is loaded and warm, the engine's health check passes within
``health_timeout_s``, and the server is not draining.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import RuntimeDep

router = APIRouter(tags=["health"])
PROBE_503 = {503: {"description": "Not live / not ready; the JSON body says why",
                   "content": {"application/json": {"schema": {"type": "object"}}}}}
log = logging.getLogger("cosyserve.api")


@router.get("/health/live", summary="Liveness: 503 while a slot is stuck in the engine", responses=PROBE_503)
async def live(runtime: RuntimeDep) -> JSONResponse:
    stuck = runtime.pool.stuck_slots()
    if stuck:
        return JSONResponse({"status": "stuck", "stuck_slots": stuck}, status_code=503)
    return JSONResponse({"status": "alive"})


@router.get("/health/ready", summary="Readiness: every slot loaded, warm and healthy, not draining",
            responses=PROBE_503)
async def ready(runtime: RuntimeDep) -> JSONResponse:
    pool = runtime.pool
    detail: dict = {"draining": runtime.draining}
    reasons: list[str] = []
    stats = pool.stats()
    detail.update({k: stats.get(k) for k in ("workers", "running", "queued", "ready", "draining", "stuck")})
    detail["slots"] = [s.get("state") for s in stats.get("slots", [])]
    if not pool.ready:
        reasons.append("draining" if pool.draining else "slots not loaded and warm")
    else:
        try:
            await pool.check_health()  # bounded by pool.health_timeout_s
        except Exception as exc:  # any failure of the engine's own check means not ready
            log.warning("engine health check failed: %s", type(exc).__name__)
            reasons.append("engine health check failed")
    if runtime.draining and "draining" not in reasons:
        reasons.append("draining")
    ok = not reasons
    return JSONResponse({"status": "ready" if ok else "not_ready", "reasons": reasons, **detail},
                        status_code=200 if ok else 503)
