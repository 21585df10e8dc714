"""The typed request context: what one request's modules tell each other.

``RequestContextMiddleware`` creates it (request id, timing); admission adds the
synthesis route and the permit; the speech response adds time to first audio,
queue wait, audio seconds and the per-stage timings; the error handlers add the error code. The access
log and the metrics read it once the response is done. One object, one key in
the ASGI scope, typed fields: nothing else writes request state into the scope.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.engines.timings import StageTimings
from app.serving.admission import PermitError, Ticket

SCOPE_KEY = "cosyserve.context"
CLIENT_LEFT = "client_closed_request"  # the error code of a request whose client left before any answer

_VALID_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id(incoming: str | None) -> str:
    """The client's ``X-Request-ID`` when it is safe to echo and log (1-128 of ``A-Za-z0-9._:-``), else a new one.

    The one rule for HTTP requests (``RequestContextMiddleware``) and WebSocket sessions.
    """
    return incoming if incoming and _VALID_ID.match(incoming) else uuid.uuid4().hex


@dataclass
class RequestContext:
    request_id: str = ""
    endpoint: str | None = None  # the synthesis route template (a metrics label); None for other routes
    ticket: Ticket | None = None  # the admission permit taken at the edge, until the service takes it
    queue_wait_s: float | None = None
    ttfa_s: float | None = None
    audio_s: float = 0.0
    error_code: str | None = None
    stream_error: str | None = None  # an error after the first byte (exception type name)
    status: int = 0
    latency_s: float | None = None
    completed: bool = False  # the last body byte was sent
    timings: StageTimings | None = None  # seconds per stage (frontend, llm, flow, hift, encode)
    held_s: float = 0.0  # an error answer held by the refusal pacer (server.refusals_per_s) before it was sent
    priority: str = "interactive"  # the traffic class (app/api/priority.py), set by admission
    key_id: str | None = None  # the API key's id (a short hash, never the key), set by the key check
    key_priority: str | None = None  # that key's default class (the keys file's ``priority=``), if any
    # the edge left admission to the handler (after its answer-cache lookup, app/api/cached.py): how to take it
    admit: Callable[[asyncio.Event | None], Awaitable[Ticket]] | None = None
    cache: str | None = None  # "hit" or "miss": the answer cache was asked (X-Cache, the access log)

    async def admitted(self, gone: asyncio.Event | None = None) -> Ticket:
        """The request's permit, moved to the caller: the edge's, or taken now if the edge left it to the
        handler (refused like at the edge: 503; ClientGone if ``gone`` fires while a bulk request waits)."""
        if self.ticket is None and self.admit is not None:
            admit, self.admit = self.admit, None
            self.ticket = await admit(gone)
        return self.take_ticket()

    def take_ticket(self) -> Ticket:
        """Move the edge's permit to the caller (the speech service); PermitError if the edge took none."""
        ticket = self.ticket
        if ticket is None or not ticket.held:
            raise PermitError("no synthesis permit: the edge admits every synthesis route (app/api/admission.py)")
        return ticket.take()


def context_of(scope: dict[str, Any]) -> RequestContext:
    """The request's context (created empty if the middleware did not run, e.g. in a unit test)."""
    ctx = scope.get(SCOPE_KEY)
    if ctx is None:
        ctx = scope[SCOPE_KEY] = RequestContext()
    return ctx
