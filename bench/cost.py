"""What a request costs, streamed against whole, on the server's engine defaults (issue 48): CPU seconds,
real-time factor, first audio, flow frames, per stage, peak RSS.

    python -m bench cost [--models full|tiny] [--variants defaults,recompute,exact,bf16] [--quick] [--merge]

Each (model, variant) runs in its own subprocess, the engine in-process (no HTTP). Variants,
cases and outputs: docs/benchmarks/README.md, "Request cost benchmark" (the plans of fp32 vs bf16,
the opt-in flow cache and a voice's prompt cache left the tree after 778acfc; the CPU levers' after b664af8).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.lib.model import ensure_full_model, ensure_model
from bench.lib.procs import ROOT, THREAD_ENV, logger, python_module, results_dir, shown
from bench.report import cost_markdown, stream_goals

LONG = ("The train to the city leaves at seven every single morning, and the people who ride it read, "
        "sleep or stare at the fields going by.")
PROMPT_TEXT = "hello there, this is my voice"

# Streamed vs whole (issue 48): long text, c=1 and c=4; each case (name, text, stream, concurrency)
CASES = [("long-whole", LONG, False, 1), ("long-stream", LONG, True, 1),
         ("long-whole-c4", LONG, False, 4), ("long-stream-c4", LONG, True, 4)]
REPEATS = {"full": 1, "tiny": 3}  # each case this often; the least disturbed run is kept
ONLY = {"exact": ["long-stream"]}  # variants that run some cases only
OUTPUT = "cost-stream"


# variant -> the engine settings it runs with: the server's defaults, or those with a change
VARIANTS: dict[str, dict[str, Any]] = {"defaults": {}, "recompute": {"flow_cache": False},
                                       "exact": {"flow_cache_precision": "fp32"}, "bf16": {"dtype": "bf16"}}
DEFAULT_VARIANTS = "defaults,recompute,exact"


log = logger("cost")


# -- worker (one model, one variant, in its own process) -----------------------------------------------
class FrameCounter:
    """Counts the mel frames the flow estimator computes per request (its frames per call / ODE steps),
    in torch (a forward hook) and on ONNX Runtime (the session's own tally)."""

    def __init__(self, flow: Any, stream_graph: Any = None) -> None:
        from app.engines.cosyvoice.flow.solver import MODEL_STEPS, onnx_of, options_of

        self.frames = 0
        self.steps = options_of(flow.decoder).steps or MODEL_STEPS
        self.graphs = [g for g in (onnx_of(flow), stream_graph) if g is not None]  # the flow cache's graph too
        self._graphs_seen = self._graph_frames()
        self._lock = threading.Lock()
        flow.decoder.estimator.register_forward_pre_hook(self._count)

    def _count(self, _module: Any, args: tuple) -> None:
        with self._lock:
            self.frames += int(args[0].shape[2])

    def _graph_frames(self) -> int:
        return sum(g.frames for g in self.graphs)

    def take(self, reset: bool = True) -> float:
        """The frames since the last take (``reset`` False: a peek)."""
        with self._lock:
            n = self.frames + self._graph_frames() - self._graphs_seen
            if reset:
                self.frames, self._graphs_seen = 0, self._graph_frames()
        return n / self.steps


def _prompt() -> Any:
    import numpy as np

    from app.engines.base import PromptAudio

    t = np.arange(32000) / 16000.0
    wav = 0.3 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return PromptAudio(wav.astype(np.float32), 16000)


def _one(engine: Any, text: str, stream: bool, counter: FrameCounter | None = None) -> dict:
    """One zero-shot request with the 2 s prompt."""
    from app.engines.base import SynthesisRequest

    req = SynthesisRequest(text=text, mode="zero_shot", stream=stream, seed=7, prompt_text=PROMPT_TEXT,
                           prompt_audio=_prompt())
    t0 = time.perf_counter()
    first = first_frames = None
    samples = 0
    for chunk in engine.synthesize(req, threading.Event()):
        if first is None:
            first = time.perf_counter() - t0
            first_frames = counter.take(reset=False) if counter is not None else None
        samples += len(chunk.pcm)
    return {"wall_s": time.perf_counter() - t0, "ttfa_s": first, "audio_s": samples / engine.sample_rate,
            "first_frames": first_frames, "stages": req.timings.snapshot()}


def run_case(engine: Any, counter: FrameCounter, text: str, stream: bool, concurrency: int) -> dict:
    counter.take()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if concurrency == 1:
        runs = [_one(engine, text, stream, counter)]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            runs = list(pool.map(lambda _: _one(engine, text, stream), range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    audio = sum(r["audio_s"] for r in runs)
    stages: dict[str, float] = {}
    for r in runs:
        for k, v in r["stages"].items():
            stages[k] = stages.get(k, 0.0) + v / concurrency
    return {"concurrency": concurrency, "stream": stream, "cpu_s_per_request": cpu / concurrency,
            "wall_s": wall, "audio_s_per_request": audio / concurrency,
            "rtf": statistics.median(r["wall_s"] / max(1e-9, r["audio_s"]) for r in runs),
            "cpu_rtf": cpu / max(1e-9, audio), "audio_s_per_wall_s": audio / wall,
            "ttfa_s": statistics.median(r["ttfa_s"] for r in runs if r["ttfa_s"] is not None),
            "flow_frames_per_request": counter.take() / concurrency,
            "first_hop_flow_frames": runs[0]["first_frames"] if concurrency == 1 and stream else None,
            # the worker's peak RSS so far (one variant per process: the cases run in order, c=4 last)
            "stages_s_per_request": stages, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def worker(model_dir: str, model: str, variant: str, quick: bool, only: str | None = None) -> dict:
    """One (model, variant) in this process: the server's engine settings with the variant's (``VARIANTS``)."""
    import tempfile

    import torch

    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings.runtime import engine_config_of, server_engine

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    onnx_dir = tempfile.mkdtemp(prefix="cosyserve-bench-onnx-")  # a fresh export: load_s includes it
    engine = CosyVoiceEngine(engine_config_of(model_dir, torch_threads=1, batching=True, max_batch_size=16,
                                              onnx_cache_dir=onnx_dir, **server_engine(**VARIANTS[variant])))
    engine.load()
    load_s = time.perf_counter() - t0
    runner = engine.runner  # None: the engine runs unbatched
    counter = FrameCounter(engine.loaded.model.flow, getattr(runner, "flow_runtime", None))
    held, budget = [0], getattr(runner, "flow_budget", None)
    if budget is not None:  # the flow cache's peak bytes (all streams)
        budget.on_usage = lambda used, _max, _n: held.__setitem__(0, max(held[0], used))
    _one(engine, "Hello.", False)  # warm-up: first-call kernel setup, the prompt's features (cached)
    cases = {}
    for name, text, stream, conc in CASES:
        if name not in ONLY.get(variant, [name]) or (only and name not in only.split(",")) or (quick and conc > 1):
            continue
        results = [run_case(engine, counter, text, stream, conc) for _ in range(1 if quick else REPEATS[model])]
        best = min(results, key=lambda r: r["cpu_s_per_request"])  # least disturbed run
        best["repeats"] = len(results)
        cases[name] = best
        log(f"{model} {variant} {name}: cpu {best['cpu_s_per_request']:.2f} s/req, wall {best['wall_s']:.2f} s, "
            f"ttfa {best['ttfa_s']:.2f} s, audio {best['audio_s_per_request']:.2f} s, "
            f"flow frames {best['flow_frames_per_request']:.0f}, first hop {best['first_hop_flow_frames']}")
    precision = engine.loaded.precision
    out = {"model": model, "variant": variant, "ran": precision.dtype, "stages_reduced": list(precision.stages),
           "flow_cache": bool(getattr(runner, "flow_cache", False)), "levers": engine.loaded.levers.describe(),
           "load_s": load_s, "cases": cases}
    if budget is not None:
        out["flow_cache_budget"] = {"max_mb": budget.max_bytes / 2**20, "peak_mb": held[0] / 2**20,
                                    "recomputed": budget.recomputed,
                                    "runtime": "onnxruntime" if runner.flow_runtime is not None else "torch"}
    engine.close()
    shutil.rmtree(onnx_dir, ignore_errors=True)
    return out


# -- driver ------------------------------------------------------------------------------------------
def _host() -> dict:
    flags, name = "", platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = line
            if line.startswith("model name") and name == platform.machine():
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": name, "cores": os.cpu_count(),
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
            "load_avg_at_start": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="full,tiny", help="comma list of full, tiny")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--cases", default=None, help="comma list: run only these cases (e.g. long-whole,long-stream)")
    ap.add_argument("--merge", action="store_true",
                    help=f"update the {OUTPUT}.json already in --out with the re-run cases")
    ap.add_argument("--quick", action="store_true", help="one repeat, c=1 only (a smoke run: --models tiny)")
    ap.add_argument("--out", default=str(results_dir("cost")),
                    help="output dir (default .cache/bench/cost, git-ignored; --merge reads the JSON there)")
    ap.add_argument("--worker-timeout-s", type=float, default=900.0, help="most seconds per (model, variant) run")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL_DIR", "MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker, quick=args.quick, only=args.cases)), flush=True)
        return 0
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(sorted(unknown))}; known: {', '.join(VARIANTS)}")
    results: dict[str, dict] = {}
    host = _host()
    log(f"host {host}")
    for model in args.models.split(","):
        model_dir = ensure_full_model() if model == "full" else ensure_model(2)
        for variant in args.variants.split(","):
            log(f"{model} {variant}: {shown(model_dir)}")
            cmd = python_module("bench", "cost", "--worker", model_dir, model, variant)
            cmd += (["--quick"] if args.quick else []) + (["--cases", args.cases] if args.cases else [])
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **THREAD_ENV}, stdout=subprocess.PIPE,
                                      text=True, check=False, timeout=args.worker_timeout_s)
            except subprocess.TimeoutExpired:
                log(f"{model} {variant} ran past {args.worker_timeout_s} s: left out")
                continue
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                log(f"{model} {variant} failed (exit {proc.returncode})")
                continue
            results.setdefault(model, {})[variant] = json.loads(line[len("RESULT "):])
    command = " ".join(["python -m bench cost", *(argv if argv is not None else sys.argv[1:])])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = [command]
    if args.merge and (out / f"{OUTPUT}.json").is_file():
        old = json.loads((out / f"{OUTPUT}.json").read_text())
        commands = [*old["commands"], command]
        merged = old["results"]
        for model, by_variant in results.items():
            for variant, res in by_variant.items():
                # a variant run before: its cases updated (a new one: itself, unchanged)
                merged.setdefault(model, {}).setdefault(variant, res)["cases"].update(res["cases"])
        results = merged
    doc = {"commands": commands, "host": host, "results": results, "goals": stream_goals(results)}
    (out / f"{OUTPUT}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{OUTPUT}.md").write_text(cost_markdown(doc))
    for g in doc["goals"]:
        log(g)
    log(f"wrote {shown(str(out / f'{OUTPUT}.json'))}, {OUTPUT}.md")
    return 0
