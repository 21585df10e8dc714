"""OpenAI-compatible API: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/audio/voices``, ``/v1/audio/models``.

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
  little-endian mono, as OpenAI documents; ``mulaw`` / ``alaw`` (raw) and ``wav_mulaw`` /
  ``wav_alaw`` are G.711 at 8 kHz, for phone lines. ``sse`` wraps the same bytes in events.
* ``GET /v1/audio/models`` and ``GET /v1/audio/voices`` also answer in the shape
  Open WebUI reads from an OpenAI-compatible TTS server (``{"models": [{"id", "name"}]}``,
  ``{"voices": [{"id", "name"}]}``), so its model and voice pickers list what this server speaks.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.api.deps import ContextDep, RuntimeDep, SpeechDep
from app.api.openai_schemas import (
    MODEL_ALIASES,
    OPENAI_VOICES,
    AudioModelList,
    ModelCard,
    ModelList,
    NamedItem,
    SpeechRequest,
    VoiceCard,
    VoiceList,
    check_speech,
)
from app.api.openapi import errors
from app.api.respond import synthesize
from app.api.route_docs import SPEECH_DOC
from app.api.routes import register
from app.api.sse import (
    SSE_HEADERS,
    SSE_MEDIA_TYPE,
    estimate_text_tokens,
    speech_sse_sink,
    speech_tokens_per_second,
)
from app.api.uploads import close_uploads, read_body
from app.serving.bounds import quoted
from app.serving.errors import NotFound
from app.serving.plan import SpeechFields, alias_speaker
from app.serving.speech import SpeechService

router = APIRouter(tags=["openai"], dependencies=[Depends(close_uploads)])

PCM_RATE = 24000  # OpenAI's pcm: 24 kHz, 16-bit signed little-endian, mono
# Sent as one complete file rather than streamed: a streamed FLAC's STREAMINFO must say
# "length unknown", which libsndfile (python-soundfile, librosa) cannot read.
WHOLE_FORMATS = frozenset({"flac"})


def check_model(speech: SpeechService, model: str) -> None:
    if model not in {speech.info.name, *MODEL_ALIASES}:
        raise NotFound("model_not_found", f"the model {quoted(model)} does not exist; this server serves "
                       f"{speech.info.name!r} (aliases: {', '.join(MODEL_ALIASES)})", param="model")


@register(router, "create_speech", **SPEECH_DOC)
async def create_speech(request: Request, speech: SpeechDep, ctx: ContextDep) -> Response:
    body, _ = await read_body(request, ctx, SpeechRequest, speech.limits)
    check_speech(body, speech.limits.max_text_chars)
    check_model(speech, body.model)
    fields = SpeechFields(text=body.input, voice=body.voice_name, instructions=body.instructions, speed=body.speed,
                          stream=True, aliases=True, text_param="input", priority=ctx.priority, seed=body.seed)
    plan = speech.plan(fields, ctx.request_id)
    headers = {"X-Instructions-Ignored": "true"} if plan.instructions_ignored else {}
    out = speech.output(body.response_format, stream=body.response_format not in WHOLE_FORMATS,
                        sample_rate=PCM_RATE if body.response_format == "pcm" else None)
    if body.stream_format != "sse":
        return await synthesize(request, ctx, speech, plan, out, headers=headers)
    sink = speech_sse_sink(estimate_text_tokens(body.input, plan.request.instruct_text),
                           speech_tokens_per_second(speech.info.family), lambda: ctx.audio_s)
    return await synthesize(request, ctx, speech, plan, out, media_type=SSE_MEDIA_TYPE,
                            headers={**headers, **SSE_HEADERS}, sink=sink)


@router.get("/v1/models", response_model=ModelList, summary="List models (OpenAI-compatible)",
            responses=errors(503, openai=True))
async def list_models(runtime: RuntimeDep, speech: SpeechDep) -> ModelList:
    return ModelList(data=[ModelCard(id=speech.info.name, created=runtime.model_created)])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, summary="Retrieve a model (OpenAI-compatible)",
            responses=errors(404, 503, openai=True))
async def retrieve_model(model_id: str, runtime: RuntimeDep, speech: SpeechDep) -> ModelCard:
    check_model(speech, model_id)
    return ModelCard(id=model_id, created=runtime.model_created)


@router.get("/v1/audio/models", response_model=AudioModelList, summary="List TTS models (Open WebUI's shape)",
            responses=errors(503, openai=True))
async def list_audio_models(speech: SpeechDep) -> AudioModelList:
    names = [speech.info.name, *(a for a in MODEL_ALIASES if a != speech.info.name)]
    return AudioModelList(models=[NamedItem(id=n, name=n) for n in names])


@router.get("/v1/audio/voices", response_model=VoiceList, summary="List voices usable as 'voice'",
            responses=errors(503, openai=True))
async def list_voices(speech: SpeechDep) -> VoiceList:
    presets = list(speech.presets)
    library = speech.voice_names()
    cards = [VoiceCard(id=n, type="preset") for n in presets]
    cards += [VoiceCard(id=n, type="library") for n in library]
    taken = set(presets) | set(library)
    cards += [VoiceCard(id=n, type="openai_alias", speaker=alias_speaker(n, presets))
              for n in OPENAI_VOICES if presets and n not in taken]
    named = [NamedItem(id=c.id, name=c.id if c.speaker is None else f"{c.id} ({c.speaker})") for c in cards]
    return VoiceList(data=cards, voices=named)
