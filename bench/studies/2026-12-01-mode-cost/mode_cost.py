"""Per-mode cost of the default engine path on one model dir, for side-by-side runs of two checkouts.

Uses only the engine's public contract (CosyVoiceEngine, CosyVoiceConfig, SynthesisRequest,
PromptAudio), so the same file runs against an older checkout of the project:

    PYTHONPATH=. python bench/studies/2026-12-01-mode-cost/mode_cost.py --model-dir .cache/models/v2-short-seed0-b2
    git worktree add ../old-checkout REV && PYTHONPATH=../old-checkout python bench/studies/2026-12-01-mode-cost/mode_cost.py --model-dir ...

Prints, per mode and streaming flag, the median process CPU seconds and wall seconds per
request, time to the first chunk, and audio seconds (seeded, so both runs decode the same
tokens where the code paths agree). Run it alone: on 2 cores a second job ruins the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

from app.engines.base import PromptAudio, SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceConfig, CosyVoiceEngine

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the green forest."


def speechlike(seconds: float, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 0.7 * t)) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 6))
    return (0.25 * x / np.max(np.abs(x)) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def requests(engine: CosyVoiceEngine, stream: bool) -> dict[str, SynthesisRequest]:
    prompt = PromptAudio(speechlike(2.0), 16000)
    speaker = engine.voices()[0] if engine.voices() else None
    out = {
        "zero_shot": SynthesisRequest(text=TEXT, mode="zero_shot", prompt_audio=prompt,
                                      prompt_text="hello there, this is my voice", stream=stream, seed=7),
        "cross_lingual": SynthesisRequest(text=TEXT, mode="cross_lingual", prompt_audio=prompt, stream=stream, seed=7),
        "instruct2": SynthesisRequest(text=TEXT, mode="instruct2", prompt_audio=prompt, instruct_text="Speak happily.",
                                      stream=stream, seed=7),
        "vc": SynthesisRequest(mode="vc", prompt_audio=prompt, source_audio=PromptAudio(speechlike(3.0), 16000),
                               stream=stream, seed=7),
    }
    if speaker is not None:
        out["sft"] = SynthesisRequest(text=TEXT, mode="sft", speaker=speaker, stream=stream, seed=7)
    return {m: r for m, r in out.items() if m in engine.modes()}


def one(engine: CosyVoiceEngine, req: SynthesisRequest) -> tuple[float, float, float, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    first, audio = None, 0.0
    for chunk in engine.synthesize(req, threading.Event()):
        first = first if first is not None else time.perf_counter() - t0
        audio += chunk.duration_s
    return time.process_time() - cpu0, time.perf_counter() - t0, first or 0.0, audio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    engine = CosyVoiceEngine(CosyVoiceConfig(model_dir=args.model_dir, torch_threads=1))
    engine.load()
    rows = []
    for stream in (False, True):
        for mode, req in requests(engine, stream).items():
            one(engine, req)  # warm-up
            runs = [one(engine, req) for _ in range(args.repeats)]
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            rows.append({"mode": mode, "stream": stream, "cpu_s": round(med[0], 3), "wall_s": round(med[1], 3),
                         "first_chunk_s": round(med[2], 3), "audio_s": round(med[3], 2)})
            print(f"{args.label:8s} {mode:14s} stream={stream!s:5s} cpu {med[0]:6.3f} s  wall {med[1]:6.3f} s  "
                  f"first {med[2]:6.3f} s  audio {med[3]:5.2f} s", flush=True)
    engine.close()
    print(json.dumps({"label": args.label, "rows": rows}))


if __name__ == "__main__":
    main()
