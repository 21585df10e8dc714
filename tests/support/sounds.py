"""Test signals to send as prompt or voice audio: a tone, a speech-like signal, a voice recording."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def prompt_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    """A 16-bit mono WAV tone, usable as prompt audio."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 180 * t), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def speechlike(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A voiced-sounding test signal: harmonics with a wobbling pitch plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    return (0.25 * x / np.max(np.abs(x)) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def voice_wav(seconds: float = 3.0, rate: int = 22050) -> bytes:
    """A 16-bit WAV of a modulated tone with noise: what a voice registration uploads."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.25 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(len(t))
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def flac_claiming(data: bytes, total_samples: int) -> bytes:
    """A FLAC file whose STREAMINFO says ``total_samples`` (0: unknown, as a streamed encoder writes)."""
    b = bytearray(data)
    assert b[:4] == b"fLaC" and b[4] & 0x7F == 0  # the first block is STREAMINFO; its sample count at byte 21
    b[21] = (b[21] & 0xF0) | (total_samples >> 32 & 0x0F)
    b[22:26] = (total_samples & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(b)
