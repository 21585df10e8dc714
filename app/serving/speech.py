"""SpeechService: the one request path behind every speech surface.

    plan = service.plan(fields)                       # fields -> SynthesisRequest (no I/O)
    out = service.output("mp3", stream=True)          # format + rate, checked up front
    result = await service.run(plan, out, ticket=..., gone=event)
    # result.media_type, result.sample_rate, result.body (async bytes) or result.data

``run`` admits (unless the edge already did and hands its ticket over), charges
the ticket with the request's size (``request_size``: adaptive admission weighs
requests by it), hands the ticket to the pool, which waits FIFO for a slot and runs the engine with the
encoder in the slot's thread (see ``app/serving/encoded.py``), and waits for the
first piece before returning, so errors before the first byte still get a
status. ``gone`` is set by the HTTP layer when the client hangs up: a request
still queued leaves the queue at once (its permit is released, no engine work is
done); a whole-file request that is running is cancelled (the engine's cancel
flag, so within one chunk); a stream is cancelled by its response when the
client leaves. On every path the job is closed, which frees the slot once its
thread has returned and then the permit (the job releases it).

``EngineInfo`` and the preset speakers are the pool's: read once, in a slot
thread, when the engines loaded; nothing here calls the engine on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from app.audio.encode import make_encoder
from app.engines.base import EngineInfo, SynthesisRequest
from app.engines.timings import StageTimings
from app.serving.admission import Ticket
from app.serving.bounds import SpeechLimits
from app.serving.encoded import EncoderFactory, OutputSpec, Piece, pieces
from app.serving.errors import ClientGone
from app.serving.job import Job
from app.serving.plan import Plan, SpeechFields, plan
from app.serving.pool import EnginePool

log = logging.getLogger("cosyserve.speech")

# A request's size for admission: its text characters plus this, so that a fixed cost per request (the
# frontend, the first chunk's padding, the HTTP round trip) keeps "hello" from weighing almost nothing.
OVERHEAD_CHARS = 20

# How long an answer waits for a cancelled job's slot thread to return. A healthy engine
# returns within one chunk; one that ignores its cancel flag is left to release its slot
# when it does return (and is reported as stuck by the pool past its deadline + grace).
CLOSE_WAIT_S = 2.0


@dataclass
class SpeechResult:
    """The answer to one synthesis: whole bytes (``data``) or a stream (``body``)."""

    media_type: str
    sample_rate: int
    data: bytes | None = None
    body: AsyncIterator[bytes] | None = None
    ttfa_s: float | None = None
    queue_wait_s: float = 0.0
    job: Job | None = field(default=None, repr=False)
    timings: StageTimings | None = field(default=None, repr=False)  # seconds per stage, filled as the job runs
    stored_audio_s: float = 0.0  # an answer from the cache (no job): its audio seconds

    @property
    def audio_s(self) -> float:
        return self.job.audio_s if self.job is not None else self.stored_audio_s

    async def aclose(self) -> None:
        """Cancel (if still running) and wait for the slot thread; idempotent (``Job.aclose``)."""
        if self.job is not None:
            await self.job.aclose(wait_s=CLOSE_WAIT_S)


class SpeechService:
    def __init__(self, pool: EnginePool, limits: SpeechLimits, library: Any | None = None,
                 encoder_factory: EncoderFactory | None = None) -> None:
        self.pool = pool
        self.limits = limits
        self.library = library  # VoiceLibrary (names(), features(name, family)) or None
        self.info: EngineInfo = pool.info  # read once, in a slot thread, when the pool loaded
        self.presets: tuple[str, ...] = pool.presets
        self._make_encoder: EncoderFactory = encoder_factory or make_encoder

    # -- planning (no I/O) ---------------------------------------------------------------------
    def voice_names(self) -> list[str]:
        return self.library.names() if self.library is not None else []

    def plan(self, fields: SpeechFields, request_id: str = "") -> Plan:
        found: dict[str, str] = {}

        def library_voice(name: str) -> Any | None:
            if self.library is None:
                return None
            features, found["id"] = self.library.features_and_id(name, self.info.voice_family)
            return features

        p = plan(fields, self.info, self.presets, self.limits, library_voice, self.voice_names)
        p.request.request_id = request_id
        return replace(p, voice_id=found.get("id")) if p.request.voice is not None else p

    def output(self, fmt: str, stream: bool, sample_rate: int | None = None) -> OutputSpec:
        return OutputSpec.build(fmt, stream, self.info.sample_rate, sample_rate)

    # -- running ---------------------------------------------------------------------------------
    async def run(self, plan: Plan, out: OutputSpec, *, ticket: Ticket,
                  gone: asyncio.Event | None = None) -> SpeechResult:
        """Run on the permit the edge took (``ticket``, taken here), encode; ClientGone if ``gone`` fires first."""
        ticket = ticket.take()
        size = request_size(plan.request)
        if plan.request.text_stream is not None:  # text arriving over time: a long job, no latency sample
            ticket.open_ended()
        elif size is None:
            ticket.exclude()
        else:
            ticket.charge(size)
        task = asyncio.ensure_future(self._start(plan, out, ticket))
        try:
            if gone is None:
                return await task
            return await _unless_gone(task, gone)
        finally:
            # The task takes the ticket as it starts; one cancelled before its first step never
            # did, and this (then still holding) handle gives the permit back.
            task.add_done_callback(lambda _: ticket.release())

    async def _start(self, plan: Plan, out: OutputSpec, ticket: Ticket) -> SpeechResult:
        transform = partial(pieces, out=out, native_rate=self.info.sample_rate, make=self._make_encoder,
                            timings=plan.request.timings)
        job = await self.pool.run(ticket, plan.request, transform=transform)  # takes the ticket
        result = SpeechResult(out.content_type, out.sample_rate, queue_wait_s=job.queue_wait_s, job=job,
                              timings=plan.request.timings)
        try:
            first, rest = await job.first_chunk()
            if out.stream:
                result.ttfa_s = job.time_to_first_chunk_s
                result.body = _body(first, rest)
                return result
            parts = [first.data] if first is not None else []
            async for piece in rest:
                parts.append(piece.data)
            result.ttfa_s = job.time_to_first_chunk_s
            result.data = b"".join(parts)
        except BaseException:
            await result.aclose()
            raise
        await result.aclose()
        return result


def request_size(req: SynthesisRequest) -> float | None:
    """Its size for admission: every character the engine will process (the text to speak, the prompt's
    transcript and the instruction, each read by the LLM) + OVERHEAD_CHARS; None when it is not known up
    front (text arriving over time, voice conversion of uploaded speech)."""
    if req.text_stream is not None or req.mode == "vc":
        return None
    return len(req.text or "") + len(req.prompt_text or "") + len(req.instruct_text or "") + OVERHEAD_CHARS


async def _body(first: Piece | None, rest: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
    """The stream's bytes, the first piece's first; empty pieces are skipped."""
    if first is not None and first.data:
        yield first.data
    async for piece in rest:
        if piece.data:
            yield piece.data


async def _unless_gone(task: asyncio.Future[SpeechResult], gone: asyncio.Event) -> SpeechResult:
    """``task``'s result, unless ``gone`` is set first: then cancel it and raise ClientGone."""
    waiter = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        waiter.cancel()
        await _settle(task)
        raise
    waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()  # queued: leaves the queue; running: its job is closed (cancel flag set)
    await _settle(task)
    raise ClientGone("the client closed the connection; its request was dropped")


async def _settle(task: asyncio.Future[SpeechResult]) -> None:
    """Wait for a cancelled task to end; a result that raced the cancel is closed, not leaked."""
    await asyncio.wait({task})
    if task.cancelled():
        return
    if task.exception() is None:
        await task.result().aclose()
