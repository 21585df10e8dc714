"""RIFF/WAVE headers: 16-bit PCM, and G.711 mu-law / A-law."""

from __future__ import annotations

import struct

# Size fields of a WAV whose length is not known when the header is sent.
UNKNOWN_SIZE = 0xFFFFFFFF
WAVE_FORMAT_PCM, WAVE_FORMAT_ALAW, WAVE_FORMAT_MULAW = 1, 6, 7
FORMAT_TAGS: dict[str | None, int] = {None: WAVE_FORMAT_PCM, "alaw": WAVE_FORMAT_ALAW, "mulaw": WAVE_FORMAT_MULAW}


def _sizes(data_bytes: int | None, header_rest: int) -> tuple[int, int]:
    """(RIFF size, data size); ``header_rest``: the header's bytes after the RIFF size field."""
    if data_bytes is None:
        return UNKNOWN_SIZE, UNKNOWN_SIZE
    if data_bytes < 0 or data_bytes + header_rest > UNKNOWN_SIZE:
        raise ValueError(f"WAV data of {data_bytes} bytes does not fit a RIFF header")
    return header_rest + data_bytes, data_bytes


def wav_header(sample_rate: int, data_bytes: int | None, *, channels: int = 1, bits: int = 16) -> bytes:
    """A canonical 44-byte PCM WAV header.

    ``data_bytes=None`` writes 0xFFFFFFFF into the RIFF and data sizes: the
    convention for streamed WAV whose length is unknown (ffmpeg, browsers and
    libsndfile read such files to the end of the stream).
    """
    block_align = channels * bits // 8
    riff_size, data_size = _sizes(data_bytes, 36)
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        WAVE_FORMAT_PCM,
        channels,
        sample_rate,
        sample_rate * block_align,
        block_align,
        bits,
        b"data",
        data_size,
    )


def g711_wav_header(law: str, sample_rate: int, data_bytes: int | None) -> bytes:
    """A 58-byte mono G.711 WAV header: an 18-byte ``fmt `` chunk (cbSize 0), then ``fact``.

    The WAV spec asks every non-PCM file for a ``fact`` chunk with the sample
    count; one sample is one byte here. ``data_bytes=None`` (streamed, length
    unknown) writes 0xFFFFFFFF into the RIFF and data sizes and the sample count.
    """
    tag = FORMAT_TAGS.get(law)
    if tag is None or tag == WAVE_FORMAT_PCM:
        raise ValueError(f"not a G.711 law: {law!r}")
    riff_size, data_size = _sizes(data_bytes, 50)
    return struct.pack(
        "<4sI4s4sIHHIIHHH4sII4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        18,
        tag,
        1,  # channels
        sample_rate,
        sample_rate,  # bytes a second
        1,  # block align
        8,  # bits a sample
        0,  # cbSize: no extension
        b"fact",
        4,
        data_size,  # samples: one byte each
        b"data",
        data_size,
    )
