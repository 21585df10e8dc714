"""RIFF/WAVE headers for 16-bit PCM."""

from __future__ import annotations

import struct

# Size fields of a WAV whose length is not known when the header is sent.
UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, data_bytes: int | None, *, channels: int = 1, bits: int = 16) -> bytes:
    """A canonical 44-byte PCM WAV header.

    ``data_bytes=None`` writes 0xFFFFFFFF into the RIFF and data sizes: the
    convention for streamed WAV whose length is unknown (ffmpeg, browsers and
    libsndfile read such files to the end of the stream).
    """
    block_align = channels * bits // 8
    if data_bytes is None:
        riff_size = data_size = UNKNOWN_SIZE
    else:
        if data_bytes < 0 or data_bytes + 36 > UNKNOWN_SIZE:
            raise ValueError(f"WAV data of {data_bytes} bytes does not fit a RIFF header")
        riff_size, data_size = 36 + data_bytes, data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        1,  # WAVE_FORMAT_PCM
        channels,
        sample_rate,
        sample_rate * block_align,
        block_align,
        bits,
        b"data",
        data_size,
    )
