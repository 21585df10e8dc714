"""Decode uploaded audio (any common format) to mono float32 at a target rate.

WAV/FLAC go through libsndfile (soundfile) when it can read them; everything
else, and anything libsndfile rejects, through FFmpeg (PyAV). FFmpeg only gets
to pick among the audio container demuxers listed in ``ALLOWED_DEMUXERS``: the
playlist/concat style demuxers, which open further files or URLs named inside
the upload, are never used on untrusted bytes.
"""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf

from app.audio.formats import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from app.audio.resample import resample_float

ACCEPTED_HINT = "send WAV, MP3, FLAC, OGG/Opus, M4A/AAC or WebM audio"
# FFmpeg demuxer names tried on uploads (matched against each demuxer's name list).
ALLOWED_DEMUXERS: tuple[str, ...] = (
    "wav", "w64", "flac", "mp3", "ogg", "mov", "matroska", "webm", "aac",
    "aiff", "caf", "au", "amr", "asf", "wv", "ape", "tta",
)
DEFAULT_MAX_DURATION_S = 600.0
# Sample rates accepted from uploads; outside this a header is corrupt (or hostile).
MIN_RATE, MAX_RATE = MIN_SAMPLE_RATE, MAX_SAMPLE_RATE
_CORRUPT_PACKETS_TOLERATED = 8
_MAX_PLAUSIBLE_FRAMES = 1 << 40
_MAX_CHANNELS = 8  # av.AudioFrame.to_ndarray is only safe up to AV_NUM_DATA_POINTERS planes


class AudioDecodeError(ValueError):
    """The upload is not audio we can decode.

    ``reason`` is our own words, safe to show a client (it says what to send
    instead); ``detail`` is what the decoding library said, for the logs only.
    """

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class AudioTooLong(AudioDecodeError):
    """The upload is longer than the limit: ``seconds`` as its header says, or None (decoding stopped at
    the limit, the rest unread)."""

    def __init__(self, limit_s: float, seconds: float | None) -> None:
        said = f"{seconds:.1f} s long, " if seconds is not None else ""
        super().__init__(f"the audio is {said}longer than {limit_s:g} s")
        self.limit_s = limit_s
        self.seconds = seconds


def _fail(reason: str, detail: str | None = None) -> AudioDecodeError:
    return AudioDecodeError(f"could not decode the uploaded audio: {reason}; {ACCEPTED_HINT}", detail)


def decode_audio(
    data: bytes,
    target_rate: int = 16000,
    *,
    max_duration_s: float | None = DEFAULT_MAX_DURATION_S,
) -> np.ndarray:
    """Mono float32 samples in [-1, 1] at ``target_rate``.

    Multi-channel audio is downmixed. Raises :class:`AudioDecodeError` for
    empty, undecodable or silent-by-absence (zero samples) input, and
    :class:`AudioTooLong` for audio longer than ``max_duration_s`` (``None``: no
    limit), before decoding where the header gives the length (WAV, FLAC with a
    sample count), else as soon as decoding passes the limit. So memory while
    decoding stays within about ``max_duration_s`` of mono float32 at the file's
    rate (twice that while the parts are joined), whatever the compression ratio.
    """
    if target_rate <= 0:
        raise ValueError(f"target_rate must be positive, got {target_rate}")
    data = bytes(data) if not isinstance(data, bytes) else data
    if not data:
        raise _fail("the file is empty")
    samples, rate = _decode_native(data, max_duration_s)
    if samples.size == 0 or rate <= 0:
        raise _fail("the file contains no audio samples")
    out = resample_float(samples, rate, target_rate)
    np.nan_to_num(out, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(out, -1.0, 1.0, out=out)


def _decode_native(data: bytes, max_duration_s: float | None) -> tuple[np.ndarray, int]:
    if _looks_like_wav_or_flac(data):
        try:
            got = _decode_soundfile(data, max_duration_s)
        except AudioTooLong:
            raise
        except Exception:  # noqa: BLE001 - libsndfile said no; FFmpeg may still read it
            got = None
        if got is not None:
            return got
    try:
        return _decode_av(data, max_duration_s)
    except AudioDecodeError:
        raise
    except MemoryError:
        raise _fail("the audio is too large") from None
    except Exception as exc:
        raise _fail("it is not a recognised or supported audio file", f"{type(exc).__name__}: {exc}") from exc


def _looks_like_wav_or_flac(data: bytes) -> bool:
    head = data[:12]
    return head[:4] == b"fLaC" or (head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE")


def _decode_soundfile(data: bytes, max_duration_s: float | None) -> tuple[np.ndarray, int] | None:
    with sf.SoundFile(io.BytesIO(data)) as f:
        # Unknown length (a streamed FLAC says total_samples=0 and libsndfile reports
        # a huge count): let FFmpeg read it, stopping at the limit, instead.
        if f.frames <= 0 or f.samplerate <= 0 or f.frames > _MAX_PLAUSIBLE_FRAMES:
            return None
        _check_rate(int(f.samplerate))
        _check_duration(f.frames, int(f.samplerate), max_duration_s, known=True)  # from the header, nothing decoded
        x = f.read(dtype="float32", always_2d=True)
        rate = int(f.samplerate)
    return _downmix(x.T), rate


def _decode_av(data: bytes, max_duration_s: float | None) -> tuple[np.ndarray, int]:
    options = {"format_whitelist": ",".join(ALLOWED_DEMUXERS)}
    with av.open(io.BytesIO(data), mode="r", options=options) as container:
        if not container.streams.audio:
            raise _fail("no audio track found in the file")
        stream = container.streams.audio[0]
        out_rate = 0
        resamplers: dict[tuple, av.AudioResampler] = {}
        parts: list[np.ndarray] = []
        total = 0
        corrupt = 0
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except (av.error.InvalidDataError, av.error.UndefinedError):
                corrupt += 1  # a damaged packet: skip it, like a media player would
                if corrupt > _CORRUPT_PACKETS_TOLERATED:
                    raise _fail("the audio data is corrupt") from None
                continue
            for frame in frames:
                if frame.samples == 0 or frame.sample_rate <= 0:
                    continue
                if not 1 <= frame.layout.nb_channels <= _MAX_CHANNELS or (
                    out_rate and not MIN_RATE <= frame.sample_rate <= MAX_RATE
                ):
                    # Damaged headers can claim dozens of channels (PyAV cannot hand back
                    # more than 8 planes safely: it crashes) or absurd rates: drop the frame.
                    corrupt += 1
                    if corrupt > _CORRUPT_PACKETS_TOLERATED:
                        raise _fail(f"the audio data is corrupt or has more than {_MAX_CHANNELS} channels")
                    continue
                if not out_rate:
                    out_rate = _check_rate(frame.sample_rate)
                key = (frame.format.name, frame.layout.name, frame.layout.nb_channels, frame.sample_rate)
                rs = resamplers.get(key)
                if rs is None:
                    # Only the sample format (and a stray rate change) is converted here;
                    # channels are averaged below (swr's downmix is -3 dB per channel
                    # and can clip).
                    rs = resamplers[key] = av.AudioResampler(format="fltp", layout=frame.layout, rate=out_rate)
                for f in rs.resample(frame):
                    parts.append(_downmix(f.to_ndarray()))
                    total += parts[-1].size
                _check_duration(total, out_rate, max_duration_s)
        for rs in resamplers.values():
            for f in rs.resample(None):
                parts.append(_downmix(f.to_ndarray()))
    if not parts:
        return np.zeros(0, np.float32), out_rate
    return np.concatenate(parts).astype(np.float32, copy=False), out_rate


def _downmix(x: np.ndarray) -> np.ndarray:
    """(channels, n) -> (n,) float32 by averaging channels."""
    return (x[0] if x.shape[0] == 1 else x.mean(axis=0)).astype(np.float32, copy=False)


def _check_rate(rate: int) -> int:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _fail(f"its sample rate of {rate} Hz is not plausible")
    return rate


def _check_duration(samples: int, rate: int, max_duration_s: float | None, *, known: bool = False) -> None:
    """Raise AudioTooLong past the limit; ``known``: ``samples`` is the whole file's length."""
    if max_duration_s is not None and rate > 0 and samples > max_duration_s * rate:
        raise AudioTooLong(max_duration_s, samples / rate if known else None)
