"""Request and response models of the HTTP API (pydantic)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.audio.formats import FORMAT_NAMES
from app.serving.admission.classes import Priority, parse_priority
from app.serving.bounds import (
    ALL_MODES,
    FIRST_CHUNK_TOKENS_MAX,
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    OUTPUT_RATE_MAX,
    OUTPUT_RATE_MIN,
    PROMPT_TEXT_MAX_CHARS,
    SPEED_MAX,
    SPEED_MIN,
)

FormatName = Literal[FORMAT_NAMES]  # type: ignore[valid-type]
# The traffic class (app/serving/admission/classes.py), case-insensitive; every surface's body takes it as ``priority``.
PriorityName = Annotated[Priority, BeforeValidator(parse_priority)]
PRIORITY_DOC = ("Traffic class: 'interactive' (the default) or 'bulk' (waits in its own queue and runs in the "
                "capacity interactive work leaves; docs/priority.md). Wins over the X-Priority header and the "
                "API key's default.")
FORMAT_DOC = ("Audio format. mulaw / alaw: raw G.711 bytes at 8 kHz mono, what phone lines carry (Twilio "
              "Media Streams, SIP); wav_mulaw / wav_alaw: the same in a WAV file (docs/phone.md).")
ModeName = Literal[ALL_MODES]  # type: ignore[valid-type]


class TTSRequest(BaseModel):
    """Native ``POST /v1/tts`` body (JSON, or the same fields as a multipart form)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field("", description="Text to speak (not used by mode 'vc'); at most server.max_text_chars "
                      "characters (4096 by default; 400 text_too_long beyond).")
    mode: ModeName | None = Field(None, description="Defaults to 'sft' with a speaker, 'zero_shot' with a voice or prompt.")
    speaker: str | None = Field(None, max_length=NAME_MAX_CHARS, description="Preset speaker (sft / instruct).")
    voice: str | None = Field(None, max_length=NAME_MAX_CHARS,
                              description="A registered library voice, or a preset speaker name.")
    prompt_text: str | None = Field(None, max_length=PROMPT_TEXT_MAX_CHARS,
                                    description="Transcript of the prompt audio (zero_shot).")
    instruct_text: str | None = Field(None, max_length=INSTRUCTIONS_MAX_CHARS,
                                      description="Style instruction (instruct / instruct2).")
    speed: float = Field(1.0, ge=SPEED_MIN, le=SPEED_MAX)
    stream: bool = False
    seed: int | None = Field(None, ge=0, le=2**32 - 1,
                             description="Fix the LLM's sampling: the same text, voice and seed give the same speech "
                                         "tokens (CosyVoice2/3 with batching).")
    normalize: bool | None = Field(None, description="Text normalization (numbers, dates, currency, units -> words) "
                                   "before synthesis; default: the server's engine.text_normalization. false: speak "
                                   "the text as written.")
    first_chunk_tokens: int | None = Field(
        None, ge=1, le=FIRST_CHUNK_TOKENS_MAX,
        description="Streaming only: speech tokens in the first audio chunk (25 per second of audio on "
                    "CosyVoice2/3). Smaller: earlier first audio, its last frames computed with less right "
                    "context; default: the model's own (25 plus the prompt alignment). The model's range is "
                    "checked (400 outside it); CosyVoice2/3 with engine.batching only.")
    format: FormatName = Field("wav", description=FORMAT_DOC)
    sample_rate: int | None = Field(None, ge=OUTPUT_RATE_MIN, le=OUTPUT_RATE_MAX,
                                    description="Resample the output (pcm/wav/flac/mp3/aac). opus is always "
                                                "48 kHz and the G.711 formats 8 kHz, whatever is asked; "
                                                "X-Sample-Rate says the rate sent.")
    priority: PriorityName | None = Field(None, description=PRIORITY_DOC)


class SpeakersResponse(BaseModel):
    speakers: list[str]
    voices: list[str] = []
    model: str
    sample_rate: int
    modes: list[str]
