"""Response audio read back with real decoders: formats, sample rates and durations."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
G711_FORMATS = ("mulaw", "alaw", "wav_mulaw", "wav_alaw")  # 8 kHz, for phone lines
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm", "mulaw": "audio/basic", "alaw": "audio/x-alaw-basic",
                 "wav_mulaw": "audio/wav", "wav_alaw": "audio/wav"}


def decode_g711(data: bytes, fmt: str) -> np.ndarray:
    """int16 samples of a G.711 body, read by FFmpeg (raw: as 8 kHz mulaw/alaw; WAV: as found, and by
    libsndfile too); asserts 8 kHz mono."""
    raw = {"format": fmt, "options": {"sample_rate": "8000"}} if fmt in ("mulaw", "alaw") else {}
    with av.open(io.BytesIO(data), **raw) as container:
        codec = container.streams.audio[0].codec_context.name
        frames = list(container.decode(audio=0))
    assert codec == "pcm_" + fmt.removeprefix("wav_"), codec
    assert {(f.sample_rate, len(f.layout.channels)) for f in frames} <= {(8000, 1)}
    y = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.int16)
    if fmt.startswith("wav_"):
        sy, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert rate == 8000 and np.array_equal(sy, y)
    return y


def decode(data: bytes, fmt: str) -> tuple[int, int]:
    """(sample rate, samples) of a response body, read with real decoders."""
    if fmt == "pcm":
        assert len(data) % 2 == 0
        return 24000, len(data) // 2
    if fmt in G711_FORMATS:
        return 8000, len(decode_g711(data, fmt))
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
    return 8000 if fmt in G711_FORMATS else {"opus": 48000, "pcm": 24000}.get(fmt, native)


def check_audio(data: bytes, fmt: str, native_rate: int, seconds: float) -> None:
    rate, n = decode(data, fmt)
    assert rate == expected_rate(fmt, native_rate), (fmt, rate)
    duration = n / rate
    assert seconds - 0.005 <= duration <= seconds + 0.005 + slack_s(fmt, rate), (fmt, duration, seconds)
