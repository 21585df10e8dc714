"""Voice library API: ``/v1/voices`` (register, list, show, delete).

A registered voice is used by naming it wherever a voice is named
(``voice`` on ``/v1/tts`` and ``/v1/audio/speech``): its features were computed
once at registration and are not recomputed per request.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from app.api.deps import ContextDep, LibraryDep, PoolDep, SpeechDep
from app.api.openapi import errors
from app.api.route_docs import VOICE_DOC
from app.api.uploads import close_uploads, read_audio, read_body, read_file
from app.api.voice_schemas import VoiceCard, VoiceForm, VoiceList, check_voice_form
from app.serving.bounds import PROMPT_TEXT_MAX_CHARS, quoted
from app.serving.errors import BadRequest
from app.voices import VoiceNotFound
from app.voices.store import safe_ext

router = APIRouter(tags=["voices"], dependencies=[Depends(close_uploads)])


@router.post("/v1/voices", status_code=201, response_model=VoiceCard, summary="Register a voice", **VOICE_DOC)
async def create_voice(request: Request, speech: SpeechDep, pool: PoolDep, library: LibraryDep,
                       ctx: ContextDep) -> JSONResponse:
    limits = speech.limits
    form, files = await read_body(request, ctx, VoiceForm, limits)
    name, transcript, description = check_voice_form(form, min(limits.max_text_chars, PROMPT_TEXT_MAX_CHARS))
    upload = files.get("audio")
    if upload is None:
        raise BadRequest("invalid_audio", "upload 1-30 s of the voice's speech as the multipart file 'audio'",
                         param="audio")
    original = await read_file(upload, "audio", limits.max_upload_bytes)
    audio = await read_audio(ctx, original, "audio", limits.max_upload_bytes)
    meta = await library.register(pool, name, transcript, description, audio, original, safe_ext(upload.filename))
    return JSONResponse(meta, status_code=201, headers={"Location": f"/v1/voices/{name}"})


@router.get("/v1/voices", response_model=VoiceList, summary="List registered voices", responses=errors(503))
async def list_voices(library: LibraryDep) -> VoiceList:
    return VoiceList(voices=[VoiceCard(**meta) for meta in library.list()])


@router.get("/v1/voices/{name}", response_model=VoiceCard, summary="Show a registered voice",
            responses=errors(404, 503))
async def get_voice(name: str, library: LibraryDep) -> VoiceCard:
    meta = library.get(name)
    if meta is None:
        raise VoiceNotFound(f"no voice named {quoted(name)}")
    return VoiceCard(**meta)


@router.delete("/v1/voices/{name}", status_code=204, summary="Delete a registered voice",
               responses=errors(404, 409, 503))
async def delete_voice(name: str, library: LibraryDep) -> Response:
    await library.delete(name)
    return Response(status_code=204)
