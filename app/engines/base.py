"""The engine contract: what the serving layer may assume about a TTS engine.

Engines are synchronous on purpose: the pool owns the threads. Every method is
called from the engine's own slot thread (``load``/``warmup``/``close`` once;
``info`` and ``voices`` once, right after ``warmup``, and kept by the pool;
``synthesize`` once per request). Engines raise only the domain errors defined
here, never HTTP errors.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

from app.engines.timings import StageTimings
from app.text.stream import TextStream

Mode = Literal["sft", "zero_shot", "cross_lingual", "instruct", "instruct2", "vc"]
MODES: tuple[str, ...] = ("sft", "zero_shot", "cross_lingual", "instruct", "instruct2", "vc")
PROMPT_RATE = 16000  # prompt and source audio go to the model at this rate (uploads are decoded to it)
SPEED_MIN, SPEED_MAX = 0.25, 4.0  # the speed factors an engine accepts
PROMPT_MIN_S, PROMPT_MAX_S = 1.0, 30.0  # prompt and source audio, seconds


class EngineError(Exception):
    """Base class for errors an engine may raise."""


class InvalidInput(EngineError):
    """The request cannot be served as asked; the message says what to change."""


class EngineFailure(EngineError):
    """The engine failed while serving a valid request (a server-side fault)."""


class Cancelled(EngineError):
    """Raised by an engine that noticed its cancel flag (optional; engines may also just stop)."""


@dataclass(frozen=True)
class PromptAudio:
    """Prompt audio as mono float32 samples in [-1, 1] at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / float(self.sample_rate)


@dataclass
class SynthesisRequest:
    """One synthesis job, already validated at the HTTP layer for shape and ranges."""

    text: str = ""
    mode: Mode = "sft"
    speaker: str | None = None
    prompt_text: str | None = None
    prompt_audio: PromptAudio | None = None
    instruct_text: str | None = None
    source_audio: PromptAudio | None = None  # vc: the speech to convert
    voice: object | None = None  # a stored voice's engine-ready features (voices library)
    speed: float = 1.0
    stream: bool = False
    request_id: str = ""
    seed: int | None = None  # fixes the LLM's sampling (same seed, same text -> same speech tokens)
    text_stream: TextStream | None = None  # text arriving over time (WebSocket); then ``text`` is unused
    normalize: bool | None = None  # text normalization (numbers, dates -> words); None: the engine's default
    first_chunk_tokens: int | None = None  # streaming: the first chunk's speech tokens (EngineInfo's bounds)
    priority: str = "interactive"  # traffic class (app/serving/admission/classes.py): "bulk" yields to interactive work
    timings: StageTimings = field(default_factory=StageTimings, repr=False, compare=False)  # filled while it runs


@dataclass(frozen=True)
class AudioChunk:
    """Mono int16 PCM at the engine's native sample rate."""

    pcm: np.ndarray  # dtype int16, shape (n,)
    sample_rate: int
    segment: int = 0  # which piece of the request's text (sentence, in order) this audio speaks

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / float(self.sample_rate)

    def to_bytes(self) -> bytes:
        return np.ascontiguousarray(self.pcm, dtype="<i2").tobytes()


@dataclass(frozen=True)
class EngineInfo:
    """What an engine can do; used for validation, /v1/models and readiness detail."""

    name: str
    family: str  # "cosyvoice1" | "cosyvoice2" | "cosyvoice3" | "fake"
    sample_rate: int
    modes: tuple[str, ...]
    tiny: bool = False
    voice_family: str = ""  # stored voice features are only usable by engines with the same value
    first_chunk_tokens: tuple[int, int] | None = None  # (lowest, highest) first streamed chunk; None: not settable
    device: str = "cpu"  # where it computes: "cpu" or an accelerator ("cuda", "cuda:1"); sizes admission
    fingerprint: str = ""  # the model's files (e.g. their sizes and first MiB): answers cached for it are its own


@runtime_checkable
class Engine(Protocol):
    sample_rate: int

    def info(self) -> EngineInfo: ...

    def load(self) -> None: ...

    def warmup(self) -> None: ...

    def voices(self) -> Sequence[str]: ...

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]: ...

    def health_check(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class BulkRoomAware(Protocol):
    """Engines that schedule traffic classes themselves (optional; others ignore ``priority``).

    The pool calls ``set_bulk_room(fn)`` once; ``fn()`` (cheap, thread-safe, called from engine
    threads) says how many bulk requests may compute now, recomputed as interactive load changes.
    The batched CosyVoice2/3 path steps bulk LLM rows only within it (docs/batching.md).
    """

    def set_bulk_room(self, fn: Callable[[], int | None] | None) -> None: ...


@runtime_checkable
class VoiceCapable(Protocol):
    """Engines that can turn a prompt into reusable zero-shot features (the voice library)."""

    def compute_voice(self, prompt_text: str, audio: PromptAudio) -> object: ...

    def export_voice(self, voice: object) -> bytes: ...

    def import_voice(self, data: bytes) -> object: ...


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """Clip float audio in [-1, 1] to int16 PCM, mapping NaN/inf to silence/limits."""
    x = np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def check_mode_inputs(req: SynthesisRequest, modes: Sequence[str], speakers: Sequence[str]) -> None:
    """Validation shared by engines: the checks that need to know what the model can do."""
    if req.mode not in MODES:
        raise InvalidInput(f"unknown mode {req.mode!r}; use one of {', '.join(MODES)}")
    if req.mode not in modes:
        raise InvalidInput(
            f"mode {req.mode!r} is not supported by the loaded model; it supports: {', '.join(modes)}"
        )
    if req.text_stream is not None and req.mode == "vc":
        raise InvalidInput("mode 'vc' converts audio and cannot take streamed text")
    if req.mode != "vc" and req.text_stream is None and not (req.text or "").strip():
        raise InvalidInput("text is empty; send the text to speak in 'text'")
    if not (SPEED_MIN <= req.speed <= SPEED_MAX):
        raise InvalidInput(f"speed must be between {SPEED_MIN} and {SPEED_MAX}")
    if req.mode in ("sft", "instruct"):
        if not req.speaker:
            raise InvalidInput(f"mode {req.mode!r} needs a preset 'speaker'; known: {', '.join(speakers) or 'none'}")
        if req.speaker not in speakers:
            raise InvalidInput(
                f"unknown speaker {req.speaker!r}; known speakers: {', '.join(speakers) or 'none'}"
            )
    if req.mode in ("instruct", "instruct2") and not (req.instruct_text or "").strip():
        raise InvalidInput(f"mode {req.mode!r} needs 'instruct_text'")
    needs_prompt = req.mode in ("zero_shot", "cross_lingual", "instruct2", "vc")
    if needs_prompt and req.prompt_audio is None and req.voice is None:
        raise InvalidInput(f"mode {req.mode!r} needs prompt audio (upload 'prompt_audio') or a registered voice")
    if req.mode == "zero_shot" and req.voice is None and not (req.prompt_text or "").strip():
        raise InvalidInput("mode 'zero_shot' needs 'prompt_text': the transcript of the prompt audio")
    if req.mode == "vc" and req.source_audio is None:
        raise InvalidInput("mode 'vc' needs 'source_audio': the speech to convert")
    for name, audio in (("prompt audio", req.prompt_audio), ("source audio", req.source_audio)):
        if audio is not None:
            if audio.duration_s < PROMPT_MIN_S:
                raise InvalidInput(f"{name} is {audio.duration_s:.2f} s long; send {PROMPT_MIN_S:g} to "
                                   f"{PROMPT_MAX_S:g} seconds of speech")
            if audio.duration_s > PROMPT_MAX_S:
                raise InvalidInput(f"{name} is {audio.duration_s:.1f} s long; send {PROMPT_MIN_S:g} to "
                                   f"{PROMPT_MAX_S:g} seconds of speech")
