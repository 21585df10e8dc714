"""Request and response models of the voice library API, and the form's checks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.serving.bounds import (
    DESCRIPTION_MAX_CHARS,
    PROMPT_TEXT_MAX_CHARS,
    check_unicode,
    quoted,
)
from app.serving.errors import BadRequest
from app.voices.store import valid_name

MAX_DESCRIPTION_CHARS = DESCRIPTION_MAX_CHARS


class VoiceForm(BaseModel):
    """``POST /v1/voices`` form fields (the prompt speech comes as the file field ``audio``)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="1-64 characters: letters, digits, '_' and '-'.")
    transcript: str | None = Field(None, description="What is said in the audio, word for word "
                                   f"(1-{PROMPT_TEXT_MAX_CHARS} characters).")
    description: str | None = Field(None, description="Free text for people; not used by the model "
                                    f"(at most {DESCRIPTION_MAX_CHARS} characters).")


class VoiceCard(BaseModel):
    name: str
    transcript: str
    description: str
    created_at: str
    audio_sha256: str
    sample_rate: int
    duration_s: float


class VoiceList(BaseModel):
    voices: list[VoiceCard]


def check_voice_form(form: VoiceForm, max_transcript_chars: int = PROMPT_TEXT_MAX_CHARS) -> tuple[str, str, str]:
    """(name, transcript, description), or a 400 naming the field to fix."""
    name = form.name or ""
    if not valid_name(name):
        raise BadRequest("invalid_name", "name must be 1-64 characters of letters, digits, '_' or '-' "
                       f"(got {quoted(name)})", param="name")
    transcript = (form.transcript or "").strip()
    if not transcript:
        raise BadRequest("invalid_transcript", "transcript is required: the words spoken in the audio",
                       param="transcript")
    if len(transcript) > max_transcript_chars:
        raise BadRequest("invalid_transcript", f"transcript is {len(transcript)} characters; "
                       f"the limit is {max_transcript_chars}", param="transcript")
    check_unicode(transcript, "transcript")
    description = (form.description or "").strip()
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise BadRequest("invalid_description", f"description is {len(description)} characters; "
                       f"the limit is {MAX_DESCRIPTION_CHARS}", param="description")
    check_unicode(description, "description")
    return name, transcript, description
