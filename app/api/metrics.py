"""``GET /metrics``: Prometheus text format (mounted only when ``metrics.enabled``)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from app.api.deps import RuntimeDep
from app.metrics import CONTENT_TYPE_LATEST
from app.serving.errors import NotFound

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"description": "Prometheus text format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(runtime: RuntimeDep) -> Response:
    # Rendered on the event loop on purpose: it is cheap (well under a millisecond for our few
    # dozen series) and the pool's stats may only be read from the loop's thread.
    if runtime.metrics is None:
        raise NotFound("not_found", "metrics are disabled (metrics.enabled: false)")
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE_LATEST)
