"""Admission at the edge: refuse synthesis requests with 503 before any routing or parsing.

Under overload most requests are rejected, so a rejection must cost next to
nothing, or rejecting steals the CPU (and, with GIL-bound models, the GIL) that
the engines need. This plain ASGI middleware takes the pool's admission permit
for the synthesis routes of the route table first; a refused request gets its
503 envelope without touching FastAPI's routing, dependencies or the body. An
admitted request carries its permit in its ``RequestContext`` until the speech
service takes it (``RequestContext.take_ticket``: the permit moves on, and the
job releases it); a request that never reaches the service (refused while
parsing or planning) releases it here when its response ends. The body then has
``server.body_timeout_s`` to arrive, and the queue wait counts from when it is in
(``EnginePool.run``).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request

from app.api.context import context_of
from app.api.errors import classify, render
from app.api.routes import match
from app.serving.errors import ServingError
from app.serving.pool import EnginePool


class AdmissionMiddleware:
    def __init__(self, app: Callable, pool: Callable[[], EnginePool | None]) -> None:
        self.app = app
        self.pool = pool  # None until the lifespan built the runtime (app.runtime.running)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = match(scope) if scope["type"] == "http" else None
        pool = self.pool() if route is not None else None
        if route is None or pool is None:
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        ctx.endpoint = route.path
        try:
            ticket = pool.admit()
        except ServingError as exc:
            response = render(Request(scope), classify(exc))
            await response(scope, receive, send)
            return
        ctx.ticket = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ctx.ticket = None
            ticket.release()  # nothing to do if the service took it; else nobody used it
