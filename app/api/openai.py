"""OpenAI-compatible API: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/audio/voices``.

Follows OpenAI's API reference for audio/speech, so the official SDKs and apps
that hard-code OpenAI voice names work against this server. Errors on these
routes render in OpenAI's error shape (see :mod:`app.api.errors`).

Mapping onto CosyVoice:

* ``model``: the served model's name or one of ``MODEL_ALIASES``; else 404.
* ``voice``: a library voice, a preset speaker, or an OpenAI built-in name mapped
  round-robin onto the presets (``OPENAI_VOICES``); ``{"id": ...}`` works too.
* ``instructions``: ``instruct2`` with a library voice, ``instruct`` with a preset
  speaker (CosyVoice-300M-Instruct), when the model supports that mode; otherwise
  ignored and the response says so in ``X-Instructions-Ignored: true``.
* The body is streamed as it is produced (``wav`` with the unknown-length header),
  except ``flac``, sent whole (see ``WHOLE_FORMATS``); ``pcm`` is 24 kHz 16-bit
  little-endian mono, as OpenAI documents. ``sse`` wraps the same bytes in events.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import PoolDep, RuntimeDep
from app.api.errors import ApiError
from app.api.openai_schemas import (
    MODEL_ALIASES,
    OPENAI_VOICES,
    ModelCard,
    ModelList,
    SpeechRequest,
    VoiceCard,
    VoiceList,
    check_speech,
)
from app.api.respond import synthesize_response
from app.api.sse import (
    SSE_HEADERS,
    SSE_MEDIA_TYPE,
    estimate_text_tokens,
    speech_sse_sink,
    speech_tokens_per_second,
)
from app.api.tts import resolve_voice
from app.api.uploads import read_body
from app.engines.base import SynthesisRequest
from app.runtime import Runtime

router = APIRouter(tags=["openai"])

PCM_RATE = 24000  # OpenAI's pcm: 24 kHz, 16-bit signed little-endian, mono
# Sent as one complete file rather than streamed: a streamed FLAC's STREAMINFO must say
# "length unknown", which libsndfile (python-soundfile, librosa) cannot read.
WHOLE_FORMATS = frozenset({"flac"})


def alias_speaker(name: str, presets: list[str]) -> str | None:
    """The preset an OpenAI built-in voice name speaks with, or None."""
    key = name.lower()
    if not presets or key not in OPENAI_VOICES:
        return None
    return presets[OPENAI_VOICES.index(key) % len(presets)]


def pick_voice(runtime: Runtime, pool: Any, name: str) -> dict[str, Any]:
    """Library voice or preset speaker (``resolve_voice``), else an OpenAI built-in alias."""
    try:
        return resolve_voice(runtime, pool, name)
    except ApiError as exc:
        speaker = alias_speaker(name, list(pool.voices()))
        if speaker is not None:
            return {"speaker": speaker}
        if name.lower() in OPENAI_VOICES:
            raise ApiError(exc.status, exc.code, f"{exc.message}; {name!r} is an OpenAI voice name, and this model "
                           "has no preset speakers to map it to", param=exc.param) from exc
        raise


def check_model(pool: Any, model: str) -> None:
    if model not in served_names(pool):
        raise ApiError(404, "model_not_found", f"the model {model!r} does not exist; this server serves "
                       f"{pool.engine_info().name!r} (aliases: {', '.join(MODEL_ALIASES)})", param="model")


def served_names(pool: Any) -> set[str]:
    return {pool.engine_info().name, *MODEL_ALIASES}


def speech_request(runtime: Runtime, pool: Any, body: SpeechRequest) -> tuple[SynthesisRequest, bool]:
    """The synthesis request for ``body``, and whether its instructions are ignored."""
    modes = pool.engine_info().modes
    picked = pick_voice(runtime, pool, body.voice_name)
    instructions = (body.instructions or "").strip() or None
    if "voice" in picked:
        mode = "instruct2" if instructions and "instruct2" in modes else "zero_shot"
    else:
        mode = "instruct" if instructions and "instruct" in modes else "sft"
    used = instructions if mode in ("instruct", "instruct2") else None
    sreq = SynthesisRequest(text=body.input, mode=mode, speaker=picked.get("speaker"), voice=picked.get("voice"),
                            instruct_text=used, speed=body.speed, stream=True)
    return sreq, bool(instructions) and used is None


@router.post("/v1/audio/speech", summary="Create speech (OpenAI-compatible)")
async def create_speech(request: Request, runtime: RuntimeDep, pool: PoolDep) -> Response:
    server = runtime.settings.server
    body, _ = await read_body(request, SpeechRequest, int(server.max_upload_mb * 1024 * 1024))
    check_speech(body, server.max_text_chars)
    check_model(pool, body.model)
    sreq, ignored = speech_request(runtime, pool, body)
    headers = {"X-Instructions-Ignored": "true"} if ignored else {}
    out_rate = PCM_RATE if body.response_format == "pcm" else None
    stream = body.response_format not in WHOLE_FORMATS
    if body.stream_format == "sse":
        info = pool.engine_info()
        sink = speech_sse_sink(estimate_text_tokens(body.input, sreq.instruct_text),
                               speech_tokens_per_second(info.family),
                               lambda: float(request.scope.get("cosyserve", {}).get("audio_s", 0.0)))
        return await synthesize_response(request, pool, sreq, fmt=body.response_format, stream=stream,
                                         out_rate=out_rate, extra_headers={**headers, **SSE_HEADERS},
                                         chunk_sink=sink, media_type=SSE_MEDIA_TYPE)
    return await synthesize_response(request, pool, sreq, fmt=body.response_format, stream=stream,
                                     out_rate=out_rate, extra_headers=headers)


def model_created(runtime: Runtime) -> int:
    """When this server first described its model (stable for the process's life)."""
    return runtime.extras.setdefault("model_created", int(time.time()))


@router.get("/v1/models", response_model=ModelList, summary="List models (OpenAI-compatible)")
async def list_models(runtime: RuntimeDep, pool: PoolDep) -> ModelList:
    return ModelList(data=[ModelCard(id=pool.engine_info().name, created=model_created(runtime))])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, summary="Retrieve a model (OpenAI-compatible)")
async def retrieve_model(model_id: str, runtime: RuntimeDep, pool: PoolDep) -> ModelCard:
    check_model(pool, model_id)
    return ModelCard(id=model_id, created=model_created(runtime))


@router.get("/v1/audio/voices", response_model=VoiceList, summary="List voices usable as 'voice'")
async def list_voices(runtime: RuntimeDep, pool: PoolDep) -> VoiceList:
    presets = list(pool.voices())
    library = runtime.voices.names() if runtime.voices is not None else []
    cards = [VoiceCard(id=n, type="preset") for n in presets]
    cards += [VoiceCard(id=n, type="library") for n in library]
    taken = set(presets) | set(library)
    cards += [VoiceCard(id=n, type="openai_alias", speaker=alias_speaker(n, presets))
              for n in OPENAI_VOICES if presets and n not in taken]
    return VoiceList(data=cards)
