"""System (a), the ceilings: the engine in-process, no HTTP, no pool, ``workers`` threads of one engine each
(``python -m bench.lib.ceilings``; bench/README.md). Prints one JSON object on stdout's last line."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.lib.load import Result, percentile, summarize


def _engine(model_dir: str) -> Any:
    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings.runtime import engine_config_of

    return CosyVoiceEngine(engine_config_of(model_dir, torch_threads=1))


def _request(engine: Any, text: str, stream: bool) -> Any:
    from app.engines.base import SynthesisRequest

    return SynthesisRequest(text=text, mode="sft", speaker=engine.voices()[0], stream=stream)


def one(engine: Any, req: Any) -> tuple[float, float | None, float]:
    """Run one synthesis to the end: (latency, time to first chunk, audio seconds)."""
    t0, first, audio = time.monotonic(), None, 0.0
    for chunk in engine.synthesize(req, threading.Event()):
        first = time.monotonic() - t0 if first is None else first
        audio += chunk.duration_s
    return time.monotonic() - t0, first, audio


def loop(engine: Any, req: Any, t_measure: float, t_end: float, out: list[Result]) -> None:
    """Closed loop until ``t_end``; keep the runs that ended after ``t_measure``."""
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        try:
            lat, first, _ = one(engine, req)
            kind = "ok"
        except Exception:
            lat, first, kind = time.monotonic() - t0, None, "error"
        if t0 + lat >= t_measure:
            out.append(Result(t0, 200, lat, first, 1, kind))


def closed_threads(engines: list[Any], text: str, warmup_s: float, duration_s: float) -> dict:
    results: list[Result] = []
    t_end = (t_measure := time.monotonic() + warmup_s) + duration_s
    with ThreadPoolExecutor(len(engines)) as pool:
        for e in engines:
            pool.submit(loop, e, _request(e, text, False), t_measure, t_end, results)
    return summarize(results, time.monotonic() - t_measure, window=(t_measure, t_end)).to_dict()


def run_threads(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    loads, engines = [], []
    for _ in range(max(2, args.workers)):  # at least two: the first load also pays the imports
        t0, e = time.monotonic(), _engine(args.model_dir)
        e.load()
        loads.append(time.monotonic() - t0)
        engines.append(e)
    for e in engines[args.workers:]:
        e.close()
    engines = engines[: args.workers]
    for e in engines:
        e.warmup()
    c1 = closed_threads(engines[:1], args.text, args.warmup, args.duration)
    cw = closed_threads(engines, args.text, args.warmup, args.duration)
    stream_req = _request(engines[0], args.text, True)
    firsts = [f for _ in range(args.streams) if (f := one(engines[0], stream_req)[1]) is not None]
    for e in engines:
        e.close()
    return {"mode": "threads", "workers": args.workers, "load_s_first": loads[0],
            "load_s": statistics.median(loads[1:]), "c1": c1, "cw": cw, "first_chunk_s": firsts,
            "first_chunk_p50_s": percentile(firsts, 50)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--streams", type=int, default=100)
    args = ap.parse_args(argv)
    out = run_threads(args)
    sys.stdout.flush()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
