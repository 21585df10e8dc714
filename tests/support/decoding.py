"""Response audio read back with real decoders: formats, sample rates and durations."""

from __future__ import annotations

import io

import av
import soundfile as sf

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
