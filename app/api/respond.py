"""A ``SpeechResult`` as an HTTP response: a whole file, or a chunked stream.

After the first byte a stream cannot change its status: an error then aborts it
(logged, counted, the client sees a truncated chunked body). The job is closed
(shielded) when the response ends, on every path: done, error, client gone.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app.api.context import RequestContext, context_of
from app.api.disconnect import watch_disconnect
from app.serving.encoded import OutputSpec
from app.serving.plan import Plan
from app.serving.speech import SpeechResult, SpeechService

log = logging.getLogger("cosyserve.api")

# Re-frames encoded bytes for a surface (OpenAI SSE): sink(data, final) -> bytes to send.
Sink = Callable[[bytes, bool], bytes]


class JobStreamingResponse(StreamingResponse):
    """A StreamingResponse that always runs ``on_close`` (shielded) when the response ends."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


def speech_response(request: Request, result: SpeechResult, *, media_type: str | None = None,
                    headers: dict[str, str] | None = None, sink: Sink | None = None) -> Response:
    ctx = context_of(request.scope)
    ctx.ttfa_s, ctx.queue_wait_s, ctx.timings = result.ttfa_s, result.queue_wait_s, result.timings
    all_headers = {"X-Sample-Rate": str(result.sample_rate), "Cache-Control": "no-store", **(headers or {})}
    media_type = media_type or result.media_type
    if result.data is not None:
        ctx.audio_s = result.audio_s
        body = sink(result.data, True) if sink is not None else result.data
        return Response(body, media_type=media_type, headers=all_headers)
    assert result.body is not None
    return JobStreamingResponse(_framed(result, ctx, sink), on_close=result.aclose, media_type=media_type,
                                headers=all_headers)


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


async def synthesize(request: Request, speech: SpeechService, plan: Plan, out: OutputSpec, *,
                     media_type: str | None = None, headers: dict[str, str] | None = None,
                     sink: Sink | None = None) -> Response:
    """Run ``plan`` (with the edge's permit), watching for the client leaving, and answer."""
    ctx = context_of(request.scope)
    async with watch_disconnect(request) as gone:
        result = await speech.run(plan, out, ticket=ctx.take_ticket(), gone=gone)
    try:
        return speech_response(request, result, media_type=media_type, headers=headers, sink=sink)
    except BaseException:
        await result.aclose()
        raise
