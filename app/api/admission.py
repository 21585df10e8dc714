"""The edge: bodies read before any permit, 503 before any body, refusals paced under a storm.

Under overload most requests are refused, so a refusal must cost next to nothing,
and a permit must be held only by work that computes. This plain ASGI middleware
runs before FastAPI's routing, dependencies or body parsing:

1. A synthesis request (the route table's) that the pool would refuse now gets its
   503 envelope at once (``Gate.check``, with the traffic class the
   ``X-Priority`` header or the API key names, else None: refused only if no class would
   admit it), before a byte of its body is read.
2. A request with a body (any route: synthesis, voice registration) has it read
   whole by the :class:`~app.api.bodies.BodyGate`: a declared length over the limit
   is a 413 before reading, a chunked body is cut at the limit, the body must
   arrive within ``server.body_timeout_s`` (408), and only so many bodies are read
   at once. No permit is held meanwhile: a dribbling client holds a body-read place.
3. A synthesis request then finds its class (the body's ``priority`` field, sniffed from
   the bytes read, wins over the header and the key's default; ``app/api/priority.py``)
   and takes its permit (``pool.gate.admit(class, client)``: interactive may still be
   refused if the load changed while its body arrived; bulk waits its turn in the bulk
   queue, fair between clients, the API key's id or else the address, and a client that
   disconnects meanwhile leaves the queue at once: 499) and carries it in its
   ``RequestContext`` until the speech service takes it; the handler reads the
   body from a replay. A request refused while parsing or planning gives the
   permit back here when its response ends.

Every error answer (status 400 and up, from here or from a handler) goes through
the :class:`~app.api.refusals.RefusalPacer`: at once up to ``server.refusals_per_s``,
held beyond it, so a storm of clients that retry without backoff (after a 503, or
resending a request that is refused, such as a 1 MB field) costs a bounded number
of refusals a second. A request's permit is given back before its error is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from app.api.bodies import BodyGate, ClientLeft, declared_length, has_body, replay
from app.api.cached import defers_admission, reads_before_check
from app.api.context import CLIENT_LEFT, context_of
from app.api.errors import classify, render_scope
from app.api.priority import body_priority, client_of, header_priority
from app.api.refusals import RefusalPacer
from app.api.routes import match
from app.serving.admission import Ticket
from app.serving.admission.classes import Priority, parse_priority
from app.serving.answers import AnswerCache
from app.serving.errors import ClientGone, PayloadTooLarge, RequestError, ServingError
from app.serving.pool import EnginePool

# A refused body up to this size (declared) is left to the HTTP parser, which reads past it and keeps the
# connection: closing a socket with unread bytes makes the kernel send a reset, which can destroy the 413 before
# the client reads it. A larger or chunked one is not worth reading: the connection is closed.
DRAIN_MAX_BYTES = 16 << 20


async def _left(receive: Callable) -> None:
    """Returns when the client disconnects (its body, if any, was read already: nothing else comes first)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_left(admitting: Awaitable[Ticket], leaving: Awaitable[Any]) -> Ticket:
    """The permit, or ClientLeft if the client disconnects first (the wait is cancelled: its queue place freed)."""
    admit, left = asyncio.ensure_future(admitting), asyncio.ensure_future(leaving)
    try:
        await asyncio.wait({admit, left}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request was cancelled: a permit granted just now goes back
        left.cancel()
        admit.cancel()
        if admit.done() and not admit.cancelled() and admit.exception() is None:
            admit.result().release()
        raise
    left.cancel()
    if admit.done():
        return admit.result()  # the permit, or the pool's refusal
    admit.cancel()
    raise ClientLeft


class AdmissionMiddleware:
    def __init__(self, app: Callable, pool: Callable[[], EnginePool | None], bodies: BodyGate,
                 pacer: RefusalPacer, cache: Callable[[], AnswerCache | None] = lambda: None) -> None:
        self.app = app
        self.pool = pool  # None until the lifespan built the runtime (app.runtime.running)
        self.bodies = bodies
        self.pacer = pacer
        self.cache = cache  # the answer cache (app/api/cached.py): may answer before a permit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        pacer, downstream = self.pacer, send

        async def paced(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                if ctx.ticket is not None and ctx.ticket.held:
                    ctx.ticket.release()  # the request failed: its permit is free before its answer waits
                ctx.held_s = await pacer.pace()
            await downstream(message)

        send = paced
        route = match(scope)
        pool = self.pool() if route is not None else None
        body = has_body(scope)
        if pool is None and not body:
            await self.app(scope, receive, send)
            return
        if route is not None:
            ctx.endpoint = route.path
        try:
            known = (header_priority(scope) or ctx.key_priority) if pool is not None else None
            cache = self.cache() if pool is not None else None
            if pool is not None and not reads_before_check(scope, cache):
                pool.gate.check(parse_priority(known) if known else None)  # refused now: no body read
            raw = await self.bodies.read(scope, receive) if body else b""
            connection = receive
            if body:
                receive = replay(raw, receive)
            if pool is not None:
                priority = body_priority(scope, raw) or parse_priority(known or Priority.INTERACTIVE)
                ctx.priority = priority.value
                client = client_of(scope, ctx.key_id)

                async def admit(gone: asyncio.Event | None, leaving: Awaitable[Any] | None = None) -> Ticket:
                    admitting = pool.gate.admit(priority, client)
                    if priority is not Priority.BULK or (leaving is None and gone is None):
                        return await admitting
                    # it may wait long: a client that leaves meanwhile gives its place up
                    if leaving is not None:
                        return await _unless_left(admitting, leaving)
                    try:
                        return await _unless_left(admitting, gone.wait())
                    except ClientLeft:
                        raise ClientGone("the client closed the connection while its request waited") from None

                if defers_admission(scope, raw, cache):
                    ctx.admit = admit  # the handler admits after its answer-cache lookup
                else:
                    if priority is Priority.BULK:
                        receive = replay(raw, connection)
                    ctx.ticket = await admit(None, _left(connection) if priority is Priority.BULK else None)
        except ClientLeft:
            ctx.error_code = CLIENT_LEFT  # nobody to answer: logged and counted as the client's leaving (499)
            return
        except (ServingError, RequestError) as exc:
            await self._refuse(scope, receive, send, exc)
            return
        if pool is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            ticket, ctx.ticket, ctx.admit = ctx.ticket, None, None
            if ticket is not None and ticket.held:
                ticket.release()  # the service took it (moved: nothing to do), or nobody used it

    async def _refuse(self, scope: dict, receive: Callable, send: Callable, exc: BaseException) -> None:
        info = classify(exc)
        headers: dict[str, Any] = {}
        if isinstance(exc, PayloadTooLarge):
            declared = declared_length(scope)
            if declared is None or declared > DRAIN_MAX_BYTES:
                headers["Connection"] = "close"  # the rest of the body is not read: the connection cannot be reused
        response = render_scope(scope, info, headers)  # sent through ``paced``
        await response(scope, receive, send)
