"""Per-request latency, RTF and first-chunk time of CosyVoiceEngine on tiny v1 and v2 models.

    .venv/bin/python -m bench.studies.2026-12-01-engine-latency.engine_latency [--reps 10] [--threads 1]

In-process, no HTTP: what one engine slot costs per request on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TEXT = "The quick brown fox jumps over the lazy dog while seven happy children sing loudly near the old wooden bridge."


def measure(engine, stream: bool, reps: int) -> dict:
    import torch

    from app.engines.base import SynthesisRequest

    totals, firsts, audio = [], [], []
    for i in range(reps + 2):
        torch.manual_seed(i)
        req = SynthesisRequest(text=TEXT, speaker="tiny_female", stream=stream)
        t0 = time.perf_counter()
        first = None
        seconds = 0.0
        for chunk in engine.synthesize(req, threading.Event()):
            first = first if first is not None else time.perf_counter() - t0
            seconds += chunk.duration_s
        if i >= 2:  # two warm-ups
            totals.append(time.perf_counter() - t0)
            firsts.append(first or 0.0)
            audio.append(seconds)
    return {"total": statistics.median(totals), "first": statistics.median(firsts),
            "audio": statistics.median(audio), "rtf": statistics.median(t / a for t, a in zip(totals, audio))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from app.devmodels.tiny import ensure_tiny_model
    from app.engines.cosyvoice.engine import CosyVoiceConfig, CosyVoiceEngine

    print(f"20-word sentence, {args.threads} torch thread(s), median of {args.reps} after 2 warm-ups\n")
    print("| model | mode | latency s | first chunk s | audio s | RTF |")
    print("|---|---|---:|---:|---:|---:|")
    for version in (1, 2):
        path = ensure_tiny_model(ROOT / ".cache" / "models", version)
        engine = CosyVoiceEngine(CosyVoiceConfig(model_dir=str(path), torch_threads=args.threads))
        engine.load()
        for stream in (False, True):
            r = measure(engine, stream, args.reps)
            print(f"| tiny v{version} | {'stream' if stream else 'whole'} | {r['total']:.3f} | {r['first']:.3f} "
                  f"| {r['audio']:.2f} | {r['rtf']:.3f} |", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
