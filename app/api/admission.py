"""Admission at the edge: refuse synthesis requests with 503 before any routing or parsing.

Under overload most requests are rejected, so a rejection must cost next to
nothing, or rejecting steals the CPU (and, with GIL-bound models, the GIL) that
the engines need. This plain ASGI middleware takes the pool's admission permit
for synthesis routes first; a refused request gets its 503 envelope without
touching FastAPI's routing, dependencies or the body. An admitted request carries
its permit in ``scope["cosyserve"]["ticket"]`` to ``respond.synthesize_response``;
whatever path the request takes, the permit is released when the response ends.
"""

from __future__ import annotations

from typing import Any, Callable

from starlette.requests import Request

from app.api.errors import classify, render
from app.runtime import Runtime
from app.serving.errors import ServingError

SYNTHESIS_PATHS = frozenset({"/v1/tts", "/v1/audio/speech"})
SYNTHESIS_PREFIX = "/inference_"


def is_synthesis(scope: dict) -> bool:
    path = scope.get("path", "")
    return scope.get("method") in ("POST", "GET") and (path in SYNTHESIS_PATHS or path.startswith(SYNTHESIS_PREFIX))


class AdmissionMiddleware:
    def __init__(self, app: Callable, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        pool = self.runtime.pool
        if scope["type"] != "http" or pool is None or not is_synthesis(scope):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("cosyserve", {})
        try:
            ticket: Any = pool.admit()
        except ServingError as exc:
            state["endpoint"] = scope.get("path")
            response = render(Request(scope), classify(exc))
            await response(scope, receive, send)
            return
        state["ticket"] = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()  # idempotent: a no-op when the job already released it
