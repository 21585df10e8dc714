"""What a cached answer is, and its key: a hash of everything that determines its bytes.

The key covers the model (its files' fingerprint and every engine setting: precision, runtime,
steps, batching, normalisation...), the voice (a preset's name, a library voice's stored audio
hash and registration time, an upload's decoded samples), the text and transcript as sent,
every parameter, the seed, and the output (format, rate, streamed or whole: a streamed answer
comes from the engine's streaming mode, whose chunked flow differs from the whole answer's).
It names no secret: a tenant partition is the API key's id (a short hash), never the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engines.base import PromptAudio, SynthesisRequest
from app.serving.encoded import OutputSpec

KEY_VERSION = 1
CHUNK_OVERHEAD = 64  # bytes counted per stored chunk besides its data (the list slot, the bytes header)
ENTRY_OVERHEAD = 512  # ... and per answer (the object, its key)


@dataclass(frozen=True)
class Answer:
    """A stored answer: its encoded bytes as sent (one chunk per piece for a stream) and what describes them."""

    media_type: str
    sample_rate: int
    audio_s: float
    chunks: tuple[bytes, ...]

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self.chunks)

    @property
    def size(self) -> int:
        """What it costs the memory tier: its bytes and a fixed overhead per chunk and per answer."""
        return self.nbytes + CHUNK_OVERHEAD * len(self.chunks) + ENTRY_OVERHEAD


def _audio_id(audio: PromptAudio | None) -> str | None:
    if audio is None:
        return None
    samples = np.ascontiguousarray(audio.samples)
    h = hashlib.sha256(f"{audio.sample_rate}:{samples.dtype.str}:{samples.shape}".encode())
    h.update(samples.tobytes())
    return h.hexdigest()


def request_parts(req: SynthesisRequest, voice_id: str | None) -> dict[str, Any]:
    """Everything of the synthesis request that the audio depends on, seed excluded."""
    return {
        "text": req.text, "mode": req.mode, "speaker": req.speaker, "voice": voice_id,
        "prompt_text": req.prompt_text, "prompt_audio": _audio_id(req.prompt_audio),
        "source_audio": _audio_id(req.source_audio), "instruct": req.instruct_text, "speed": req.speed,
        "stream": req.stream, "normalize": req.normalize, "first_chunk_tokens": req.first_chunk_tokens,
    }


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def derived_seed(model: str, parts: dict[str, Any]) -> int:
    """A seed fixed by the request itself (``cache.derive_seed``): the same request, the same seed."""
    return int(_digest({"model": model, "request": parts, "use": "seed"})[:8], 16)


def answer_key(model: str, parts: dict[str, Any], seed: int, out: OutputSpec, tenant: str | None) -> str:
    """The key of one answer (hex sha256)."""
    return _digest({"v": KEY_VERSION, "model": model, "tenant": tenant, "request": parts, "seed": seed,
                    "format": out.format.name, "rate": out.sample_rate, "streamed": out.stream})
