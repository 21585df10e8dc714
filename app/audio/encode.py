"""Incremental encoders from mono int16 PCM to every response format.

    enc = make_encoder("mp3", 24000, stream=True)
    for chunk in chunks:
        send(enc.feed(chunk))   # bytes available now (may be b"")
    send(enc.finish())          # everything else, trailer included

An encoder resamples to its output rate itself (``Encoder.sample_rate``), keeps
filter state across chunks, and is meant for one thread at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

import numpy as np

from app.audio import g711
from app.audio.av_encode import AvCodecWriter
from app.audio.formats import (
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    AudioFormat,
    resolve_format,
)
from app.audio.resample import StreamResampler, as_mono_int16
from app.audio.wav import g711_wav_header, wav_header


def _pcm_bytes(pcm: np.ndarray) -> bytes:
    return np.ascontiguousarray(pcm, dtype="<i2").tobytes()


def _sample_bytes(fmt: AudioFormat, pcm: np.ndarray) -> bytes:
    """int16 samples as the format carries them: 16-bit little-endian, or G.711 (one byte each)."""
    if fmt.law is None:
        return _pcm_bytes(pcm)
    return g711.encode(pcm, fmt.law).tobytes()


class Encoder:
    """Base class: input validation, resampling and the feed/finish life cycle."""

    def __init__(self, fmt: AudioFormat, input_rate: int, output_rate: int, *, stream: bool):
        self.format = fmt
        self.content_type = fmt.content_type
        self.input_rate = int(input_rate)
        self.sample_rate = int(output_rate)
        self.stream = stream
        self.samples_in = 0  # input samples fed
        self.samples_out = 0  # samples handed to the codec, at the output rate
        self._resampler = StreamResampler(self.input_rate, self.sample_rate)
        self._done = False

    @property
    def finished(self) -> bool:
        return self._done

    def feed(self, pcm: np.ndarray) -> bytes:
        """Encode one chunk; returns the bytes that are ready now (possibly b"")."""
        if self._done:
            raise RuntimeError(f"{self.format.name} encoder: feed() after finish()/close()")
        x = as_mono_int16(pcm)
        self.samples_in += len(x)
        y = self._resampler.process(x)
        self.samples_out += len(y)
        try:
            return self._encode(y)
        except Exception:
            self.close()
            raise

    def finish(self) -> bytes:
        """Flush everything; returns the final bytes. The encoder is then done."""
        if self._done:
            raise RuntimeError(f"{self.format.name} encoder: finish() called twice or after close()")
        tail = self._resampler.flush()
        self.samples_out += len(tail)
        try:
            out = self._encode(tail)
            return out + self._finish()
        finally:
            self._done = True
            self._release()

    def close(self) -> None:
        """Abandon the stream (client gone, error): free resources, emit nothing."""
        if not self._done:
            self._done = True
            self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- subclass hooks
    def _encode(self, pcm: np.ndarray) -> bytes:
        raise NotImplementedError

    def _finish(self) -> bytes:
        raise NotImplementedError

    def _release(self) -> None:
        pass


class RawEncoder(Encoder):
    """Raw samples, no header: little-endian int16 (pcm) or G.711 bytes (mulaw, alaw).

    G.711 is a per-sample code, so the bytes of a stream are those of the whole
    file: only the resampler (which keeps its state across chunks) sits before it.
    """

    def _encode(self, pcm: np.ndarray) -> bytes:
        return _sample_bytes(self.format, pcm)

    def _finish(self) -> bytes:
        return b""


class WavEncoder(Encoder):
    """Mono WAV: 16-bit PCM, or G.711 with its ``fact`` chunk (wav_mulaw, wav_alaw).

    Whole: buffered, returned by ``finish()`` behind an exact header.
    Streaming: the first ``feed()`` sends a header whose RIFF and data sizes are
    0xFFFFFFFF (length unknown), then raw PCM.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parts: list[bytes] = []
        self._header_sent = False

    def _header(self, data_bytes: int | None) -> bytes:
        if self.format.law is None:
            return wav_header(self.sample_rate, data_bytes)
        return g711_wav_header(self.format.law, self.sample_rate, data_bytes)

    def _encode(self, pcm: np.ndarray) -> bytes:
        data = _sample_bytes(self.format, pcm)
        if not self.stream:
            if data:
                self._parts.append(data)
            return b""
        if not self._header_sent:
            self._header_sent = True
            return self._header(None) + data
        return data

    def _finish(self) -> bytes:
        if self.stream:
            return b"" if self._header_sent else self._encode(np.zeros(0, np.int16))
        data = b"".join(self._parts)
        self._parts = []
        return self._header(len(data)) + data

    def _release(self) -> None:
        self._parts = []


class AvEncoder(Encoder):
    """mp3 / opus / aac / flac through FFmpeg (see :mod:`app.audio.av_encode`)."""

    def __init__(self, fmt: AudioFormat, input_rate: int, output_rate: int, *, stream: bool, bit_rate=None):
        super().__init__(fmt, input_rate, output_rate, stream=stream)
        self._writer = AvCodecWriter(fmt, output_rate, stream=stream, bit_rate=bit_rate)

    def _encode(self, pcm: np.ndarray) -> bytes:
        return self._writer.write(pcm)

    def _finish(self) -> bytes:
        return self._writer.close()

    def _release(self) -> None:
        self._writer.abort()


def make_encoder(
    fmt: str | AudioFormat,
    sample_rate: int,
    *,
    stream: bool,
    out_rate: int | None = None,
    bit_rate: int | None = None,
) -> Encoder:
    """An encoder for ``fmt`` taking mono int16 at ``sample_rate``.

    The output rate is ``out_rate`` (default: the input rate) moved to the
    nearest rate the codec accepts (Opus always 48 kHz, G.711 8 kHz); see ``.sample_rate``.
    Raises :class:`~app.audio.formats.UnsupportedFormat` for unknown formats.
    """
    f = fmt if isinstance(fmt, AudioFormat) else resolve_format(fmt)
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise ValueError(f"input sample rate must be {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {sample_rate}")
    rate = f.output_rate(int(out_rate) if out_rate else int(sample_rate))
    if f.container is None:
        cls = WavEncoder if f.wav else RawEncoder
        return cls(f, sample_rate, rate, stream=stream)
    return AvEncoder(f, sample_rate, rate, stream=stream, bit_rate=bit_rate)


def encode_whole(
    chunks: Iterable[np.ndarray],
    fmt: str | AudioFormat,
    sample_rate: int,
    out_rate: int | None = None,
) -> tuple[bytes, str]:
    """Encode all chunks as one complete file; returns (bytes, content type)."""
    enc = make_encoder(fmt, sample_rate, stream=False, out_rate=out_rate)
    with enc:
        parts = [enc.feed(c) for c in chunks]
        parts.append(enc.finish())
    return b"".join(parts), enc.content_type
