"""Request limits: written once here, read by the schemas, the planner and the uploads.

``SpeechLimits`` carries the configurable ones (built by the lifespan from
settings); the module constants are fixed by the model or by the APIs we follow.
The speed and prompt-length bounds are the engine contract's (``app/engines/base.py``,
which ``check_mode_inputs`` enforces), re-exported here for the HTTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engines.base import MODES, PROMPT_MAX_S, PROMPT_MIN_S, SPEED_MAX, SPEED_MIN

__all__ = ["ALL_MODES", "FIRST_CHUNK_TOKENS_MAX", "OPENAI_MAX_INPUT_CHARS", "OUTPUT_RATE_MAX", "OUTPUT_RATE_MIN", "PROMPT_MAX_S", "PROMPT_MIN_S",
           "SPEED_MAX", "SPEED_MIN", "SpeechLimits", "size_text"]

OPENAI_MAX_INPUT_CHARS = 4096  # OpenAI's documented limit for /v1/audio/speech
OUTPUT_RATE_MIN, OUTPUT_RATE_MAX = 8000, 48000  # sample_rate a client may ask for
ALL_MODES: tuple[str, ...] = MODES
# the schema's outer bound on first_chunk_tokens; the loaded model's own range (EngineInfo) is checked by the planner
FIRST_CHUNK_TOKENS_MAX = 1000


@dataclass(frozen=True)
class SpeechLimits:
    max_text_chars: int = 4096
    max_upload_bytes: int = 20 * 1024 * 1024
    body_timeout_s: float = 30.0  # 0: no deadline for reading a request body

    @classmethod
    def from_mb(cls, max_text_chars: int, max_upload_mb: float, body_timeout_s: float) -> SpeechLimits:
        return cls(max_text_chars, int(max_upload_mb * 1024 * 1024), body_timeout_s)


def size_text(limit: int) -> str:
    """A byte limit for people: '20 MB', '512 KB'."""
    return f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit // 1024} KB"
