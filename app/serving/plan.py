"""One planning function from any surface's fields to a ``SynthesisRequest``.

Every surface (native ``/v1/tts``, OpenAI ``/v1/audio/speech``, upstream
``/inference_*``) says the same few things in its own words; the router maps its
fields onto :class:`SpeechFields` and :func:`plan` decides the rest:

* ``voice`` names a registered library voice (wins), a preset speaker, or, when
  ``aliases`` is on (OpenAI), an OpenAI built-in name mapped onto the presets;
  anything else is ``unknown_voice``.
* ``mode``: as asked, except that a library voice turns ``sft`` into
  ``zero_shot`` and ``instruct`` into ``instruct2`` (a library voice is a prompt).
  When not asked: prompt audio or a library voice -> ``instruct2`` with
  instructions (when the model has it), else ``zero_shot`` with a transcript or
  library voice, else ``cross_lingual``; no prompt -> ``instruct`` with
  instructions (when the model has it), else ``sft``.
* ``sft`` / ``instruct`` without a speaker speak with the first preset.
* Instructions the chosen mode cannot use are dropped, and the plan says so.

The engine still checks what only the model knows (``check_mode_inputs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.engines.base import EngineInfo, PromptAudio, SynthesisRequest
from app.serving.bounds import (
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    PROMPT_TEXT_MAX_CHARS,
    SPEED_MAX,
    SPEED_MIN,
    SpeechLimits,
    check_length,
    quoted,
)
from app.serving.errors import BadRequest

# OpenAI's built-in voice names. When the model has preset speakers, the i-th name here
# speaks with preset ``i % len(presets)`` (the engine's order): deterministic and stable.
# A preset or library voice with the same name wins over the alias.
OPENAI_VOICES: tuple[str, ...] = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)
_LIBRARY_MODE = {"sft": "zero_shot", "instruct": "instruct2"}
_USES_INSTRUCTIONS = frozenset({"instruct", "instruct2"})


@dataclass
class SpeechFields:
    """What a surface asked for, in the planner's words."""

    text: str = ""
    mode: str | None = None
    voice: str | None = None
    instructions: str | None = None
    prompt_text: str | None = None
    prompt_audio: PromptAudio | None = None
    source_audio: PromptAudio | None = None
    speed: float = 1.0
    stream: bool = False  # ask the engine for its streaming mode (smaller first chunk)
    seed: int | None = None  # the LLM's sampling seed (reproducible output)
    normalize: bool | None = None  # text normalization; None: the engine's default
    first_chunk_tokens: int | None = None  # streaming: the first chunk's speech tokens (the model's range)
    aliases: bool = False  # OpenAI built-in voice names map onto the presets
    priority: str = "interactive"  # the traffic class the edge decided (app/serving/admission/classes.py)
    text_param: str = "text"  # the surface's names for its fields, for error messages
    voice_param: str = "voice"
    instructions_param: str = "instructions"


@dataclass(frozen=True)
class Plan:
    request: SynthesisRequest
    instructions_ignored: bool = False
    voice_id: str | None = None  # a library voice's identity (its stored audio and registration): the cache key


def alias_speaker(name: str, presets: Sequence[str]) -> str | None:
    """The preset an OpenAI built-in voice name speaks with, or None."""
    key = name.lower()
    if not presets or key not in OPENAI_VOICES:
        return None
    return presets[OPENAI_VOICES.index(key) % len(presets)]


@dataclass(frozen=True)
class Voice:
    speaker: str | None = None
    library: Any | None = None  # engine-ready features of a registered voice


def resolve_voice(name: str | None, presets: Sequence[str], library: Callable[[str], Any | None],
                  known_library: Callable[[], list[str]], aliases: bool) -> Voice:
    """A user-facing voice name -> a library voice, a preset speaker or (OpenAI) an alias."""
    name = (name or "").strip()
    if not name:
        return Voice()
    features = library(name)
    if features is not None:
        return Voice(library=features)
    if name in presets:
        return Voice(speaker=name)
    speaker = alias_speaker(name, presets) if aliases else None
    if speaker is not None:
        return Voice(speaker=speaker)
    known = list(presets) + known_library()
    message = f"unknown voice {quoted(name)}; known voices: {', '.join(known) or 'none'}"
    if aliases and name.lower() in OPENAI_VOICES:
        message += f"; {quoted(name)} is an OpenAI voice name, and this model has no preset speakers to map it to"
    raise BadRequest("unknown_voice", message, param="voice")


def choose_mode(fields: SpeechFields, voice: Voice, modes: Sequence[str]) -> str:
    instructions = bool(fields.instructions)
    if fields.mode:
        if voice.library is not None and fields.mode in _LIBRARY_MODE:
            wanted = _LIBRARY_MODE[fields.mode]
            return wanted if wanted in modes else "zero_shot"
        return fields.mode
    if fields.prompt_audio is not None or voice.library is not None:
        if instructions and "instruct2" in modes:
            return "instruct2"
        return "zero_shot" if (fields.prompt_text or voice.library is not None) else "cross_lingual"
    if instructions and "instruct" in modes:
        return "instruct"
    return "sft"


def check_fields(fields: SpeechFields, limits: SpeechLimits) -> None:
    """The checks that need no model: every text field's length and Unicode, and speed.

    Every surface passes here (native, OpenAI, upstream-compatible, WebSocket), so no field
    reaches the engine unbounded whatever the surface's own schema says.
    """
    check_length(fields.text, fields.text_param, limits.max_text_chars, code="text_too_long")
    check_length(fields.voice, fields.voice_param, NAME_MAX_CHARS)
    check_length(fields.prompt_text, "prompt_text", PROMPT_TEXT_MAX_CHARS)
    check_length(fields.instructions, fields.instructions_param, INSTRUCTIONS_MAX_CHARS)
    if not SPEED_MIN <= fields.speed <= SPEED_MAX:
        raise BadRequest("invalid_speed", f"speed must be between {SPEED_MIN} and {SPEED_MAX}; got {fields.speed}",
                         param="speed")


def check_first_chunk(fields: SpeechFields, info: EngineInfo) -> None:
    """``first_chunk_tokens``: streamed requests only, within the loaded model's range (``EngineInfo``)."""
    tokens = fields.first_chunk_tokens
    if tokens is None:
        return
    if not fields.stream:
        raise BadRequest("invalid_first_chunk_tokens", "first_chunk_tokens sizes the first chunk of a stream; "
                         "send stream: true, or leave it out", param="first_chunk_tokens")
    if info.first_chunk_tokens is None:
        raise BadRequest("invalid_first_chunk_tokens", "this server's model cannot change its first chunk "
                         "(CosyVoice2/3 with engine.batching can); leave first_chunk_tokens out",
                         param="first_chunk_tokens")
    low, high = info.first_chunk_tokens
    if not low <= tokens <= high:
        raise BadRequest("invalid_first_chunk_tokens", f"first_chunk_tokens must be between {low} and {high} on "
                         f"this model; got {tokens}", param="first_chunk_tokens")


def plan(fields: SpeechFields, info: EngineInfo, presets: Sequence[str], limits: SpeechLimits,
         library: Callable[[str], Any | None] = lambda name: None,
         known_library: Callable[[], list[str]] = list) -> Plan:
    """The synthesis request for ``fields`` on the loaded model (raises BadRequest)."""
    check_fields(fields, limits)
    check_first_chunk(fields, info)
    fields.instructions = (fields.instructions or "").strip() or None
    voice = resolve_voice(fields.voice, presets, library, known_library, fields.aliases)
    mode = choose_mode(fields, voice, info.modes)
    speaker = voice.speaker
    if mode in ("sft", "instruct") and speaker is None:
        if not presets:
            raise BadRequest("voice_required", "this model has no preset speakers; send prompt audio or name a "
                             "registered voice", param="voice")
        speaker = presets[0]
    used = fields.instructions if mode in _USES_INSTRUCTIONS else None
    request = SynthesisRequest(
        text=fields.text, mode=mode, speaker=speaker, voice=voice.library, prompt_text=fields.prompt_text,
        prompt_audio=fields.prompt_audio, instruct_text=used, source_audio=fields.source_audio,
        speed=fields.speed, stream=fields.stream, seed=fields.seed, normalize=fields.normalize,
        first_chunk_tokens=fields.first_chunk_tokens, priority=fields.priority,
    )
    return Plan(request, instructions_ignored=fields.instructions is not None and used is None)
