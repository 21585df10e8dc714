"""Upstream-compatible API: CosyVoice's ``runtime/python/fastapi/server.py`` endpoints.

Existing clients of upstream's example server work unchanged: the same paths, the
same form fields, GET or POST with a form body (upstream's client sends
``requests.request("GET", url, data=payload, files=files, stream=True)``), and the
same response: raw int16 little-endian mono PCM at the model's native rate
(``X-Sample-Rate`` says which), streamed as the model produces it. Fields may
also come as a query string (``GET /inference_sft?tts_text=...&spk_id=...``).

Unlike upstream, requests go through the pool (503 when full, refused while
draining) and errors use the native envelope. Like upstream, the model runs in
non-streaming mode: one chunk per sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import UploadFile
from starlette.responses import Response

from app.api.deps import PoolDep, RuntimeDep
from app.api.errors import ApiError
from app.api.respond import synthesize_response
from app.api.tts import resolve_voice
from app.api.uploads import is_form, read_audio, read_body
from app.engines.base import PromptAudio, SynthesisRequest
from app.runtime import Runtime

router = APIRouter(tags=["upstream-compatible"])
MEDIA_TYPE = "application/octet-stream"

F = TypeVar("F", bound=BaseModel)
H = TypeVar("H", bound=Callable[..., Any])


def upstream(path: str, summary: str) -> Callable[[H], H]:
    """Route ``path`` for GET and POST (one operation id each, for a clean OpenAPI schema)."""

    def register(handler: H) -> H:
        for method in ("GET", "POST"):
            router.add_api_route(path, handler, methods=[method], summary=summary,
                                 operation_id=f"upstream_{handler.__name__}_{method.lower()}")
        return handler

    return register


class _Form(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tts_text: str


class SftForm(_Form):
    spk_id: str


class ZeroShotForm(_Form):
    prompt_text: str


class InstructForm(_Form):
    spk_id: str
    instruct_text: str


class Instruct2Form(_Form):
    instruct_text: str


async def read_form(request: Request, runtime: Runtime, model: type[F]) -> tuple[F, dict[str, UploadFile]]:
    """Form body (multipart or urlencoded) on any method; else the query string."""
    if is_form(request):
        return await read_body(request, model, max_upload_bytes(runtime))
    try:
        return model.model_validate(dict(request.query_params)), {}
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from exc


def max_upload_bytes(runtime: Runtime) -> int:
    return int(runtime.settings.server.max_upload_mb * 1024 * 1024)


async def prompt_wav(runtime: Runtime, files: dict[str, UploadFile]) -> PromptAudio:
    audio = await read_audio(files.get("prompt_wav"), "prompt_wav", max_upload_bytes(runtime))
    if audio is None:
        raise ApiError(422, "validation_error", "prompt_wav: Field required (upload the prompt audio as a file)",
                       param="prompt_wav")
    return audio


def check_text(runtime: Runtime, text: str) -> None:
    limit = runtime.settings.server.max_text_chars
    if len(text) > limit:
        raise ApiError(400, "text_too_long", f"tts_text is {len(text)} characters; the limit is {limit}",
                       param="tts_text")


async def respond(request: Request, pool: Any, sreq: SynthesisRequest) -> Response:
    return await synthesize_response(request, pool, sreq, fmt="pcm", stream=True, media_type=MEDIA_TYPE)


def with_speaker(runtime: Runtime, pool: Any, spk_id: str, mode: str, voice_mode: str, **fields: Any) -> SynthesisRequest:
    """A preset speaker runs ``mode``; a registered library voice runs ``voice_mode`` instead."""
    picked = resolve_voice(runtime, pool, spk_id.strip())
    if "voice" in picked:
        return SynthesisRequest(mode=voice_mode, voice=picked["voice"], **fields)
    return SynthesisRequest(mode=mode, speaker=picked.get("speaker"), **fields)


@upstream("/inference_sft", summary="Upstream: preset speaker")
async def inference_sft(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    form, _ = await read_form(request, runtime, SftForm)
    check_text(runtime, form.tts_text)
    sreq = with_speaker(runtime, pool, form.spk_id, "sft", "zero_shot", text=form.tts_text)
    return await respond(request, pool, sreq)


@upstream("/inference_zero_shot", summary="Upstream: zero-shot voice cloning")
async def inference_zero_shot(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    form, files = await read_form(request, runtime, ZeroShotForm)
    check_text(runtime, form.tts_text)
    audio = await prompt_wav(runtime, files)
    sreq = SynthesisRequest(text=form.tts_text, mode="zero_shot", prompt_text=form.prompt_text, prompt_audio=audio)
    return await respond(request, pool, sreq)


@upstream("/inference_cross_lingual", summary="Upstream: cross-lingual cloning")
async def inference_cross_lingual(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    form, files = await read_form(request, runtime, _Form)
    check_text(runtime, form.tts_text)
    audio = await prompt_wav(runtime, files)
    sreq = SynthesisRequest(text=form.tts_text, mode="cross_lingual", prompt_audio=audio)
    return await respond(request, pool, sreq)


@upstream("/inference_instruct", summary="Upstream: preset speaker with instruction")
async def inference_instruct(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    form, _ = await read_form(request, runtime, InstructForm)
    check_text(runtime, form.tts_text)
    sreq = with_speaker(runtime, pool, form.spk_id, "instruct", "instruct2", text=form.tts_text,
                        instruct_text=form.instruct_text)
    return await respond(request, pool, sreq)


@upstream("/inference_instruct2", summary="Upstream: prompt voice with instruction")
async def inference_instruct2(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    form, files = await read_form(request, runtime, Instruct2Form)
    check_text(runtime, form.tts_text)
    audio = await prompt_wav(runtime, files)
    sreq = SynthesisRequest(text=form.tts_text, mode="instruct2", instruct_text=form.instruct_text,
                            prompt_audio=audio)
    return await respond(request, pool, sreq)
