"""Reading request bodies: JSON or forms under a deadline and a size limit; uploaded audio.

The body must arrive within ``server.body_timeout_s`` (else ``BodyTimeout``, 408):
a slow uploader cannot hold its admission permit for long. Uploaded audio is
decoded off the event loop; what the decoder said is logged with the request id,
never put in the response.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import nullcontext
from functools import partial
from typing import Any, TypeVar

import anyio
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from app.api.context import RequestContext
from app.audio.decode import AudioDecodeError, AudioTooLong, decode_audio
from app.engines.base import PROMPT_RATE, PromptAudio
from app.serving.bounds import (
    PROMPT_MAX_S,
    PROMPT_MIN_S,
    SpeechLimits,
    size_text,
)
from app.serving.errors import BadRequest, BodyTimeout, PayloadTooLarge

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("cosyserve.api")


def _validation(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError(exc.errors(include_url=False, include_context=False))


def is_form(request: Request) -> bool:
    ctype = request.headers.get("content-type", "")
    return ctype.startswith("multipart/form-data") or ctype.startswith("application/x-www-form-urlencoded")


async def close_uploads(request: Request) -> AsyncIterator[None]:
    """Router dependency: when the request is done, close the form it parsed.

    Our handlers read their form themselves (``request.form()`` in :func:`read_body`), so
    FastAPI does not close it; Starlette spools every uploaded file to a temporary file that
    stays open until ``request.close()``. (FastAPI hands its dependencies the handler's own
    Request object, whose cached form this closes; a request without a form is a no-op.)
    """
    try:
        yield
    finally:
        await request.close()


def _deadline(limits: SpeechLimits) -> Any:
    return asyncio.timeout(limits.body_timeout_s) if limits.body_timeout_s > 0 else nullcontext()


async def read_body(request: Request, ctx: RequestContext, model: type[M],
                    limits: SpeechLimits) -> tuple[M, dict[str, UploadFile]]:
    """Parse JSON or form fields into ``model``; return uploaded files separately (``ctx``: the request's
    context, whose id an unreadable form is logged with)."""
    try:
        async with _deadline(limits):
            return await _read(request, ctx, model, limits.max_upload_bytes)
    except TimeoutError:
        raise BodyTimeout("body_timeout", f"the request body did not arrive within {limits.body_timeout_s:g} s") from None


async def _read(request: Request, ctx: RequestContext, model: type[M],
                max_bytes: int) -> tuple[M, dict[str, UploadFile]]:
    files: dict[str, UploadFile] = {}
    if is_form(request):
        try:
            form = await request.form(max_part_size=max_bytes)
        except HTTPException as exc:  # Starlette's multipart errors: its words stay in the log
            log.info("request %s: unreadable form: %s", ctx.request_id, exc.detail)
            if "maximum size" in str(exc.detail):
                raise PayloadTooLarge("payload_too_large", f"a form part is larger than {size_text(max_bytes)}") from None
            raise BadRequest("invalid_form", "the form body could not be parsed; send multipart/form-data "
                             "or application/x-www-form-urlencoded") from None
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
        raise PayloadTooLarge("payload_too_large", f"request body is larger than {size_text(max_bytes)}")
    try:
        return model.model_validate_json(raw or b"{}"), files
    except ValidationError as exc:
        raise _validation(exc) from exc


async def read_file(upload: UploadFile, field: str, max_bytes: int) -> bytes:
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PayloadTooLarge("payload_too_large", f"{field} is larger than {size_text(max_bytes)}", param=field)
    return data


async def read_audio(ctx: RequestContext, upload: UploadFile | bytes | None, field: str, max_bytes: int,
                     target_rate: int = PROMPT_RATE) -> PromptAudio | None:
    """Decode an uploaded audio file to mono float32 at ``target_rate`` (off the event loop); what the
    decoder said is logged with ``ctx``'s request id."""
    if upload is None:
        return None
    data = upload if isinstance(upload, bytes) else await read_file(upload, field, max_bytes)
    if not data:
        raise BadRequest("invalid_audio", f"{field} is empty; upload 1-30 s of speech", param=field)
    try:  # decoding stops at the longest prompt (before a frame, where the header gives the length)
        samples = await anyio.to_thread.run_sync(
            partial(decode_audio, data, target_rate, max_duration_s=PROMPT_MAX_S))
    except AudioTooLong as exc:
        said = f"{exc.seconds:.2f} s long" if exc.seconds is not None else f"longer than {PROMPT_MAX_S:g} s"
        raise BadRequest("invalid_audio", f"{field} is {said}; send {PROMPT_MIN_S:g} to {PROMPT_MAX_S:g} "
                         f"seconds of speech", param=field) from exc
    except AudioDecodeError as exc:
        log.info("request %s: %s could not be decoded: %s", ctx.request_id, field, exc.detail or exc.reason)
        raise BadRequest("invalid_audio", f"{field}: {exc.reason}", param=field) from exc
    audio = PromptAudio(samples=samples, sample_rate=target_rate)
    if not PROMPT_MIN_S <= audio.duration_s <= PROMPT_MAX_S:
        raise BadRequest("invalid_audio", f"{field} is {audio.duration_s:.2f} s long; send {PROMPT_MIN_S:g} to "
                         f"{PROMPT_MAX_S:g} seconds of speech", param=field)
    return audio
