"""Encode cost per response format, as x real time (audio seconds per CPU second).

    .venv/bin/python bench/encode_cost.py [--seconds 10] [--repeat 3]

For each format and engine rate (22050 = CosyVoice 1, 24000 = CosyVoice 2/3) it
encodes synthetic speech-like audio two ways: streaming in 0.2 s chunks (what a
streamed response does) and whole (one buffer, stream=False). CPU time is
process time (all threads), best of --repeat runs. Higher is cheaper.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from app.audio import FORMAT_NAMES, make_encoder

CHUNK_S = 0.2


def speech_like(rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced harmonics with a wandering pitch, syllable-rate envelope and breath noise."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 25) if k * 180 < rate / 2)
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5
    x = 0.2 * voiced * envelope + 0.01 * rng.standard_normal(n)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


def cpu_seconds(fn, fn_args: tuple, repeat: int) -> tuple[float, int]:
    best, size = float("inf"), 0
    for _ in range(repeat):
        t0 = time.process_time()
        size = fn(*fn_args)
        best = min(best, time.process_time() - t0)
    return best, size


def run_stream(fmt: str, rate: int, x: np.ndarray) -> int:
    enc = make_encoder(fmt, rate, stream=True)
    n = int(rate * CHUNK_S)
    size = sum(len(enc.feed(x[i : i + n])) for i in range(0, len(x), n))
    return size + len(enc.finish())


def run_whole(fmt: str, rate: int, x: np.ndarray) -> int:
    enc = make_encoder(fmt, rate, stream=False)
    return len(enc.feed(x)) + len(enc.finish())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    print(f"encode cost, {args.seconds:g} s of audio, x real time = audio s / CPU s (higher is cheaper)")
    print(f"{'format':<6} {'in Hz':>6} {'out Hz':>6} {'stream 0.2s':>12} {'whole':>10} {'kbit/s':>7}")
    for fmt in FORMAT_NAMES:
        for rate in (22050, 24000):
            x = speech_like(rate, args.seconds)
            run_whole(fmt, rate, x[: rate // 2])  # warm up codec init / filter design
            s_cpu, s_size = cpu_seconds(run_stream, (fmt, rate, x), args.repeat)
            w_cpu, _ = cpu_seconds(run_whole, (fmt, rate, x), args.repeat)
            with make_encoder(fmt, rate, stream=False) as probe:
                out_rate = probe.sample_rate
            kbps = s_size * 8 / args.seconds / 1000
            print(
                f"{fmt:<6} {rate:>6} {out_rate:>6} {args.seconds / max(s_cpu, 1e-9):>11.0f}x"
                f" {args.seconds / max(w_cpu, 1e-9):>9.0f}x {kbps:>7.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
