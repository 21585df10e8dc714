"""Compressed formats (mp3, Ogg Opus, ADTS AAC, FLAC) through PyAV/FFmpeg.

Streaming muxes into a non-seekable sink that is drained after every feed, so
bytes leave as soon as FFmpeg writes them. Whole-file mode muxes into a
seekable buffer so the muxer can patch its header at the end (FLAC STREAMINFO
length/MD5, the mp3 Xing/LAME frame that lets decoders trim encoder delay), and
hands everything back from ``finish()``.
"""

from __future__ import annotations

import contextlib
import io
from fractions import Fraction

import av
import numpy as np

from app.audio.formats import AudioFormat

# Bits per second for the lossy codecs (mono speech).
DEFAULT_BIT_RATES: dict[str, int] = {"mp3": 64_000, "aac": 64_000, "opus": 32_000}
# Ogg pages are closed once they hold this much audio (microseconds). FFmpeg's
# default is 1 s, which would hold a streamed response back for a whole second;
# one 20 ms Opus packet per page costs ~28 bytes a page but adds no delay.
OGG_PAGE_DURATION_US = 20_000


class _Sink:
    """A write-only, non-seekable file object that collects what the muxer writes."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data) -> int:
        self._buf += data
        return len(data)

    def flush(self) -> None:
        pass

    def drain(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


def _muxer_options(fmt: AudioFormat, stream: bool) -> dict[str, str]:
    opts = {"flush_packets": "1"} if stream else {}
    if fmt.container == "ogg":
        opts["page_duration"] = str(OGG_PAGE_DURATION_US)
    elif fmt.container == "mp3":
        opts["id3v2_version"] = "0"  # no ID3 tag: the first bytes are audio frames
        opts["write_xing"] = "0" if stream else "1"
    elif fmt.container == "flac":
        # No 8 KiB PADDING block: in a stream it only delays the first audio frame.
        opts["metadata_header_padding"] = "0"
    return opts


class AvCodecWriter:
    """Encodes mono int16 PCM at ``sample_rate`` into ``fmt``'s container.

    ``write(pcm)`` returns what the muxer produced so far (streaming) or b"";
    ``close()`` flushes the encoder, writes the trailer and returns the rest.
    """

    def __init__(self, fmt: AudioFormat, sample_rate: int, *, stream: bool, bit_rate: int | None = None):
        if fmt.container is None or fmt.codec is None:
            raise ValueError(f"format {fmt.name!r} is not encoded through PyAV")
        self.fmt = fmt
        self.sample_rate = int(sample_rate)
        self.stream = stream
        self._file: _Sink | io.BytesIO = _Sink() if stream else io.BytesIO()
        self._container = av.open(self._file, "w", format=fmt.container, options=_muxer_options(fmt, stream))
        try:
            self._stream = self._container.add_stream(fmt.codec, rate=self.sample_rate, layout="mono")
            rate = bit_rate or DEFAULT_BIT_RATES.get(fmt.name)
            if rate:
                self._stream.codec_context.bit_rate = int(rate)
        except Exception:
            self._container.close()
            raise
        self._time_base = Fraction(1, self.sample_rate)
        self._pts = 0
        self._closed = False

    def write(self, pcm: np.ndarray) -> bytes:
        if self._closed:
            raise RuntimeError("write() after close()")
        if len(pcm):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = self.sample_rate
            frame.time_base = self._time_base
            frame.pts = self._pts
            self._pts += len(pcm)
            self._mux(self._stream.encode(frame))
        return self._drain()

    def close(self) -> bytes:
        """Flush the codec, write the trailer; returns the remaining bytes."""
        if self._closed:
            return b""
        try:
            self._mux(self._stream.encode(None))
        finally:
            self._closed = True
            self._container.close()
        if isinstance(self._file, io.BytesIO):
            return self._file.getvalue()
        return self._file.drain()

    def abort(self) -> None:
        """Release FFmpeg resources without producing output."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):  # best effort on an abandoned stream
                self._container.close()

    def _mux(self, packets) -> None:
        for packet in packets:
            self._container.mux(packet)

    def _drain(self) -> bytes:
        return self._file.drain() if isinstance(self._file, _Sink) else b""
