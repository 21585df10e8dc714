"""Voice library API: ``/v1/voices`` (register, list, show, delete).

A registered voice is used by naming it wherever a voice is named
(``voice`` on ``/v1/tts`` and ``/v1/audio/speech``): its features were computed
once at registration and are not recomputed per request.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from app.api.deps import PoolDep, RuntimeDep
from app.api.errors import ApiError
from app.api.uploads import read_audio, read_body
from app.api.voice_schemas import VoiceCard, VoiceForm, VoiceList, check_voice_form
from app.runtime import Runtime
from app.serving.errors import NotReady
from app.voices import VoiceNotFound
from app.voices.store import safe_ext

router = APIRouter(tags=["voices"])


def get_library(runtime: RuntimeDep) -> Any:
    if runtime.voices is None:
        raise NotReady("the voice library is not started")
    return runtime.voices


LibraryDep = Annotated[Any, Depends(get_library)]


def _max_bytes(runtime: Runtime) -> int:
    return int(runtime.settings.server.max_upload_mb * 1024 * 1024)


@router.post("/v1/voices", status_code=201, response_model=VoiceCard, summary="Register a voice")
async def create_voice(request: Request, runtime: RuntimeDep, pool: PoolDep, library: LibraryDep) -> JSONResponse:
    max_bytes = _max_bytes(runtime)
    form, files = await read_body(request, VoiceForm, max_bytes)
    name, transcript, description = check_voice_form(form, runtime.settings.server.max_text_chars)
    upload = files.get("audio")
    if upload is None:
        raise ApiError(400, "invalid_audio", "upload 1-30 s of the voice's speech as the multipart file 'audio'",
                       param="audio")
    original = await upload.read(max_bytes + 1)
    audio = await read_audio(original, "audio", max_bytes)
    meta = await library.register(pool, name, transcript, description, audio, original, safe_ext(upload.filename))
    return JSONResponse(meta, status_code=201, headers={"Location": f"/v1/voices/{name}"})


@router.get("/v1/voices", response_model=VoiceList, summary="List registered voices")
async def list_voices(library: LibraryDep) -> VoiceList:
    return VoiceList(voices=[VoiceCard(**meta) for meta in library.list()])


@router.get("/v1/voices/{name}", response_model=VoiceCard, summary="Show a registered voice")
async def get_voice(name: str, library: LibraryDep) -> VoiceCard:
    meta = library.get(name)
    if meta is None:
        raise VoiceNotFound(f"no voice named {name!r}")
    return VoiceCard(**meta)


@router.delete("/v1/voices/{name}", status_code=204, summary="Delete a registered voice")
async def delete_voice(name: str, library: LibraryDep) -> Response:
    await library.delete(name)
    return Response(status_code=204)
