"""Reading request bodies: JSON or multipart forms, uploaded audio with a size limit."""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from app.api.errors import ApiError
from app.audio.decode import AudioDecodeError, decode_audio
from app.engines.base import PromptAudio

M = TypeVar("M", bound=BaseModel)
PROMPT_RATE = 16000


def _size(limit: int) -> str:
    return f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit // 1024} KB"


def _validation(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError(exc.errors(include_url=False, include_context=False))


def is_form(request: Request) -> bool:
    ctype = request.headers.get("content-type", "")
    return ctype.startswith("multipart/form-data") or ctype.startswith("application/x-www-form-urlencoded")


async def read_body(request: Request, model: type[M], max_bytes: int) -> tuple[M, dict[str, UploadFile]]:
    """Parse JSON or form fields into ``model``; return uploaded files separately."""
    files: dict[str, UploadFile] = {}
    if is_form(request):
        form = await request.form(max_part_size=max_bytes)
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                files[key] = value
            elif value != "":
                fields[key] = value
        try:
            return model.model_validate(fields), files
        except ValidationError as exc:
            raise _validation(exc) from exc
    raw = await request.body()
    if len(raw) > max_bytes:
        raise ApiError(413, "payload_too_large", f"request body is larger than {_size(max_bytes)}")
    try:
        return model.model_validate_json(raw or b"{}"), files
    except ValidationError as exc:
        raise _validation(exc) from exc


async def read_audio(upload: UploadFile | bytes | None, field: str, max_bytes: int, target_rate: int = PROMPT_RATE) -> PromptAudio | None:
    """Decode an uploaded audio file to mono float32 at ``target_rate`` (off the event loop)."""
    if upload is None:
        return None
    data = upload if isinstance(upload, bytes) else await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ApiError(413, "payload_too_large", f"{field} is larger than {_size(max_bytes)}", param=field)
    if not data:
        raise ApiError(400, "invalid_audio", f"{field} is empty; upload 1-30 s of speech", param=field)
    try:
        samples = await anyio.to_thread.run_sync(decode_audio, data, target_rate)
    except AudioDecodeError as exc:
        raise ApiError(400, "invalid_audio", f"{field}: {exc}", param=field) from exc
    audio = PromptAudio(samples=samples, sample_rate=target_rate)
    if audio.duration_s < 1.0 or audio.duration_s > 30.0:
        raise ApiError(400, "invalid_audio", f"{field} is {audio.duration_s:.2f} s long; send 1 to 30 seconds of speech", param=field)
    return audio
