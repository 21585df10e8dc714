"""Probes: liveness (the process answers) and readiness (every slot loaded, warm, healthy, not draining)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.deps import RuntimeDep

router = APIRouter(tags=["health"])
log = logging.getLogger("cosyserve.api")


@router.get("/health/live")
async def live() -> dict:
    return {"status": "alive"}


@router.get("/health/ready")
async def ready(request: Request, runtime: RuntimeDep) -> JSONResponse:
    pool = runtime.pool
    detail: dict = {"draining": runtime.draining}
    reasons: list[str] = []
    if pool is None:
        reasons.append("engine pool not started")
    else:
        stats = pool.stats()
        detail.update({k: stats.get(k) for k in ("workers", "running", "queued", "ready", "draining")})
        detail["slots"] = [s.get("state") for s in stats.get("slots", [])]
        if not pool.ready:
            reasons.append("draining" if pool.draining else "slots not loaded and warm")
        else:
            try:
                await pool.check_health()
            except Exception as exc:  # any failure of the engine's own check means not ready
                log.warning("engine health check failed: %s", type(exc).__name__)
                reasons.append("engine health check failed")
    if runtime.draining and "draining" not in reasons:
        reasons.append("draining")
    ok = not reasons
    return JSONResponse({"status": "ready" if ok else "not_ready", "reasons": reasons, **detail}, status_code=200 if ok else 503)
