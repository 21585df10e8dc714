"""Turn a synthesis request into an HTTP response: whole file or a chunked stream.

Shared by every surface (native, OpenAI, upstream-compatible). The pool admits
the request (or raises 503 at once); we wait for the first chunk before sending
headers, so errors before the first byte get a proper status; after it, an
error aborts the stream (logged and counted) and the client sees a truncated
chunked body. The slot is released when the engine's thread has returned, on
every path: done, error, client gone.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from app.audio.encode import make_encoder
from app.engines.base import SynthesisRequest

log = logging.getLogger("cosyserve.api")


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


def _note(request: Request, **values: Any) -> None:
    request.scope.setdefault("cosyserve", {}).update(values)


async def synthesize_response(
    request: Request,
    pool: Any,
    sreq: SynthesisRequest,
    *,
    fmt: str,
    stream: bool,
    out_rate: int | None = None,
    extra_headers: dict[str, str] | None = None,
    chunk_sink: Callable[[bytes, bool], bytes] | None = None,
    media_type: str | None = None,
) -> Response:
    """Run ``sreq`` on the pool and answer with audio in ``fmt``.

    ``chunk_sink(data, final)`` lets a surface re-frame encoded bytes (OpenAI SSE).
    """
    sreq.request_id = sreq.request_id or request.scope.get("cosyserve", {}).get("request_id", "")
    job = await pool.synthesize(sreq, ticket=request.scope.get("cosyserve", {}).pop("ticket", None))
    try:
        first = await job.first_chunk()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await job.aclose()
        raise
    rate = first.sample_rate if first is not None else pool.engine_info().sample_rate
    encoder = make_encoder(fmt, rate, stream=stream, out_rate=out_rate)
    _note(request, ttfa_s=job.time_to_first_chunk_s, queue_wait_s=job.queue_wait_s)
    headers = {"X-Sample-Rate": str(encoder.sample_rate), "Cache-Control": "no-store"}
    headers.update(extra_headers or {})
    sink = chunk_sink or (lambda data, final: data)

    if not stream:
        try:
            parts, audio_s = [], 0.0
            async for chunk in job:  # starts with the first chunk again
                parts.append(encoder.feed(chunk.pcm))
                audio_s += chunk.duration_s
            parts.append(encoder.finish())
        finally:
            encoder.close()
            with anyio.CancelScope(shield=True):
                await job.aclose()
        _note(request, audio_s=audio_s)
        body = sink(b"".join(parts), True)
        return Response(body, media_type=media_type or encoder.content_type, headers=headers)

    async def body() -> AsyncIterator[bytes]:
        audio_s = 0.0
        try:
            async for chunk in job:  # starts with the first chunk again
                audio_s += chunk.duration_s
                data = encoder.feed(chunk.pcm)
                if data:
                    yield sink(data, False)
            _note(request, audio_s=audio_s)  # a sink's final call may read it (OpenAI SSE usage)
            yield sink(encoder.finish(), True)
        except Exception as exc:
            _note(request, stream_error=type(exc).__name__)
            log.error("stream %s aborted after the first byte: %s", sreq.request_id, type(exc).__name__, exc_info=exc)
            raise
        finally:
            encoder.close()
            _note(request, audio_s=audio_s)

    return JobStreamingResponse(body(), on_close=job.aclose, media_type=media_type or encoder.content_type, headers=headers)
