"""app.audio.g711 and the G.711 formats: known code values, FFmpeg's decoders, WAV headers, streaming."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf

from app.audio import encode_whole, g711, make_encoder, resolve_format
from app.audio.resample import resample_int16

ALL = np.arange(-32768, 32768, dtype=np.int16)
CODECS = {"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}


def ffmpeg_decode(codes: bytes, law: str) -> np.ndarray:
    """G.711 bytes through FFmpeg's own decoder."""
    ctx = av.CodecContext.create(CODECS[law], "r")
    ctx.sample_rate, ctx.layout = 8000, "mono"
    return np.concatenate([f.to_ndarray().reshape(-1) for f in ctx.decode(av.Packet(codes))])


def codes_of(law: str, *values: int) -> list[int]:
    return g711.encode(np.array(values, np.int16), law).tolist()


def test_mulaw_known_codes():
    # 0 -> 0xFF (positive zero); full scale -> 0x80 / 0x00; one's complement: -1 is the negative zero.
    assert codes_of("mulaw", 0, 1, 3, -1, -4, 32767, -32768, 32124, -32124) == [
        0xFF, 0xFF, 0xFF, 0x7F, 0x7F, 0x80, 0x00, 0x80, 0x00]
    # Segment edges (14-bit magnitude + 33 reaching 64, 128): 0xEF starts segment 1, 0xDF segment 2.
    assert codes_of("mulaw", 4 * 30, 4 * 31, 4 * 94, 4 * 95) == [0xF0, 0xEF, 0xE0, 0xDF]
    assert g711.decode(bytes([0xFF, 0x7F, 0x80, 0x00, 0xF0]), "mulaw").tolist() == [0, 0, 32124, -32124, 120]


def test_alaw_known_codes():
    # 0 -> 0xD5; full scale -> 0xAA / 0x2A; the 13-bit magnitude steps by 16 in segments 0 and 1.
    assert codes_of("alaw", 0, 15, -1, 16, 32767, -32768, 32256, -32256) == [
        0xD5, 0xD5, 0x55, 0xD4, 0xAA, 0x2A, 0xAA, 0x2A]
    assert codes_of("alaw", 16 * 31, 16 * 32) == [0x80 | (0x1F ^ 0x55), 0x80 | (0x20 ^ 0x55)]
    assert g711.decode(bytes([0xD5, 0x55, 0xAA, 0x2A]), "alaw").tolist() == [8, -8, 32256, -32256]


@pytest.mark.parametrize("law", g711.LAWS)
def test_every_code_decodes_as_ffmpeg_does(law):
    codes = bytes(range(256))
    assert np.array_equal(g711.decode(codes, law), ffmpeg_decode(codes, law))


@pytest.mark.parametrize("law", g711.LAWS)
def test_round_trip_is_monotonic_and_within_half_a_step(law):
    codes = g711.encode(ALL, law)
    assert codes.dtype == np.uint8 and len(codes) == len(ALL)
    y = g711.decode(codes, law).astype(np.int64)
    x = ALL.astype(np.int64)
    assert np.all(np.diff(y) >= 0)  # a louder input never decodes quieter
    assert np.array_equal(np.sign(y[x > 64]), np.ones_like(y[x > 64]))
    # Relative error: mu-law's step is 1/16 of its segment (from |x| + 132), A-law's 1/16 of |x| above 512.
    inside = np.abs(x) < 32000
    bound = (np.abs(x) + 132) / 32 + 4 if law == "mulaw" else np.maximum(np.abs(x) / 32, 16) + 1
    err = np.abs(y - x)
    assert np.all(err[inside] <= np.broadcast_to(bound, x.shape)[inside]), int(err[inside].max())
    # The codes are the standard's: every one is produced, and recoding a decoded value gives it back
    # (except mu-law's negative zero, 0x7F, which decodes to 0 and so recodes as 0xFF).
    assert len(np.unique(codes)) == 256
    back = g711.encode(g711.decode(bytes(range(256)), law), law)
    expect = np.arange(256, dtype=np.uint8)
    if law == "mulaw":
        expect[0x7F] = 0xFF
    assert np.array_equal(back, expect)


def test_unknown_law_is_refused():
    with pytest.raises(ValueError):
        g711.encode(np.zeros(3, np.int16), "gsm")


def tone(rate: int, seconds: float = 2.0, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype(np.int16)


def feed(fmt: str, rate: int, x: np.ndarray, chunk: int, stream: bool = True) -> bytes:
    enc = make_encoder(fmt, rate, stream=stream)
    return b"".join(enc.feed(x[i : i + chunk]) for i in range(0, len(x), chunk)) + enc.finish()


@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("law", g711.LAWS)
def test_streamed_equals_whole_and_follows_the_resampled_pcm(law, rate):
    x = tone(rate)
    whole, ctype = encode_whole([x], law, rate)
    assert ctype == resolve_format(law).content_type and len(whole) == len(x) * 8000 // rate
    for chunk in (97, 480, 4800):  # odd chunk sizes: the resampler keeps its filter state across them
        streamed = feed(law, rate, x, chunk)
        assert len(streamed) == len(whole)
        # Equal up to float rounding before the int16 rounding: a sample may land one code away.
        diff = g711.decode(streamed, law).astype(int) - g711.decode(whole, law)
        assert np.count_nonzero(diff) <= len(x) // 1000 and np.abs(diff).max() <= 1024
    y = g711.decode(whole, law).astype(float)
    ref = resample_int16(x, rate, 8000).astype(float)
    assert np.corrcoef(y, ref)[0, 1] > 0.999
    # FFmpeg's raw demuxer reads it as 8 kHz G.711 of the same length.
    with av.open(io.BytesIO(whole), format=law, options={"sample_rate": "8000"}) as c:
        frames = list(c.decode(audio=0))
    assert {f.sample_rate for f in frames} == {8000}
    assert np.array_equal(np.concatenate([f.to_ndarray().reshape(-1) for f in frames]), y)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("law,tag,subtype", [("mulaw", 7, "ULAW"), ("alaw", 6, "ALAW")])
def test_wav_carries_g711_with_a_fact_chunk(law, tag, subtype, stream):
    x = tone(24000, 1.0)
    data = feed(f"wav_{law}", 24000, x, 4800, stream=stream)
    n = len(x) // 3
    (riff, riff_size, wave, fmt_id, fmt_len, got_tag, channels, rate, byte_rate, align, bits, cb_size,
     fact_id, fact_len, samples, data_id, data_len) = struct.unpack("<4sI4s4sIHHIIHHH4sII4sI", data[:58])
    assert (riff, wave, fmt_id, fact_id, data_id) == (b"RIFF", b"WAVE", b"fmt ", b"fact", b"data")
    assert (fmt_len, got_tag, channels, rate, byte_rate, align, bits, cb_size, fact_len) == (
        18, tag, 1, 8000, 8000, 1, 8, 0, 4)
    if stream:
        assert riff_size == samples == data_len == 0xFFFFFFFF
    else:
        assert (riff_size, samples, data_len) == (len(data) - 8, n, n)
    assert data[58:] == encode_whole([x], law, 24000)[0]
    info = sf.info(io.BytesIO(data))
    assert (info.samplerate, info.subtype, info.frames if not stream else n) == (8000, subtype, n)
    y, _ = sf.read(io.BytesIO(data), dtype="int16")
    assert np.array_equal(y, g711.decode(data[58:], law))
    with av.open(io.BytesIO(data)) as c:
        assert c.streams.audio[0].codec_context.name == f"pcm_{law}"
        assert sum(f.samples for f in c.decode(audio=0)) == n


def test_g711_formats_are_8k_whatever_is_asked():
    for name in ("mulaw", "alaw", "wav_mulaw", "wav_alaw"):
        f = resolve_format(name)
        assert f.output_rate(24000) == f.output_rate(16000) == 8000 and f.sample_width == 1
        assert make_encoder(name, 22050, stream=True, out_rate=16000).sample_rate == 8000
    assert resolve_format("mulaw").content_type == "audio/basic"
    assert resolve_format("wav_alaw").content_type == "audio/wav"
    assert resolve_format("pcm").sample_width == 2
    empty = make_encoder("wav_mulaw", 24000, stream=False).finish()
    assert len(empty) == 58 and struct.unpack("<I", empty[54:58])[0] == 0
