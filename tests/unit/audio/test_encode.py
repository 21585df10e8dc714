"""app.audio.encode / formats: every format, whole and streaming, checked with real decoders."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf

from app.audio import (
    FORMAT_NAMES,
    UnsupportedFormat,
    encode_whole,
    make_encoder,
    resolve_format,
)
from app.audio.resample import resample_int16

SECONDS = 2.0
CHUNK_S = 0.2
RATES = (22050, 24000)
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
    "wav_mulaw": "audio/wav",
    "wav_alaw": "audio/wav",
}
G711 = ("mulaw", "alaw", "wav_mulaw", "wav_alaw")


def tone(rate: int, seconds: float = SECONDS, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype(np.int16)


def chunks(x: np.ndarray, rate: int, seconds: float = CHUNK_S) -> list[np.ndarray]:
    n = int(rate * seconds)
    return [x[i : i + n] for i in range(0, len(x), n)]


def av_decode(data: bytes, fmt: str | None = None) -> tuple[np.ndarray, int]:
    """Decode with FFmpeg; returns (mono float samples, rate). Raw G.711 (``fmt`` mulaw/alaw) is 8 kHz."""
    parts, rate = [], 0
    raw = {"format": fmt, "options": {"sample_rate": "8000"}} if fmt in ("mulaw", "alaw") else {}
    with av.open(io.BytesIO(data), **raw) as c:
        for frame in c.decode(audio=0):
            rate = frame.sample_rate
            a = frame.to_ndarray().astype(np.float64)
            if frame.format.is_planar:
                parts.append(a[0])
            else:
                parts.append(a.reshape(-1))
    return (np.concatenate(parts) if parts else np.zeros(0)), rate


def dominant_hz(x: np.ndarray, rate: int) -> float:
    mid = x[len(x) // 4 : len(x) // 4 + rate // 2]  # 0.5 s from the steady part
    spec = np.abs(np.fft.rfft(mid * np.hanning(len(mid))))
    return float(np.argmax(spec)) * rate / len(mid)


def slack_s(fmt: str, rate: int) -> float:
    """Extra decoded length a codec may add: encoder priming + padding to a whole frame.

    ADTS AAC cannot signal its 1024-sample priming, and a streamed mp3 has no
    LAME tag, so decoders return those samples; Ogg Opus, FLAC, WAV are exact.
    """
    return {"aac": 2048 / rate, "mp3": (1105 + 1152) / rate}.get(fmt, 0.0)


def expected_rate(fmt: str, rate: int) -> int:
    return 48000 if fmt == "opus" else 8000 if fmt in G711 else rate


def run_encoder(fmt: str, rate: int, stream: bool, x: np.ndarray, **kw) -> tuple[list[bytes], object]:
    enc = make_encoder(fmt, rate, stream=stream, **kw)
    outs = [enc.feed(c) for c in chunks(x, rate)]
    outs.append(enc.finish())
    return outs, enc


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_roundtrip_rate_duration_pitch(fmt, rate, stream):
    x = tone(rate)
    outs, enc = run_encoder(fmt, rate, stream, x)
    data = b"".join(outs)
    assert enc.content_type == CONTENT_TYPES[fmt]
    assert enc.sample_rate == expected_rate(fmt, rate)
    if fmt == "pcm":
        y, got_rate = np.frombuffer(data, "<i2").astype(np.float64), enc.sample_rate
        assert np.array_equal(y, x)
    else:
        y, got_rate = av_decode(data, fmt)
    assert got_rate == expected_rate(fmt, rate)
    duration = len(y) / got_rate
    assert SECONDS - 0.05 <= duration <= SECONDS + 0.05 + slack_s(fmt, rate), duration
    assert abs(dominant_hz(y, got_rate) - 440) < 10
    if fmt in ("wav", "flac"):
        assert np.array_equal(y, x)  # lossless: bit-exact through FFmpeg
        if not stream or fmt == "wav":
            # libsndfile too. (It cannot read a *streamed* FLAC: its STREAMINFO must say
            # "length unknown", and libsndfile 1.2 then fails with "psf_fseek() failed".)
            sy, sr_ = sf.read(io.BytesIO(data), dtype="int16")
            assert sr_ == rate and np.array_equal(sy, x)


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_streaming_first_bytes_leave_with_first_chunk(fmt, rate):
    enc = make_encoder(fmt, rate, stream=True)
    x = tone(rate, 1.0)
    first = enc.feed(x[: int(rate * CHUNK_S)])
    # Every format emits on the first 0.2 s chunk (FLAC/mp3 frames are <= 2304/1152 samples).
    assert len(first) > 0
    so_far = first + enc.feed(x[int(rate * CHUNK_S) : int(rate * 0.5)])
    if fmt != "pcm":
        y, got_rate = av_decode(so_far, fmt)  # what a client has after 0.5 s of audio fed
        assert got_rate == enc.sample_rate
        assert len(y) / got_rate > 0.25
    enc.close()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_streaming_bytes_keep_flowing(fmt):
    rate = 24000
    outs, _ = run_encoder(fmt, rate, True, tone(rate))
    assert all(len(o) > 0 for o in outs[:-1]), [len(o) for o in outs]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_whole_mode_emits_everything_at_finish(fmt):
    outs, _ = run_encoder(fmt, 24000, False, tone(24000, 0.6))
    assert all(o == b"" for o in outs[:-1]) and outs[-1]


@pytest.mark.parametrize("rate", RATES)
def test_wav_whole_header_is_exact(rate):
    x = tone(rate, 0.7)
    data, ctype = encode_whole(chunks(x, rate), "wav", rate)
    assert ctype == "audio/wav"
    riff, size, wave, fmt_, fmt_len, tag, ch, sr_, byte_rate, align, bits, data_id, data_len = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", data[:44]
    )
    assert (riff, wave, fmt_, data_id) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert (fmt_len, tag, ch, sr_, byte_rate, align, bits) == (16, 1, 1, rate, rate * 2, 2, 16)
    assert data_len == 2 * len(x) and size == 36 + data_len == len(data) - 8
    assert data[44:] == x.astype("<i2").tobytes()


@pytest.mark.parametrize("rate", RATES)
def test_wav_stream_header_has_unknown_sizes_and_decodes(rate):
    x = tone(rate)
    outs, _ = run_encoder("wav", rate, True, x)
    first = outs[0]
    assert first[:4] == b"RIFF" and first[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", first[4:8])[0] == 0xFFFFFFFF
    assert first[36:40] == b"data" and struct.unpack("<I", first[40:44])[0] == 0xFFFFFFFF
    assert len(first) == 44 + 2 * int(rate * CHUNK_S)
    assert all(len(o) == 2 * len(c) for o, c in zip(outs[1:-1], chunks(x, rate)[1:]))
    data = b"".join(outs)
    y, got_rate = av_decode(data)
    assert got_rate == rate and len(y) == len(x)
    with sf.SoundFile(io.BytesIO(data)) as f:  # libsndfile reads it too
        assert f.samplerate == rate
        assert np.array_equal(f.read(dtype="int16"), x)


def test_wav_stream_finish_without_audio_still_sends_header():
    assert len(make_encoder("wav", 24000, stream=True).finish()) == 44
    whole = make_encoder("wav", 24000, stream=False).finish()
    assert len(whole) == 44 and struct.unpack("<I", whole[40:44])[0] == 0


def test_pcm_out_rate_resamples():
    x = tone(24000)
    outs, enc = run_encoder("pcm", 24000, True, x, out_rate=16000)
    y = np.frombuffer(b"".join(outs), "<i2")
    assert enc.sample_rate == 16000 and enc.content_type == "audio/pcm"
    assert len(y) == len(x) * 2 // 3
    assert np.abs(y.astype(np.int32) - resample_int16(x, 24000, 16000)).max() <= 1


@pytest.mark.parametrize("fmt,out_rate,expect", [("mp3", 44100, 44100), ("mp3", 20000, 22050), ("aac", 16000, 16000),
                                                 ("opus", 16000, 48000), ("flac", 16000, 16000), ("wav", 8000, 8000)])
def test_out_rate(fmt, out_rate, expect):
    data, _ = encode_whole([tone(24000, 0.5)], fmt, 24000, out_rate=out_rate)
    y, got_rate = av_decode(data)
    assert got_rate == expect
    assert 0.45 <= len(y) / got_rate <= 0.55 + slack_s(fmt, got_rate)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_tiny_chunks(fmt):
    rate = 22050
    x = tone(rate, 1.0)
    enc = make_encoder(fmt, rate, stream=True)
    data = b"".join(enc.feed(x[i : i + 100]) for i in range(0, len(x), 100)) + enc.finish()
    y, got_rate = av_decode(data)
    assert 0.95 <= len(y) / got_rate <= 1.05 + slack_s(fmt, got_rate)


def test_encode_whole_equals_manual_and_accepts_float():
    x = tone(24000, 0.5)
    data, ctype = encode_whole(iter(chunks(x, 24000)), "flac", 24000)
    assert ctype == "audio/flac" and data[:4] == b"fLaC"
    fdata, _ = encode_whole([x.astype(np.float32) / 32767.0], "wav", 24000)
    y, _ = sf.read(io.BytesIO(fdata), dtype="int16")
    assert np.abs(y.astype(np.int32) - x).max() <= 1


def test_lifecycle_errors():
    enc = make_encoder("mp3", 24000, stream=True)
    enc.feed(tone(24000, 0.1))
    enc.finish()
    with pytest.raises(RuntimeError):
        enc.feed(tone(24000, 0.1))
    with pytest.raises(RuntimeError):
        enc.finish()
    enc2 = make_encoder("opus", 24000, stream=True)
    enc2.feed(tone(24000, 0.3))
    enc2.close()
    enc2.close()
    with pytest.raises(RuntimeError):
        enc2.finish()
    with pytest.raises(ValueError):
        make_encoder("wav", 24000, stream=True).feed(np.zeros((10, 2), np.int16))
    with pytest.raises(ValueError):
        make_encoder("wav", 0, stream=True)


def test_resolve_format():
    assert resolve_format(" MP3 ").name == "mp3"
    assert resolve_format("opus").content_type == "audio/ogg"
    assert resolve_format("aac").extension == "aac"
    with pytest.raises(UnsupportedFormat) as err:
        resolve_format("ogg-vorbis")
    assert isinstance(err.value, ValueError)
    for name in FORMAT_NAMES:
        assert name in str(err.value)
    with pytest.raises(UnsupportedFormat):
        make_encoder("m4a", 24000, stream=False)


def test_format_rate_table():
    assert resolve_format("opus").output_rate(22050) == 48000
    assert resolve_format("mp3").output_rate(22050) == 22050
    assert resolve_format("mp3").output_rate(24000) == 24000
    assert resolve_format("aac").output_rate(22050) == 22050
    assert resolve_format("mp3").output_rate(96000) == 48000
    assert resolve_format("flac").output_rate(22050) == 22050
