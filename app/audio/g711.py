"""ITU-T G.711 companding: 16-bit linear PCM <-> 8-bit mu-law and A-law, with numpy.

The segment algorithm of G.711 (and of its reference implementation in ITU-T
G.191): the magnitude is taken in one's complement (``~x`` for a negative ``x``,
so -32768 needs no special case), cut to the 14-bit (mu-law) or 13-bit (A-law)
range the standard is defined on, then coded as a sign bit, a 3-bit segment
(exponent) and a 4-bit step within it. Mu-law codes are sent inverted, A-law
codes with their even bits inverted (XOR 0x55), as on the wire.

Decoding gives the middle of each code's interval, as G.711's tables do:
mu-law in -32124..32124, A-law in -32256..32256.

Every 16-bit input is coded once into a 65536-entry table, so a chunk costs one
indexing pass. ``audioop`` (gone in Python 3.13) is not used.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

LAWS: tuple[str, ...] = ("mulaw", "alaw")
MULAW_BIAS = 33  # added to the 14-bit magnitude so every segment starts at a power of two
MULAW_MAX = 0x1FFF  # largest biased 14-bit magnitude
ALAW_XOR = 0x55  # A-law's even-bit inversion


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bits needed for each non-negative integer (0 -> 0)."""
    out = np.zeros(x.shape, np.int32)
    v = x.astype(np.int64)
    for shift in (8, 4, 2, 1):
        big = v >= (1 << shift)
        out += np.where(big, shift, 0)
        v = np.where(big, v >> shift, v)
    return out + (v > 0)


def _magnitude(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one's complement magnitude, is non-negative) of int16 samples, as int32."""
    x = x.astype(np.int32)
    positive = x >= 0
    return np.where(positive, x, ~x), positive


def _mulaw_compress(x: np.ndarray) -> np.ndarray:
    mag, positive = _magnitude(x)
    biased = np.minimum((mag >> 2) + MULAW_BIAS, MULAW_MAX)  # 14-bit magnitude + bias: 33..8191
    segment = _bit_length(biased) - 6  # biased >= 33 has bit 5 set: segment 0..7
    step = (biased >> (segment + 1)) & 0x0F
    code = (segment << 4) | step | np.where(positive, 0, 0x80)
    return (~code & 0xFF).astype(np.uint8)


def _alaw_compress(x: np.ndarray) -> np.ndarray:
    mag, positive = _magnitude(x)
    mag = mag >> 4  # 12-bit magnitude (13-bit signed): 0..2047
    segment = np.maximum(_bit_length(mag) - 4, 0)  # 0 and 1 share the step of 1
    step = np.where(segment == 0, mag, (mag >> np.maximum(segment - 1, 0)) - 16)
    code = (segment << 4) | step | np.where(positive, 0x80, 0)
    return (code ^ ALAW_XOR).astype(np.uint8)


def _mulaw_expand(code: np.ndarray) -> np.ndarray:
    c = ~code.astype(np.int32) & 0xFF
    segment, step = (c >> 4) & 0x07, c & 0x0F
    value = (((step << 1) + MULAW_BIAS) << segment) - MULAW_BIAS  # 14-bit interval middle
    return np.where(c & 0x80, -value, value).astype(np.int32) << 2


def _alaw_expand(code: np.ndarray) -> np.ndarray:
    c = code.astype(np.int32) ^ ALAW_XOR
    segment, step = (c >> 4) & 0x07, c & 0x0F
    value = np.where(segment == 0, (step << 1) + 1, ((step << 1) + 33) << np.maximum(segment - 1, 0))
    return np.where(c & 0x80, value, -value).astype(np.int32) << 3


@lru_cache(maxsize=2)
def _table(law: str) -> np.ndarray:
    """The code of every int16 value, indexed by the value's bits read as uint16."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.int16)
    table = _mulaw_compress(x) if law == "mulaw" else _alaw_compress(x)
    table.setflags(write=False)
    return table


def _check(law: str) -> None:
    if law not in LAWS:
        raise ValueError(f"unknown G.711 law {law!r}; use one of: {', '.join(LAWS)}")


def encode(pcm: np.ndarray, law: str) -> np.ndarray:
    """int16 samples -> G.711 codes (uint8), one byte a sample."""
    _check(law)
    x = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
    return _table(law)[x.view(np.uint16)]


def decode(codes: bytes | np.ndarray, law: str) -> np.ndarray:
    """G.711 codes -> int16 samples (the middle of each code's interval)."""
    _check(law)
    c = np.frombuffer(codes, np.uint8) if isinstance(codes, (bytes, bytearray, memoryview)) else np.asarray(codes)
    out = _mulaw_expand(c) if law == "mulaw" else _alaw_expand(c)
    return out.astype(np.int16)
