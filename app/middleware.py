"""Plain ASGI middleware: request id in and out, one access-log line per request.

Handlers record what they know (time to first audio, audio seconds, stage
timings: ``stages=frontend=3ms,llm=120ms,flow=300ms,hift=40ms,encode=2ms``; a synthesis
request's traffic class: ``class=bulk``) in the
request's typed ``RequestContext`` (``app/api/context.py``); this middleware
creates it, and logs it once the response is done, streams included, with
counters in ``try/finally``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.api.context import CLIENT_LEFT, RequestContext, context_of, request_id
from app.api.errors import CLIENT_GONE_STATUS

log = logging.getLogger("cosyserve.access")

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, access_log: bool = True,
                 on_done: Callable[[RequestContext], None] | None = None) -> None:
        self.app = app
        self.access_log = access_log
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = ""
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        rid = request_id(incoming)
        ctx = context_of(scope)
        ctx.request_id = rid
        started = time.perf_counter()
        status = {"code": 0, "completed": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", ()))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                status["completed"] = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - started
            ctx.latency_s = elapsed
            ctx.status = status["code"] or (CLIENT_GONE_STATUS if ctx.error_code == CLIENT_LEFT else 500)
            ctx.completed = status["completed"]
            if self.on_done is not None:
                self.on_done(ctx)
            if self.access_log and not scope.get("path", "").startswith("/health"):
                ttfa = ctx.ttfa_s
                log.info(
                    "%s %s %s %d %.1fms ttfa=%s audio=%.2fs%s%s%s%s%s",
                    rid, scope.get("method", ""), scope.get("path", ""), ctx.status, elapsed * 1000,
                    f"{ttfa * 1000:.1f}ms" if ttfa is not None else "-", ctx.audio_s,
                    f" class={ctx.priority}" if ctx.endpoint is not None else "",
                    f" cache={ctx.cache}" if ctx.cache is not None else "",
                    f" stages={ctx.timings.text()}" if ctx.timings is not None else "",
                    f" held={ctx.held_s * 1000:.0f}ms" if ctx.held_s > 0 else "",
                    "" if status["completed"] else " aborted",
                )
