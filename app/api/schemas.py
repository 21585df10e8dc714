"""Request and response models of the HTTP API (pydantic)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FormatName = Literal["wav", "pcm", "mp3", "opus", "aac", "flac"]
ModeName = Literal["sft", "zero_shot", "cross_lingual", "instruct", "instruct2", "vc"]


class TTSRequest(BaseModel):
    """Native ``POST /v1/tts`` body (JSON, or the same fields as a multipart form)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field("", description="Text to speak (not used by mode 'vc').")
    mode: ModeName | None = Field(None, description="Defaults to 'sft' with a speaker, 'zero_shot' with a voice or prompt.")
    speaker: str | None = Field(None, description="Preset speaker (sft / instruct).")
    voice: str | None = Field(None, description="A registered library voice, or a preset speaker name.")
    prompt_text: str | None = Field(None, description="Transcript of the prompt audio (zero_shot).")
    instruct_text: str | None = Field(None, description="Style instruction (instruct / instruct2).")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream: bool = False
    format: FormatName = "wav"
    sample_rate: int | None = Field(None, ge=8000, le=48000, description="Resample the output (pcm/wav/flac/mp3/aac).")


class SpeakersResponse(BaseModel):
    speakers: list[str]
    voices: list[str] = []
    model: str
    sample_rate: int
    modes: list[str]
