"""app.audio.decode: uploads in any common format -> mono float32 at the target rate."""

from __future__ import annotations

import io
import struct
import time
import tracemalloc

import av
import numpy as np
import pytest
import soundfile as sf

from app.audio import (
    FORMATS,
    AudioDecodeError,
    AudioTooLong,
    decode_audio,
    encode_whole,
    make_encoder,
)
from tests.support.sounds import flac_claiming

# Every format we encode that says what it is: not the headerless pcm, mulaw, alaw.
FILE_FORMATS = [name for name, f in FORMATS.items() if f.wav or f.container]


def tone_f(rate: int, seconds: float, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def tone_i16(rate: int, seconds: float) -> np.ndarray:
    return (tone_f(rate, seconds, amp=0.3) * 32767).astype(np.int16)


def dominant_hz(x: np.ndarray, rate: int) -> float:
    mid = x[len(x) // 4 : len(x) // 4 + rate // 2]
    spec = np.abs(np.fft.rfft(mid * np.hanning(len(mid))))
    return float(np.argmax(spec)) * rate / len(mid)


def av_file(container: str, codec: str, rate: int, x: np.ndarray, channels: int = 1) -> bytes:
    """Write float audio (channels, n) with FFmpeg into a seekable buffer."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as c:
        s = c.add_stream(codec, rate=rate, layout="mono" if channels == 1 else "stereo")
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(x.reshape(1, -1), dtype=np.float32), format="flt",
            layout="mono" if channels == 1 else "stereo",
        )
        frame.sample_rate = rate
        for p in s.encode(frame):
            c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_decodes_every_format_we_encode(fmt, stream):
    rate = 22050
    x = tone_i16(rate, 2.0)
    enc = make_encoder(fmt, rate, stream=stream)
    data = b"".join(enc.feed(x[i : i + 4410]) for i in range(0, len(x), 4410)) + enc.finish()
    y = decode_audio(data, 16000)
    assert y.dtype == np.float32 and y.ndim == 1
    assert 1.95 <= len(y) / 16000 <= 2.15
    assert abs(dominant_hz(y, 16000) - 440) < 10
    assert 0.25 < np.abs(y).max() <= 0.35


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
def test_wav_sample_formats_stereo_44k(subtype):
    rate = 44100
    left, right = tone_f(rate, 1.5), tone_f(rate, 1.5)
    buf = io.BytesIO()
    sf.write(buf, np.stack([left, right], axis=1), rate, subtype=subtype, format="WAV")
    y = decode_audio(buf.getvalue(), 16000)
    assert y.dtype == np.float32 and y.shape == (24000,)
    assert abs(np.abs(y[1000:-1000]).max() - 0.5) < 0.02  # averaged, not summed / -3 dB mixed
    assert abs(dominant_hz(y, 16000) - 440) < 10


def test_stereo_is_averaged():
    rate = 44100
    x = tone_f(rate, 1.0)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x, -x], axis=1), rate, subtype="PCM_16", format="WAV")
    assert np.abs(decode_audio(buf.getvalue())).max() < 1e-3


def test_stereo_compressed_via_ffmpeg():
    rate = 44100
    x = tone_f(rate, 1.5)
    data = av_file("mp3", "libmp3lame", rate, np.stack([x, x], axis=1), channels=2)
    y = decode_audio(data, 16000)
    assert abs(len(y) / 16000 - 1.5) < 0.06
    assert abs(np.abs(y[2000:-2000]).max() - 0.5) < 0.05


@pytest.mark.parametrize(
    "container,codec,rate",
    [("ipod", "aac", 44100), ("mp4", "aac", 24000), ("webm", "libopus", 48000), ("ogg", "libopus", 16000),
     ("flac", "flac", 48000), ("mp3", "libmp3lame", 16000), ("wav", "pcm_alaw", 8000), ("w64", "pcm_s24le", 32000)],
)
def test_other_containers(container, codec, rate):
    data = av_file(container, codec, rate, tone_f(rate, 1.0))
    y = decode_audio(data, 16000)
    # AAC/mp3 decoders may keep encoder priming and frame padding (up to ~2 frames).
    assert -0.01 < len(y) / 16000 - 1.0 < 0.05 + 2048 / rate
    assert abs(dominant_hz(y, 16000) - 440) < 10


def test_float_wav_out_of_range_is_clipped_and_nan_silenced():
    x = tone_f(16000, 1.0, amp=2.0)
    x[100] = np.nan
    buf = io.BytesIO()
    sf.write(buf, x, 16000, subtype="FLOAT", format="WAV")
    y = decode_audio(buf.getvalue(), 16000)
    assert np.isfinite(y).all() and np.abs(y).max() <= 1.0 and y[100] == 0.0


def test_streamed_wav_with_unknown_sizes():
    enc = make_encoder("wav", 24000, stream=True)
    data = enc.feed(tone_i16(24000, 1.0)) + enc.finish()
    assert struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert len(decode_audio(data, 16000)) == 16000


def test_target_rate_and_input_types():
    data, _ = encode_whole([tone_i16(24000, 1.0)], "wav", 24000)
    assert len(decode_audio(data, 24000)) == 24000
    assert len(decode_audio(bytearray(data), 22050)) == 22050
    assert len(decode_audio(memoryview(data))) == 16000
    with pytest.raises(ValueError):
        decode_audio(data, 0)


def test_truncated_mp3_gives_what_is_there():
    data, _ = encode_whole([tone_i16(24000, 2.0)], "mp3", 24000)
    y = decode_audio(data[: len(data) // 2])
    assert 0.7 < len(y) / 16000 < 1.3


_RNG = np.random.default_rng(1234)
JUNK = {
    "random-1k": _RNG.bytes(1000),
    "random-1M": _RNG.bytes(1 << 20),
    "text": b"hello world, this is not audio\n" * 50,
    "zeros": bytes(4096),
    "one-byte": b"\x00",
    "json": b'{"audio": "nope"}',
    "png": b"\x89PNG\r\n\x1a\n" + _RNG.bytes(400),
    "riff-junk": b"RIFF\x24\x00\x00\x00WAVE" + _RNG.bytes(200),
    "flac-junk": b"fLaC" + _RNG.bytes(300),
    "ogg-junk": b"OggS" + _RNG.bytes(300),
    "id3-junk": b"ID3\x04\x00\x00\x00\x00\x00\x00" + _RNG.bytes(3000),
    "hls-playlist": b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(JUNK))
def test_junk_raises_audio_decode_error(name):
    with pytest.raises(AudioDecodeError) as err:
        decode_audio(JUNK[name])
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert msg.startswith("could not decode the uploaded audio") and "WAV" in msg and "MP3" in msg


@pytest.mark.parametrize("data", [b"", b"RIFF\x24\x00\x00\x00WAVEfmt "])
def test_empty_inputs(data):
    with pytest.raises(AudioDecodeError):
        decode_audio(data)


def test_zero_length_audio():
    header_only = make_encoder("wav", 24000, stream=False).finish()
    with pytest.raises(AudioDecodeError, match="no audio"):
        decode_audio(header_only)
    flac_empty = make_encoder("flac", 24000, stream=False).finish()
    with pytest.raises(AudioDecodeError):
        decode_audio(flac_empty)


def test_corrupted_middle_still_decodes_or_raises_cleanly():
    data = bytearray(encode_whole([tone_i16(24000, 2.0)], "mp3", 24000)[0])
    rng = np.random.default_rng(0)
    for i in rng.integers(200, len(data), 40):
        data[i] ^= 0xFF
    try:
        y = decode_audio(bytes(data))
    except AudioDecodeError:
        return
    assert y.dtype == np.float32 and np.abs(y).max() <= 1.0


def test_max_duration():
    data, _ = encode_whole([tone_i16(24000, 2.0)], "flac", 24000)
    with pytest.raises(AudioDecodeError, match="longer than"):
        decode_audio(data, max_duration_s=1.0)
    data_ogg, _ = encode_whole([tone_i16(24000, 2.0)], "opus", 24000)
    with pytest.raises(AudioDecodeError, match="longer than"):
        decode_audio(data_ogg, max_duration_s=1.0)
    assert len(decode_audio(data_ogg, max_duration_s=None)) > 0


def test_a_flac_claiming_ten_hours_is_refused_from_its_header_before_a_frame_is_decoded():
    data, _ = encode_whole([tone_i16(48000, 0.5)], "flac", 48000)
    ten_hours = flac_claiming(data, 10 * 3600 * 48000)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(AudioTooLong) as err:
            decode_audio(ten_hours, max_duration_s=30.0)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.seconds == pytest.approx(36000.0) and err.value.limit_s == 30.0
    assert "36000.0 s long, longer than 30 s" in str(err.value)
    assert peak < 1 << 20, peak  # nothing decoded: no sample buffer (10 h would be 6.9 GB of float32)
    assert took < 5.0  # generous: only the header is read


def test_a_flac_of_unknown_length_stops_decoding_at_the_limit():
    """A streamed FLAC (sample count 0) goes through FFmpeg, which stops once past the limit: memory
    holds about the limit's worth of samples, not the file's."""
    rate = 48000
    data, _ = encode_whole([tone_i16(rate, 20.0)], "flac", rate)
    unknown = flac_claiming(data, 0)
    assert len(decode_audio(unknown, 16000, max_duration_s=None)) == pytest.approx(20 * 16000, abs=16)
    tracemalloc.start()
    try:
        with pytest.raises(AudioTooLong) as err:
            decode_audio(unknown, 16000, max_duration_s=2.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.seconds is None and str(err.value) == "the audio is longer than 2 s"
    whole = 20 * rate * 4  # the file decoded to float32: 3.8 MB
    assert peak < whole / 2, (peak, whole)  # stopped near 2 s of 20


def test_the_limit_is_exact_for_files_with_a_length():
    data, _ = encode_whole([tone_i16(16000, 2.0)], "wav", 16000)
    assert len(decode_audio(data, 16000, max_duration_s=2.0)) == 32000
    with pytest.raises(AudioTooLong):
        decode_audio(data, 16000, max_duration_s=1.999)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_fuzzed_uploads_never_crash(fmt):
    """Damaged files either decode to sane samples or raise AudioDecodeError: no other error, no hang."""
    good, _ = encode_whole([tone_i16(24000, 1.0)], fmt, 24000)
    rng = np.random.default_rng(7)
    for _ in range(25):
        data = bytearray(good)
        for i in rng.integers(0, len(data), int(rng.integers(1, 30))):
            data[i] = int(rng.integers(0, 256))
        data = bytes(data[: int(rng.integers(1, len(data) + 1))])
        try:
            y = decode_audio(data)
        except AudioDecodeError:
            continue
        assert y.dtype == np.float32 and np.isfinite(y).all() and np.abs(y).max() <= 1.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bogus_rate", [771775936, 9461184, 7])
def test_implausible_sample_rate_is_rejected_quickly(bogus_rate):
    data = bytearray(encode_whole([tone_i16(24000, 1.0)], "wav", 24000)[0])
    data[24:28] = struct.pack("<I", bogus_rate)
    with pytest.raises(AudioDecodeError, match="sample rate"):
        decode_audio(bytes(data))
