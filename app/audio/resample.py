"""Sample-rate conversion for mono PCM: whole-buffer and streaming.

Both paths use the same polyphase FIR as :func:`scipy.signal.resample_poly`
(Kaiser-windowed sinc, beta 5, ``10 * max(up, down)`` taps either side), so a
stream cut into chunks comes out identical (to float rounding) to the whole
buffer resampled at once: no clicks at chunk boundaries, same total length.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import gcd

import numpy as np
from scipy.signal import firwin, resample_poly, upfirdn

_INT16_MIN, _INT16_MAX = -32768, 32767
MAX_FACTOR = 4096  # largest up/down factor used; bounds the filter to ~82k taps
MAX_RATIO = 256  # largest rate ratio accepted for odd (non-reducible) rate pairs


def _ratio(src_rate: int, dst_rate: int) -> tuple[int, int]:
    """(up, down) for ``dst/src``, gcd-reduced.

    Every pair of common rates reduces to factors <= MAX_FACTOR (192000 -> 22050
    is 147/1280). Odd pairs (a corrupt header claiming 44101 Hz) would need a
    filter with millions of taps; those get the closest ratio with both factors
    <= MAX_FACTOR, a pitch/length error below ~1e-6.
    """
    src, dst = int(src_rate), int(dst_rate)
    if src <= 0 or dst <= 0:
        raise ValueError(f"sample rates must be positive, got {src_rate} -> {dst_rate}")
    g = gcd(src, dst)
    up, down = dst // g, src // g
    if max(up, down) <= MAX_FACTOR:
        return up, down
    if max(src, dst) > MAX_RATIO * min(src, dst):
        raise ValueError(f"cannot resample {src} Hz -> {dst} Hz: the ratio exceeds {MAX_RATIO}")
    if up > down:
        r = Fraction(src, dst).limit_denominator(MAX_FACTOR)
        return r.denominator, max(r.numerator, 1)
    r = Fraction(dst, src).limit_denominator(MAX_FACTOR)
    return max(r.numerator, 1), r.denominator


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Round and clip float samples in the int16 range to int16."""
    return np.clip(np.rint(samples), _INT16_MIN, _INT16_MAX).astype(np.int16)


def as_mono_int16(pcm: np.ndarray) -> np.ndarray:
    """Validate/convert one chunk to a 1-D int16 array.

    int16 passes through; floats are taken as [-1, 1] audio (NaN -> 0).
    """
    x = np.asarray(pcm)
    if x.ndim != 1:
        if x.ndim == 2 and 1 in x.shape:
            x = x.reshape(-1)
        else:
            raise ValueError(f"expected mono PCM of shape (n,), got shape {x.shape}")
    if x.dtype == np.int16:
        return x
    if np.issubdtype(x.dtype, np.floating):
        x = np.nan_to_num(x.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
        return to_int16(np.clip(x, -1.0, 1.0) * 32767.0)
    raise ValueError(f"expected int16 (or float) PCM, got dtype {x.dtype}")


def resample_float(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample 1-D float audio; returns float32. Same rate -> a float32 copy."""
    up, down = _ratio(src_rate, dst_rate)
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if up == down or len(x) == 0:
        return x.copy() if up == down else np.zeros(0, np.float32)
    return resample_poly(x, up, down).astype(np.float32)


def resample_int16(pcm: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample a whole mono int16 buffer (polyphase FIR); returns int16."""
    x = as_mono_int16(pcm)
    if int(src_rate) == int(dst_rate):
        _ratio(src_rate, dst_rate)
        return x.copy()
    return to_int16(resample_float(x.astype(np.float32), src_rate, dst_rate))


@lru_cache(maxsize=32)
def _design(up: int, down: int) -> tuple[np.ndarray, int, int, int]:
    """The resample_poly filter: (h, delay, taps per phase, alignment residue)."""
    max_rate = max(up, down)
    half_len = 10 * max_rate
    h = firwin(2 * half_len + 1, 1.0 / max_rate, window=("kaiser", 5.0)) * up
    h.setflags(write=False)
    taps = -(-len(h) // up)
    # Segments handed to upfirdn start at an input index b with b*up = delay (mod down),
    # so that upfirdn's output grid lines up with ours.
    residue = (half_len * pow(up, -1, down)) % down if down > 1 else 0
    return h, half_len, taps, residue


class StreamResampler:
    """Chunked mono resampler with state kept across ``process`` calls.

    Output sample ``n`` is ``sum_i x[i] * h[n*down + delay - i*up]``: exactly
    what ``resample_poly`` computes. Each call emits every output whose input
    support has fully arrived; ``flush()`` emits the tail, treating the signal as
    zero after the last sample, for ``ceil(N * dst / src)`` samples in total.
    Accepts int16 (returns int16) or float (returns float32) chunks.
    """

    def __init__(self, src_rate: int, dst_rate: int):
        self.src_rate = int(src_rate)
        self.dst_rate = int(dst_rate)
        self.up, self.down = _ratio(src_rate, dst_rate)
        self.passthrough = self.up == self.down
        self._dtype: np.dtype | None = None
        self._in_total = 0  # input samples seen
        self._out_total = 0  # output samples emitted
        self._flushed = False
        if not self.passthrough:
            self._h, self._delay, self._taps, self._residue = _design(self.up, self.down)
            self._buf = np.zeros(0, np.float64)  # input samples from absolute index _buf_start
            self._buf_start = 0

    def process(self, chunk: np.ndarray) -> np.ndarray:
        if self._flushed:
            raise RuntimeError("StreamResampler.process() after flush()")
        x = np.asarray(chunk).reshape(-1)
        if self._dtype is None:
            self._dtype = np.dtype(np.int16) if x.dtype == np.int16 else np.dtype(np.float32)
        self._in_total += len(x)
        if self.passthrough:
            return x.astype(self._dtype, copy=True)
        self._buf = np.concatenate([self._buf, x.astype(np.float64)])
        # Output n needs inputs up to floor((n*down + delay) / up) < _in_total.
        ready = (self._in_total * self.up - 1 - self._delay) // self.down + 1
        return self._emit(max(ready, self._out_total))

    def flush(self) -> np.ndarray:
        """Emit the remaining samples; the resampler is then finished."""
        if self._flushed:
            return np.zeros(0, self._dtype or np.int16)
        self._flushed = True
        if self._dtype is None:
            self._dtype = np.dtype(np.int16)
        if self.passthrough:
            return np.zeros(0, self._dtype)
        return self._emit(-(-self._in_total * self.up // self.down))

    def _base(self, n: int) -> int:
        """Newest input index contributing to output n."""
        return (n * self.down + self._delay) // self.up

    def _emit(self, stop: int) -> np.ndarray:
        start = self._out_total
        if stop <= start:
            return np.zeros(0, self._dtype)
        lo = self._base(start) - self._taps + 1
        b = lo - ((lo - self._residue) % self.down)
        hi = self._base(stop - 1) + 1  # exclusive
        seg = np.zeros(hi - b)
        a0, a1 = max(b, self._buf_start), min(hi, self._buf_start + len(self._buf))
        if a1 > a0:
            seg[a0 - b : a1 - b] = self._buf[a0 - self._buf_start : a1 - self._buf_start]
        off = (self._delay - b * self.up) // self.down
        y = upfirdn(self._h, seg, self.up, self.down)[start + off : stop + off]
        self._out_total = stop
        # Keep only the inputs a later segment can start from.
        keep_from = self._base(stop) - self._taps + 1 - self.down
        drop = min(keep_from - self._buf_start, len(self._buf))
        if drop > 0:
            self._buf = self._buf[drop:]
            self._buf_start += drop
        if self._dtype == np.int16:
            return to_int16(y)
        return y.astype(np.float32)
