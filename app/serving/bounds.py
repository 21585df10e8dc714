"""Request bounds (the caps on request fields): written once here, read by the schemas, the planner and the uploads.

``SpeechLimits`` carries the configurable ones (built by the lifespan from
settings); the module constants are fixed by the model or by the APIs we follow.
The speed and prompt-length bounds are the engine contract's (``app/engines/base.py``,
which ``check_mode_inputs`` enforces), re-exported here for the HTTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engines.base import MODES, PROMPT_MAX_S, PROMPT_MIN_S, SPEED_MAX, SPEED_MIN
from app.serving.errors import BadRequest

__all__ = ["ALL_MODES", "DESCRIPTION_MAX_CHARS", "FIRST_CHUNK_TOKENS_MAX", "INSTRUCTIONS_MAX_CHARS", "NAME_MAX_CHARS",
           "OPENAI_MAX_INPUT_CHARS", "OUTPUT_RATE_MAX", "OUTPUT_RATE_MIN", "PROMPT_MAX_S", "PROMPT_MIN_S",
           "PROMPT_TEXT_MAX_CHARS", "QUOTE_CHARS", "SPEED_MAX", "SPEED_MIN", "SpeechLimits", "check_length",
           "check_unicode", "quoted", "size_text"]

OPENAI_MAX_INPUT_CHARS = 4096  # OpenAI's documented limit for /v1/audio/speech
OUTPUT_RATE_MIN, OUTPUT_RATE_MAX = 8000, 48000  # sample_rate a client may ask for
ALL_MODES: tuple[str, ...] = MODES
# the schema's outer bound on first_chunk_tokens; the loaded model's own range (EngineInfo) is checked by the planner
FIRST_CHUNK_TOKENS_MAX = 1000

# Fixed caps on the fields that are not text to speak (that one is SpeechLimits.max_text_chars). Every
# surface's schema declares them and the planner checks them again, so a giant field is a 4xx before
# any engine work: a 1 MB prompt_text once cost seconds of engine time and a 640 GB allocation attempt.
NAME_MAX_CHARS = 128  # voice, speaker, spk_id, model: names (a library voice's own is 1-64)
PROMPT_TEXT_MAX_CHARS = 1000  # prompt_text / a voice's transcript: what 1-30 s of prompt speech says
INSTRUCTIONS_MAX_CHARS = 1000  # instruct_text / instructions: a style instruction in plain words
DESCRIPTION_MAX_CHARS = 1000  # a registered voice's description (for people; never reaches the model)
QUOTE_CHARS = 40  # an error message quotes at most this much of what was sent


@dataclass(frozen=True)
class SpeechLimits:
    max_text_chars: int
    max_upload_bytes: int
    body_timeout_s: float  # 0: no deadline for reading a request body


def size_text(limit: int) -> str:
    """A byte limit for people: '20 MB', '512 KB'."""
    return f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit // 1024} KB"


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``value`` for an error message: its repr, cut to ``limit`` characters with the full length said.

    An error answer never echoes a client's giant field back whole (a 1 MB ``model`` once came back
    in the 404).
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_unicode(value: str | None, param: str) -> None:
    """A lone surrogate (half of a UTF-16 pair, e.g. JSON's ``"\\ud800"``) cannot be spoken or encoded."""
    if not value:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest("invalid_input", f"{param} holds a lone surrogate (\\u{ord(value[exc.start]):04x} at "
                         f"character {exc.start}): send valid Unicode text", param=param) from None


def check_length(value: str | None, param: str, limit: int, code: str = "field_too_long") -> None:
    """``value`` is at most ``limit`` characters and valid Unicode, else BadRequest naming ``param``."""
    if value is None:
        return
    if len(value) > limit:
        raise BadRequest(code, f"{param} is {len(value)} characters; the limit is {limit}", param=param)
    check_unicode(value, param)
