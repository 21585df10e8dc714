"""A ``SpeechResult`` as an HTTP response: a whole file, or a chunked stream.

After the first byte a stream cannot change its status: an error then aborts it
(logged, counted, the client sees a truncated chunked body). The job is closed
(shielded) when the response ends, on every path: done, error, client gone.

A stream's client that reads nothing for ``server.send_timeout_s`` (one write
waits that long for the socket to take bytes) is disconnected: its job is
closed, its buffered audio dropped. Its permit went back when synthesis ended
(``app/serving/job.py``); this bounds how long its connection and buffer stay.
A listener at real time reads continuously and is never cut off.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app.api.cached import directives, fill, hit_result
from app.api.context import RequestContext
from app.api.disconnect import watch_disconnect
from app.serving.answers import Answer, AnswerCache
from app.serving.answers.cache import Flight
from app.serving.encoded import OutputSpec
from app.serving.plan import Plan
from app.serving.speech import SpeechResult, SpeechService

log = logging.getLogger("cosyserve.api")

# Re-frames encoded bytes for a surface (OpenAI SSE): sink(data, final) -> bytes to send.
Sink = Callable[[bytes, bool], bytes]


# Set when a response was cut on purpose (a stalled client): uvicorn's "returned without completing
# response" line for it is ours, already logged at info, not an application error.
_CUT_ON_PURPOSE: contextvars.ContextVar[bool] = contextvars.ContextVar("cosyserve_cut_on_purpose", default=False)
_UVICORN_INCOMPLETE = "ASGI callable returned without completing response."


class ClientStalled(Exception):
    """The client took nothing for ``send_timeout_s``: the stream is cut."""


class QuietCutFilter(logging.Filter):
    """Drops uvicorn's error line for a response this server cut on purpose (installed on uvicorn.error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_CUT_ON_PURPOSE.get() and record.msg == _UVICORN_INCOMPLETE)


def install_quiet_cut() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietCutFilter) for f in logger.filters):
        logger.addFilter(QuietCutFilter())


class JobStreamingResponse(StreamingResponse):
    """A StreamingResponse that always runs ``on_close`` (shielded) when the response ends, and cuts a
    client that reads nothing for ``send_timeout_s`` (0: never), noting it in the request's ``ctx``."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                 send_timeout_s: float = 0.0, on_stalled: Callable[[], None] | None = None,
                 ctx: RequestContext | None = None, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._ctx = ctx if ctx is not None else RequestContext()
        self._on_close = on_close
        self._send_timeout_s = send_timeout_s
        self._on_stalled = on_stalled

    async def stream_response(self, send: Any) -> None:
        timeout = self._send_timeout_s
        if timeout <= 0:
            await super().stream_response(send)
            return

        async def timed(message: Any) -> None:
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                raise ClientStalled() from None

        await super().stream_response(timed)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientStalled:
            ctx = self._ctx
            ctx.stream_error = "ClientStalled"
            log.info("stream %s: the client read nothing for %g s (server.send_timeout_s); connection closed",
                     ctx.request_id, self._send_timeout_s)
            if self._on_stalled is not None:
                self._on_stalled()
            _CUT_ON_PURPOSE.set(True)  # uvicorn closes the connection; its line about it is ours
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


def speech_response(ctx: RequestContext, result: SpeechResult, *, media_type: str | None = None,
                    headers: dict[str, str] | None = None, sink: Sink | None = None,
                    send_timeout_s: float = 0.0, on_stalled: Callable[[], None] | None = None) -> Response:
    ctx.ttfa_s, ctx.queue_wait_s, ctx.timings = result.ttfa_s, result.queue_wait_s, result.timings
    all_headers = {"X-Sample-Rate": str(result.sample_rate), "X-Priority": ctx.priority, "Cache-Control": "no-store",
                   **(headers or {})}
    media_type = media_type or result.media_type
    if result.data is not None:
        ctx.audio_s = result.audio_s
        body = sink(result.data, True) if sink is not None else result.data
        return Response(body, media_type=media_type, headers=all_headers)
    assert result.body is not None
    return JobStreamingResponse(_framed(result, ctx, sink), on_close=result.aclose, media_type=media_type,
                                headers=all_headers, send_timeout_s=send_timeout_s, on_stalled=on_stalled, ctx=ctx)


async def _framed(result: SpeechResult, ctx: RequestContext, sink: Sink | None) -> AsyncIterator[bytes]:
    assert result.body is not None
    try:
        async for data in result.body:
            ctx.audio_s = result.audio_s
            yield sink(data, False) if sink is not None else data
        ctx.audio_s = result.audio_s  # a sink's final call may read it (OpenAI SSE usage)
        if sink is not None:
            yield sink(b"", True)
    except Exception as exc:
        ctx.stream_error = type(exc).__name__
        log.error("stream %s aborted after the first byte: %s", ctx.request_id, type(exc).__name__, exc_info=exc)
        raise
    finally:
        ctx.audio_s = result.audio_s


async def synthesize(request: Request, ctx: RequestContext, speech: SpeechService, plan: Plan,
                     out: OutputSpec, *, media_type: str | None = None, headers: dict[str, str] | None = None,
                     sink: Sink | None = None) -> Response:
    """Run ``plan`` (with the edge's permit, or one taken here after an answer-cache miss), watching for
    the client leaving, and answer; a reproducible answer comes from, or goes to, the cache. ``ctx`` is
    the request's context, handed down by its handler."""
    runtime = request.state.runtime
    cache: AnswerCache | None = runtime.answers
    refresh, bypass = directives(request.scope)
    key = None if cache is None or bypass else cache.key(plan.request, plan.voice_id, out, ctx.key_id)
    flight: Flight | None = None
    async with watch_disconnect(request) as gone:
        if key is not None:
            assert cache is not None
            found = await cache.fetch(key, refresh=refresh, gone=gone)
            if isinstance(found, Answer):
                if ctx.ticket is not None and ctx.ticket.held:
                    ctx.ticket.release()  # a multipart request admitted at the edge: not needed
                ctx.cache = "hit"
                return speech_response(ctx, hit_result(found, out.stream), media_type=media_type,
                                       headers={**(headers or {}), "X-Cache": "hit"}, sink=sink)
            flight, ctx.cache = found, "miss"
            headers = {**(headers or {}), "X-Cache": "miss"}
        try:
            result = await speech.run(plan, out, ticket=await ctx.admitted(gone), gone=gone)
        except BaseException:
            if flight is not None:
                flight.end(False)
            raise
    if flight is not None:
        fill(result, flight)
    try:
        return speech_response(ctx, result, media_type=media_type, headers=headers, sink=sink,
                               send_timeout_s=runtime.settings.server.send_timeout_s,
                               on_stalled=speech.pool.stream_budget.note_stalled)
    except BaseException:
        await result.aclose()
        raise
