"""Native API: ``POST /v1/tts`` and ``GET /v1/speakers``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.api.deps import ContextDep, SpeechDep
from app.api.openapi import errors
from app.api.respond import synthesize
from app.api.route_docs import TTS_DOC
from app.api.routes import register
from app.api.schemas import SpeakersResponse, TTSRequest
from app.api.uploads import close_uploads, read_audio, read_body
from app.serving.plan import SpeechFields

router = APIRouter(tags=["native"], dependencies=[Depends(close_uploads)])


@register(router, "tts", **TTS_DOC)
async def tts(request: Request, speech: SpeechDep, ctx: ContextDep) -> Response:
    body, files = await read_body(request, ctx, TTSRequest, speech.limits)
    limit = speech.limits.max_upload_bytes
    prompt = await read_audio(ctx, files.get("prompt_audio") or files.get("prompt_wav"), "prompt_audio", limit)
    source = await read_audio(ctx, files.get("source_audio") or files.get("source_wav"), "source_audio", limit)
    fields = SpeechFields(text=body.text, mode=body.mode, voice=body.voice or body.speaker,
                          instructions=body.instruct_text, prompt_text=body.prompt_text, prompt_audio=prompt,
                          source_audio=source, speed=body.speed, stream=body.stream, seed=body.seed,
                          normalize=body.normalize, first_chunk_tokens=body.first_chunk_tokens,
                          priority=ctx.priority)
    plan = speech.plan(fields, ctx.request_id)
    return await synthesize(request, ctx, speech, plan, speech.output(body.format, body.stream, body.sample_rate))


@router.get("/v1/speakers", response_model=SpeakersResponse, summary="Preset speakers, library voices, modes",
            responses=errors(503))
async def speakers(speech: SpeechDep) -> SpeakersResponse:
    info = speech.info
    return SpeakersResponse(speakers=list(speech.presets), voices=speech.voice_names(), model=info.name,
                            sample_rate=info.sample_rate, modes=list(info.modes))
