"""Native API: ``POST /v1/tts`` and ``GET /v1/speakers``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import PoolDep, RuntimeDep
from app.api.errors import ApiError
from app.api.respond import synthesize_response
from app.api.schemas import SpeakersResponse, TTSRequest
from app.api.uploads import read_audio, read_body
from app.engines.base import SynthesisRequest
from app.runtime import Runtime

router = APIRouter(tags=["native"])


def library_voice(runtime: Runtime, name: str) -> Any | None:
    """Engine-ready features of a registered voice, or None if ``name`` is not one."""
    if runtime.voices is None:
        return None
    return runtime.voices.features(name, runtime.pool.engine_info().voice_family)


def resolve_voice(runtime: Runtime, pool: Any, name: str | None) -> dict[str, Any]:
    """Map a user-facing voice name to a preset speaker or a library voice."""
    if not name:
        return {}
    voice = library_voice(runtime, name)
    if voice is not None:
        return {"voice": voice}
    if name in pool.voices():
        return {"speaker": name}
    known = list(pool.voices()) + (runtime.voices.names() if runtime.voices is not None else [])
    raise ApiError(400, "unknown_voice", f"unknown voice {name!r}; known voices: {', '.join(known) or 'none'}", param="voice")


def default_mode(body: TTSRequest, has_prompt: bool, has_voice: bool, modes: tuple[str, ...]) -> str:
    if body.mode:
        return body.mode
    if has_prompt or has_voice:
        if body.instruct_text and "instruct2" in modes:
            return "instruct2"
        return "zero_shot" if (body.prompt_text or has_voice) else "cross_lingual"
    if body.instruct_text and "instruct" in modes:
        return "instruct"
    return "sft"


async def build_request(request: Request, runtime: Runtime, pool: Any, body: TTSRequest, files: dict) -> SynthesisRequest:
    max_bytes = int(runtime.settings.server.max_upload_mb * 1024 * 1024)
    if len(body.text) > runtime.settings.server.max_text_chars:
        raise ApiError(400, "text_too_long", f"text is {len(body.text)} characters; the limit is {runtime.settings.server.max_text_chars}", param="text")
    prompt = await read_audio(files.get("prompt_audio") or files.get("prompt_wav"), "prompt_audio", max_bytes)
    source = await read_audio(files.get("source_audio") or files.get("source_wav"), "source_audio", max_bytes)
    info = pool.engine_info()
    picked = resolve_voice(runtime, pool, body.voice or body.speaker)
    mode = default_mode(body, prompt is not None, "voice" in picked, info.modes)
    speaker = picked.get("speaker")
    if mode in ("sft", "instruct") and speaker is None and "voice" not in picked:
        presets = list(pool.voices())
        if not presets:
            raise ApiError(400, "voice_required", "this model has no preset speakers; send prompt audio or name a registered voice", param="voice")
        speaker = presets[0]
    if mode in ("sft", "instruct") and "voice" in picked:
        mode = "zero_shot"
    return SynthesisRequest(
        text=body.text, mode=mode, speaker=speaker, voice=picked.get("voice"), prompt_text=body.prompt_text,
        prompt_audio=prompt, instruct_text=body.instruct_text, source_audio=source, speed=body.speed, stream=body.stream,
    )


@router.post("/v1/tts", summary="Synthesise speech (JSON or multipart with prompt audio)")
async def tts(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    max_bytes = int(runtime.settings.server.max_upload_mb * 1024 * 1024)
    body, files = await read_body(request, TTSRequest, max_bytes)
    sreq = await build_request(request, runtime, pool, body, files)
    return await synthesize_response(request, pool, sreq, fmt=body.format, stream=body.stream, out_rate=body.sample_rate)


@router.get("/v1/speakers", response_model=SpeakersResponse)
async def speakers(runtime: RuntimeDep, pool: PoolDep) -> SpeakersResponse:
    info = pool.engine_info()
    return SpeakersResponse(
        speakers=list(pool.voices()),
        voices=runtime.voices.names() if runtime.voices is not None else [],
        model=info.name, sample_rate=info.sample_rate, modes=list(info.modes),
    )
