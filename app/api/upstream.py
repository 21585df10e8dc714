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
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.responses import Response

from app.api.context import RequestContext
from app.api.deps import ContextDep, SpeechDep
from app.api.respond import synthesize
from app.api.route_docs import UPSTREAM_MEDIA_TYPE, upstream_doc
from app.api.routes import register
from app.api.schemas import PRIORITY_DOC, PriorityName
from app.api.uploads import close_uploads, is_form, read_audio, read_body
from app.serving.bounds import (
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    PROMPT_TEXT_MAX_CHARS,
)
from app.serving.errors import MissingField
from app.serving.plan import SpeechFields
from app.serving.speech import SpeechService

router = APIRouter(tags=["upstream-compatible"], dependencies=[Depends(close_uploads)])
MEDIA_TYPE = UPSTREAM_MEDIA_TYPE

F = TypeVar("F", bound=BaseModel)


class _Form(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tts_text: str
    priority: PriorityName | None = Field(None, description=PRIORITY_DOC)


# tts_text: at most server.max_text_chars (the planner checks it, 400 text_too_long)
_Name = Field(max_length=NAME_MAX_CHARS)
_Instruction = Field(max_length=INSTRUCTIONS_MAX_CHARS)


class SftForm(_Form):
    spk_id: str = _Name


class ZeroShotForm(_Form):
    prompt_text: str = Field(max_length=PROMPT_TEXT_MAX_CHARS)


class InstructForm(_Form):
    spk_id: str = _Name
    instruct_text: str = _Instruction


class Instruct2Form(_Form):
    instruct_text: str = _Instruction


@dataclass(frozen=True)
class Upstream:
    """One upstream endpoint: its form, the mode it runs, whether it takes ``prompt_wav``."""

    form: type[_Form]
    mode: str
    prompt: bool


UPSTREAM: dict[str, Upstream] = {
    "inference_sft": Upstream(SftForm, "sft", prompt=False),
    "inference_zero_shot": Upstream(ZeroShotForm, "zero_shot", prompt=True),
    "inference_cross_lingual": Upstream(_Form, "cross_lingual", prompt=True),
    "inference_instruct": Upstream(InstructForm, "instruct", prompt=False),
    "inference_instruct2": Upstream(Instruct2Form, "instruct2", prompt=True),
}


async def read_form(request: Request, ctx: RequestContext, speech: SpeechService,
                    model: type[F]) -> tuple[F, dict[str, UploadFile]]:
    """Form body (multipart or urlencoded) on any method; else the query string."""
    if is_form(request):
        return await read_body(request, ctx, model, speech.limits)
    try:
        return model.model_validate(dict(request.query_params)), {}
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from exc


def handler(name: str, spec: Upstream) -> Callable[..., Any]:
    async def handle(request: Request, speech: SpeechDep, ctx: ContextDep) -> Response:
        form, files = await read_form(request, ctx, speech, spec.form)
        audio = None
        if spec.prompt:
            audio = await read_audio(ctx, files.get("prompt_wav"), "prompt_wav", speech.limits.max_upload_bytes)
            if audio is None:
                raise MissingField("validation_error", "prompt_wav: Field required (upload the prompt audio as a "
                                   "file)", param="prompt_wav")
        fields = SpeechFields(text=form.tts_text, mode=spec.mode, voice=getattr(form, "spk_id", None),
                              instructions=getattr(form, "instruct_text", None),
                              prompt_text=getattr(form, "prompt_text", None), prompt_audio=audio,
                              text_param="tts_text", voice_param="spk_id", instructions_param="instruct_text")
        fields.priority = ctx.priority  # the edge decided it (body field, header, key default)
        plan = speech.plan(fields, ctx.request_id)
        return await synthesize(request, ctx, speech, plan, speech.output("pcm", stream=True), media_type=MEDIA_TYPE)

    handle.__name__ = name
    return handle


for _name, _spec in UPSTREAM.items():
    register(router, _name, by_method=upstream_doc(_spec.form, _spec.prompt))(handler(_name, _spec))
