"""Request and response models of the OpenAI-compatible surface, and its pure checks.

Follows OpenAI's API reference for ``POST /v1/audio/speech`` and ``/v1/models``.
Type errors (``input`` not a string, ...) are pydantic's and render as 400 with
``param``; range and vocabulary checks are done here so each has OpenAI's
``param`` and a message that says what to send instead.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from app.api.schemas import FORMAT_DOC, PRIORITY_DOC, PriorityName
from app.audio.formats import FORMAT_NAMES
from app.serving.bounds import (
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    OPENAI_MAX_INPUT_CHARS,
    SPEED_MAX,
    SPEED_MIN,
    quoted,
)
from app.serving.errors import BadRequest
from app.serving.plan import OPENAI_VOICES

# Model names accepted besides the served model's own name, so OpenAI apps work unchanged.
MODEL_ALIASES: tuple[str, ...] = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "cosyvoice")

MAX_INPUT_CHARS = OPENAI_MAX_INPUT_CHARS
SPEED_RANGE = (SPEED_MIN, SPEED_MAX)
__all__ = ["MODEL_ALIASES", "OPENAI_VOICES", "SpeechRequest", "check_speech"]
STREAM_FORMATS: tuple[str, ...] = ("audio", "sse")


class VoiceRef(BaseModel):
    """OpenAI's custom-voice object: ``{"id": "voice_1234"}``."""

    id: str = Field(max_length=NAME_MAX_CHARS)


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``. Unknown fields are ignored, as OpenAI clients send extras."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(max_length=NAME_MAX_CHARS)
    input: str
    voice: str | VoiceRef
    instructions: str | None = Field(None, max_length=INSTRUCTIONS_MAX_CHARS)
    response_format: str = Field("mp3", description=f"One of: {', '.join(FORMAT_NAMES)}. pcm is 24 kHz. "
                                 + FORMAT_DOC)
    speed: float = 1.0
    stream_format: str = "audio"
    priority: PriorityName | None = Field(None, description=PRIORITY_DOC)
    seed: StrictInt | None = Field(None, ge=0, le=2**32 - 1, description=(
        "Extension (not in OpenAI's API; the SDKs send it with extra_body): the same request and seed give the "
        "same audio bytes, and a repeat is answered from the server's answer cache (X-Cache)."))

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, v: Any) -> Any:
        # One clear error (param "voice") instead of pydantic's per-union-member ones.
        if isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("id"), str)):
            name = v if isinstance(v, str) else v["id"]
            if len(name) > NAME_MAX_CHARS:
                raise ValueError(f"voice is {len(name)} characters; the limit is {NAME_MAX_CHARS}")
            return v
        raise ValueError('voice must be a voice name or an object like {"id": "voice_1234"}')

    @property
    def voice_name(self) -> str:
        return (self.voice.id if isinstance(self.voice, VoiceRef) else self.voice).strip()


def check_speech(body: SpeechRequest, max_chars: int = MAX_INPUT_CHARS) -> None:
    """Range and vocabulary checks (everything that does not need the loaded model)."""
    limit = min(MAX_INPUT_CHARS, max_chars)
    if not body.input.strip():
        raise BadRequest("empty_input", "input is empty; send the text to speak (1 to "
                       f"{limit} characters)", param="input")
    if len(body.input) > limit:
        raise BadRequest("string_above_max_length", f"input is {len(body.input)} characters; "
                       f"the maximum is {limit}", param="input")
    if body.response_format not in FORMAT_NAMES:
        raise BadRequest("unsupported_format", f"unsupported response_format {quoted(body.response_format)}; "
                       f"use one of: {', '.join(FORMAT_NAMES)}", param="response_format")
    low, high = SPEED_RANGE
    if not (low <= body.speed <= high):
        raise BadRequest("invalid_speed", f"speed must be between {low} and {high}; got {body.speed}",
                       param="speed")
    if body.stream_format not in STREAM_FORMATS:
        raise BadRequest("invalid_stream_format", f"unsupported stream_format {quoted(body.stream_format)}; "
                       f"use one of: {', '.join(STREAM_FORMATS)}", param="stream_format")
    if not body.voice_name:
        raise BadRequest("voice_required", "voice is empty; name a preset speaker or a registered voice",
                       param="voice")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cosyserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    object: Literal["voice"] = "voice"
    type: Literal["preset", "library", "openai_alias"]
    speaker: str | None = Field(None, description="For an OpenAI alias: the preset speaker it speaks with.")


class NamedItem(BaseModel):
    """One entry of the ``models`` / ``voices`` lists Open WebUI reads (``id`` is what it sends back)."""

    id: str
    name: str


class AudioModelList(BaseModel):
    """``GET /v1/audio/models``: the TTS models, in the shape Open WebUI reads (``models[].id``)."""

    models: list[NamedItem]


class VoiceList(BaseModel):
    """``data`` in OpenAI's list shape; ``voices`` the same ids as Open WebUI reads them (``id``, ``name``)."""

    object: Literal["list"] = "list"
    data: list[VoiceCard]
    voices: list[NamedItem]
