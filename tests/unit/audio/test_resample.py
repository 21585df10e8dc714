"""app.audio.resample: whole-buffer and streaming sample-rate conversion."""

from __future__ import annotations

from math import gcd

import numpy as np
import pytest
from scipy.signal import resample_poly

from app.audio.resample import (
    StreamResampler,
    as_mono_int16,
    resample_float,
    resample_int16,
)

RATE_PAIRS = [(22050, 48000), (24000, 48000), (24000, 16000), (44100, 16000), (22050, 24000), (48000, 22050)]


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 4000).astype(np.int16)


def _tone(rate: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype(np.int16)


def _stream(rs: StreamResampler, x: np.ndarray, sizes) -> np.ndarray:
    out, i = [], 0
    for size in sizes:
        if i >= len(x):
            break
        out.append(rs.process(x[i : i + size]))
        i += size
    out.append(rs.process(x[i:]))
    out.append(rs.flush())
    return np.concatenate(out)


def _dominant_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(len(x))))
    return float(np.argmax(spec)) * rate / len(x)


@pytest.mark.parametrize("src,dst", RATE_PAIRS)
def test_resample_int16_matches_resample_poly(src, dst):
    x = _noise(src)
    y = resample_int16(x, src, dst)
    g = gcd(src, dst)
    ref = resample_poly(x.astype(np.float64), dst // g, src // g)
    assert y.dtype == np.int16
    assert len(y) == -(-len(x) * dst // src) == len(ref)
    assert np.abs(y.astype(np.float64) - ref).max() <= 0.51


@pytest.mark.parametrize("src,dst", RATE_PAIRS)
def test_stream_equals_whole_for_random_chunking(src, dst):
    x = _noise(int(src * 1.3), seed=1)
    sizes = np.random.default_rng(2).integers(1, src // 5, size=200)
    y = _stream(StreamResampler(src, dst), x, sizes)
    whole = resample_int16(x, src, dst)
    assert y.dtype == np.int16
    assert len(y) == len(whole)
    assert np.abs(y.astype(np.int32) - whole).max() <= 1


def test_stream_tiny_chunks_and_empty_chunks():
    x = _noise(3000, seed=3)
    rs = StreamResampler(24000, 16000)
    out = []
    for i in range(0, len(x), 7):
        out.append(rs.process(x[i : i + 7]))
        out.append(rs.process(np.zeros(0, np.int16)))
    out.append(rs.flush())
    y = np.concatenate(out)
    assert np.abs(y.astype(np.int32) - resample_int16(x, 24000, 16000)).max() <= 1


def test_stream_has_no_clicks_at_chunk_boundaries():
    src, dst = 22050, 48000
    x = _tone(src, 1.0)
    chunk = int(src * 0.2)
    y = _stream(StreamResampler(src, dst), x, [chunk] * 10)
    # A 440 Hz sine at amplitude A moves at most 2*pi*f/rate*A per sample: no jump may exceed it.
    body = y[dst // 10 : -dst // 10].astype(np.float64)
    max_step = 2 * np.pi * 440 / dst * 0.5 * 32767
    assert np.abs(np.diff(body)).max() <= max_step * 1.05
    assert abs(_dominant_hz(body, dst) - 440) < 5


def test_stream_float_input_gives_float32():
    x = np.sin(np.arange(4800) / 10.0).astype(np.float32) * 0.5
    rs = StreamResampler(24000, 48000)
    y = np.concatenate([rs.process(x[:1000]), rs.process(x[1000:]), rs.flush()])
    assert y.dtype == np.float32
    ref = resample_float(x, 24000, 48000)
    assert len(y) == len(ref) == 9600
    assert np.abs(y - ref).max() < 1e-4


def test_passthrough_and_flush_rules():
    x = _noise(1000)
    rs = StreamResampler(24000, 24000)
    y = rs.process(x)
    assert np.array_equal(y, x) and y is not x
    assert len(rs.flush()) == 0
    with pytest.raises(RuntimeError):
        rs.process(x)
    assert len(StreamResampler(22050, 48000).flush()) == 0
    same = resample_int16(x, 16000, 16000)
    assert np.array_equal(same, x) and same is not x


def test_empty_input_and_bad_rates():
    assert len(resample_int16(np.zeros(0, np.int16), 24000, 16000)) == 0
    with pytest.raises(ValueError):
        resample_int16(_noise(10), 0, 16000)
    with pytest.raises(ValueError):
        StreamResampler(24000, -1)


def test_as_mono_int16_conversions():
    assert as_mono_int16(np.zeros((5, 1), np.int16)).shape == (5,)
    f = as_mono_int16(np.array([0.0, 1.0, -1.0, 2.0, np.nan], np.float32))
    assert f.dtype == np.int16 and f.tolist() == [0, 32767, -32767, 32767, 0]
    with pytest.raises(ValueError):
        as_mono_int16(np.zeros((5, 2), np.int16))
    with pytest.raises(ValueError):
        as_mono_int16(np.zeros(5, np.int64))


def test_odd_rate_pairs_use_a_bounded_filter():
    x = _noise(44101, seed=4)
    y = resample_int16(x, 44101, 16000)  # gcd 1: approximated ratio, not a 1.7M-tap filter
    assert abs(len(y) - 16000) <= 1
    rs = StreamResampler(44101, 16000)
    assert rs.up <= 4096 and rs.down <= 4096
    with pytest.raises(ValueError):
        StreamResampler(771775937, 16000)
