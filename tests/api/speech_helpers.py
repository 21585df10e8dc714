"""Helpers for the speech surfaces' tests: real-decoder checks, SSE parsing, recording fakes.

Shared by tests/api/test_openai_api.py, test_compat_api.py and
tests/integration/test_openai_sdk.py.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import av
import numpy as np
import soundfile as sf
from fastapi.testclient import TestClient

from app.engines.fake import FakeBehaviour, FakeEngine
from app.main import create_app
from tests.api.conftest import make_settings

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}


def decode(data: bytes, fmt: str) -> tuple[int, int]:
    """(sample rate, samples) of a response body, read with real decoders."""
    if fmt == "pcm":
        assert len(data) % 2 == 0
        return 24000, len(data) // 2
    if fmt in ("wav", "flac"):
        audio, rate = sf.read(io.BytesIO(data), dtype="int16")
        sf_result = (rate, len(audio))
    n, rate = 0, 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            n, rate = n + frame.samples, frame.sample_rate
    if fmt in ("wav", "flac"):
        assert (rate, n) == sf_result, (fmt, (rate, n), sf_result)
    return rate, n


def prompt_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    """A 16-bit mono WAV tone, usable as prompt audio."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 180 * t), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def slack_s(fmt: str, rate: int) -> float:
    """Codec priming + padding to a whole frame (ADTS AAC and streamed mp3 cannot signal it)."""
    return {"aac": 2048 / rate, "mp3": (1105 + 1152) / rate}.get(fmt, 0.0)


def expected_rate(fmt: str, native: int) -> int:
    return {"opus": 48000, "pcm": 24000}.get(fmt, native)


def check_audio(data: bytes, fmt: str, native_rate: int, seconds: float) -> None:
    rate, n = decode(data, fmt)
    assert rate == expected_rate(fmt, native_rate), (fmt, rate)
    duration = n / rate
    assert seconds - 0.005 <= duration <= seconds + 0.005 + slack_s(fmt, rate), (fmt, duration, seconds)


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block[:80]
            events.append(json.loads(block[len("data: "):]))
    return events


def sse_audio(events: list[dict[str, Any]]) -> bytes:
    assert events and events[-1]["type"] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


def duration_of(b: FakeBehaviour, speed: float = 1.0) -> float:
    return b.chunks * int(b.chunk_s * b.sample_rate / speed) / b.sample_rate


class RecordingEngine(FakeEngine):
    """A FakeEngine that keeps every SynthesisRequest it is given."""

    def __init__(self, behaviour: FakeBehaviour, seen: list) -> None:
        super().__init__(behaviour)
        self.seen = seen

    def synthesize(self, req, cancel):
        self.seen.append(req)
        yield from super().synthesize(req, cancel)


class StubLibrary:
    """Stands in for the voice library: names() and features(name, family)."""

    def __init__(self, *names: str) -> None:
        self._names = list(names)

    def names(self) -> list[str]:
        return list(self._names)

    def features(self, name: str, family: str) -> Any:
        return {"voice": name} if name in self._names else None


def client_maker(stack: ExitStack, tmp_path, behaviour: FakeBehaviour, seen: list) -> Callable[..., TestClient]:
    """``make(pool=None, **behaviour_fields)``: a started TestClient over RecordingEngines.

    Behaviour fields are set before the engines are built (``sample_rate`` is read then).
    """

    def make(pool: dict | None = None, **fields: Any) -> TestClient:
        for key, value in fields.items():
            setattr(behaviour, key, value)
        settings = make_settings(tmp_path, **(pool or {}))
        app = create_app(settings, engine_factory=lambda i: RecordingEngine(behaviour, seen))
        client = stack.enter_context(TestClient(app))
        stack.callback(lambda: behaviour.gate.set() if behaviour.gate is not None else None)
        return client

    return make
