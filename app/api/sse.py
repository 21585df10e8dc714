"""Server-Sent Events framing for OpenAI's ``stream_format="sse"`` speech responses.

Each piece of encoded audio becomes one ``speech.audio.delta`` event carrying it in
base64; the stream ends with one ``speech.audio.done`` event carrying usage::

    data: {"type":"speech.audio.delta","audio":"<base64>"}

    data: {"type":"speech.audio.done","usage":{"input_tokens":N,"output_tokens":N,"total_tokens":N}}

Decoding the deltas in order and concatenating them gives the same file as
``stream_format="audio"``.

Usage is an estimate, documented as such: we have no text tokenizer at the HTTP
layer, so ``input_tokens`` counts words and CJK characters of input plus
instructions; ``output_tokens`` is the number of speech tokens the model produces
for the audio (25 per second for CosyVoice 2/3, 50 for CosyVoice 1).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

from app.text.scripts import CJK

_TOKEN = re.compile(rf"[{CJK}]|[^\W{CJK}]+|[^\w\s]")  # one CJK character, a word, a punctuation mark

SSE_MEDIA_TYPE = "text/event-stream"
SSE_HEADERS = {"X-Accel-Buffering": "no"}


def estimate_text_tokens(*texts: str | None) -> int:
    """Words, CJK characters and punctuation marks: a tokenizer-free estimate."""
    return sum(len(_TOKEN.findall(t)) for t in texts if t)


def speech_tokens_per_second(family: str) -> int:
    return 50 if family == "cosyvoice1" else 25


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


def speech_sse_sink(input_tokens: int, tokens_per_second: float,
                    audio_seconds: Callable[[], float]) -> Callable[[bytes, bool], bytes]:
    """A ``chunk_sink`` for :func:`app.api.respond.synthesize`.

    ``audio_seconds()`` is read once, at the final call, for the usage numbers.
    """

    def sink(data: bytes, final: bool) -> bytes:
        out = b""
        if data:
            out += sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        if final:
            output_tokens = round(audio_seconds() * tokens_per_second)
            usage = {"input_tokens": input_tokens, "output_tokens": output_tokens,
                     "total_tokens": input_tokens + output_tokens}
            out += sse_event({"type": "speech.audio.done", "usage": usage})
        return out

    return sink
