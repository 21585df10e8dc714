"""What one request costs: CPU seconds, real-time factor, first audio, flow frames, per stage.

    python -m bench cost [--plan stream] [--models tiny --quick] [--merge]   # make bench-cost: the cost plan

Each (model, variant) runs in its own subprocess, the engine in-process (no HTTP). Variants,
cases and outputs: docs/benchmarks/README.md, "Request cost benchmark" (the CPU cost levers' plan,
``--plan levers``, left the tree after b664af8).
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
from bench.report import cost_goals, cost_markdown, stream_goals

LONG = ("The train to the city leaves at seven every single morning, and the people who ride it read, "
        "sleep or stare at the fields going by.")
SHORT = "The train to the city leaves at seven every single morning."
PROMPT_TEXT = "hello there, this is my voice"
CONCURRENT = 8

# (model, variant) -> cases: (name, text, stream, concurrency, repeats); variant: dtype, "-cache": engine.flow_cache
PLAN: dict[tuple[str, str], list[tuple[str, str, bool, int, int]]] = {
    ("full", "fp32"): [("long-whole", LONG, False, 1, 1), ("long-stream", LONG, True, 1, 1),
                       ("short-whole", SHORT, False, 1, 1), ("short-c8", SHORT, False, CONCURRENT, 1)],
    # c=8 left out at full size: where bf16 is emulated (no avx512_bf16/AMX) it alone would take ~5 min
    ("full", "bf16"): [("short-whole", SHORT, False, 1, 1)],
    ("full", "fp32-cache"): [("long-stream", LONG, True, 1, 1)],
    ("full", "fp32-cache-voice"): [("long-stream", LONG, True, 1, 1)],
    ("tiny", "fp32-cache"): [("long-stream", LONG, True, 1, 3), ("short-c8-stream", SHORT, True, CONCURRENT, 2)],
    ("tiny", "fp32-cache-voice"): [("long-stream", LONG, True, 1, 3),
                                   ("short-c8-stream", SHORT, True, CONCURRENT, 2)],
    ("tiny", "fp32"): [("long-whole", LONG, False, 1, 3), ("long-stream", LONG, True, 1, 3),
                       ("short-whole", SHORT, False, 1, 3), ("short-c8", SHORT, False, CONCURRENT, 2),
                       ("short-c8-stream", SHORT, True, CONCURRENT, 2)],
    ("tiny", "bf16"): [("long-whole", LONG, False, 1, 1), ("long-stream", LONG, True, 1, 1),
                       ("short-whole", SHORT, False, 1, 1), ("short-c8", SHORT, False, CONCURRENT, 1)],
}


# --plan stream: streamed vs whole on the server's engine defaults (flow cache on, issue 48) against the same
# with the flow cache off (what streams cost before) and with exact fp32 caches; c=1 and c=4, long text
STREAM_CASES = [("long-whole", LONG, False, 1, 1), ("long-stream", LONG, True, 1, 1),
                ("long-whole-c4", LONG, False, 4, 1), ("long-stream-c4", LONG, True, 4, 1)]
STREAM_PLAN: dict[tuple[str, str], list[tuple[str, str, bool, int, int]]] = {
    ("full", "defaults"): STREAM_CASES, ("full", "recompute"): STREAM_CASES,
    ("full", "exact"): [STREAM_CASES[1]],
    **{("tiny", v): [(n, t, st, c, 3) for n, t, st, c, _ in STREAM_CASES] for v in ("defaults", "recompute")},
}
PLANS = {"cost": PLAN, "stream": STREAM_PLAN}
OUTPUTS = {"cost": "cost", "stream": "cost-stream"}


def _server(**over: Any) -> dict[str, Any]:
    """The server's engine settings and ``over``, read in the worker (the driver imports no app code)."""
    from app.settings.runtime import server_engine

    return server_engine(**over)


# variant -> engine settings (over runtime.BARE_ENGINE); "-voice": requests use a registered voice
VARIANTS: dict[str, Any] = {
    "defaults": lambda: _server(), "recompute": lambda: _server(flow_cache=False),
    "exact": lambda: _server(flow_cache_precision="fp32"),
    "fp32": {}, "bf16": {"dtype": "bf16"},
    "fp32-cache": {"flow_cache": True}, "fp32-cache-voice": {"flow_cache": True, "flow_prompt_cache_mb": 1024},
}


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


def _one(engine: Any, text: str, stream: bool, voice: Any = None, counter: FrameCounter | None = None) -> dict:
    """One request: with the prompt audio, or with ``voice`` (registered from the same prompt)."""
    from app.engines.base import SynthesisRequest

    prompt = {"voice": voice} if voice is not None else {"prompt_text": PROMPT_TEXT, "prompt_audio": _prompt()}
    req = SynthesisRequest(text=text, mode="zero_shot", stream=stream, seed=7, **prompt)
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


def run_case(engine: Any, counter: FrameCounter, text: str, stream: bool, concurrency: int,
             voice: Any = None) -> dict:
    counter.take()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if concurrency == 1:
        runs = [_one(engine, text, stream, voice, counter)]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            runs = list(pool.map(lambda _: _one(engine, text, stream, voice), range(concurrency)))
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


def worker(model_dir: str, model: str, variant: str, quick: bool, only: str | None = None,
           plan: str = "cost") -> dict:
    """One (model, variant) in this process, with the variant's engine settings (``VARIANTS``);
    ``-voice`` variants use a registered voice whose prompt flow state is cached."""
    import tempfile

    import torch

    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings.runtime import engine_config_of

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    onnx_dir = tempfile.mkdtemp(prefix="cosyserve-bench-onnx-")  # a fresh export: load_s includes it
    settings = VARIANTS[variant]
    engine = CosyVoiceEngine(engine_config_of(model_dir, torch_threads=1, batching=True, max_batch_size=16,
                                              onnx_cache_dir=onnx_dir,
                                              **(settings() if callable(settings) else settings)))
    engine.load()
    load_s = time.perf_counter() - t0
    runner = engine.runner  # None: the engine runs unbatched
    counter = FrameCounter(engine.loaded.model.flow, getattr(runner, "flow_runtime", None))
    held, budget, pc = [0], getattr(runner, "flow_budget", None), getattr(runner, "prompt_cache", None)
    if budget is not None:  # the flow cache's peak bytes (all streams)
        budget.on_usage = lambda used, _max, _n: held.__setitem__(0, max(held[0], used))
    _one(engine, "Hello.", False)  # warm-up: first-call kernel setup, the prompt's features (cached)
    voice, voice_fill = None, None
    if variant.endswith("-voice"):
        voice = engine.compute_voice(PROMPT_TEXT, _prompt())
        voice_fill = run_case(engine, counter, SHORT, True, 1, voice)  # the miss: fills the voice's prompt cache
        log(f"{model} {variant} voice-miss (short stream): cpu {voice_fill['cpu_s_per_request']:.2f} s, "
            f"flow frames {voice_fill['flow_frames_per_request']:.0f}, "
            f"first hop {voice_fill['first_hop_flow_frames']:.0f}")
    cases = {}
    for name, text, stream, conc, reps in PLANS[plan][(model, variant)]:
        if quick and (conc > 1 or name.startswith("long")) and model == "full":
            continue
        if only and name not in only.split(","):
            continue
        results = [run_case(engine, counter, text, stream, conc, voice) for _ in range(1 if quick else reps)]
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
    if pc is not None:
        out["voice_cache"] = {"hits": pc.hits, "misses": pc.misses, "bytes": pc.bytes, "fill": voice_fill}
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
    ap.add_argument("--plan", choices=sorted(PLANS), default="cost",
                    help="cost: fp32/bf16/flow cache (cost.*); stream: streamed vs whole on the server's defaults "
                         "(cost-stream.*)")
    ap.add_argument("--models", default="full,tiny", help="comma list of full, tiny")
    ap.add_argument("--variants", default=None,
                    help="comma list from VARIANTS (default: the plan's: fp32,bf16,fp32-cache,fp32-cache-voice; "
                         "stream: defaults,recompute,exact)")
    ap.add_argument("--cases", default=None, help="comma list: run only these cases (e.g. long-whole,long-stream)")
    ap.add_argument("--merge", action="store_true",
                    help="update the plan's JSON (cost.json, cost-stream.json) already in --out with the re-run cases")
    ap.add_argument("--quick", action="store_true", help="one repeat, full size: short c=1 only")
    ap.add_argument("--out", default=str(results_dir("cost")),
                    help="output dir (default .cache/bench/cost, git-ignored; --merge reads the JSON there)")
    ap.add_argument("--worker-timeout-s", type=float, default=900.0, help="most seconds per (model, dtype) run")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL_DIR", "MODEL", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker, quick=args.quick, only=args.cases, plan=args.plan)),
              flush=True)
        return 0
    plan, name = PLANS[args.plan], OUTPUTS[args.plan]
    variants = args.variants or ",".join(dict.fromkeys(v for _, v in plan))  # the plan's, in its order
    results: dict[str, dict] = {}
    host = _host()
    log(f"host {host}")
    for model in args.models.split(","):
        model_dir = ensure_full_model() if model == "full" else ensure_model(2)
        for dtype in variants.split(","):
            if (model, dtype) not in plan:
                continue
            log(f"{model} {dtype}: {shown(model_dir)}")
            cmd = python_module("bench", "cost", "--plan", args.plan, "--worker", model_dir, model, dtype)
            cmd += (["--quick"] if args.quick else []) + (["--cases", args.cases] if args.cases else [])
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **THREAD_ENV}, stdout=subprocess.PIPE,
                                      text=True, check=False, timeout=args.worker_timeout_s)
            except subprocess.TimeoutExpired:
                log(f"{model} {dtype} ran past {args.worker_timeout_s} s: left out")
                continue
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                log(f"{model} {dtype} failed (exit {proc.returncode})")
                continue
            results.setdefault(model, {})[dtype] = json.loads(line[len("RESULT "):])
    command = " ".join(["python -m bench cost", *(argv if argv is not None else sys.argv[1:])])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = [command]
    if args.merge and (out / f"{name}.json").is_file():
        old = json.loads((out / f"{name}.json").read_text())
        commands = [*old["commands"], command]
        merged = old["results"]
        for model, by_variant in results.items():
            for variant, res in by_variant.items():
                # a variant run before: its cases updated (a new one: itself, unchanged)
                merged.setdefault(model, {}).setdefault(variant, res)["cases"].update(res["cases"])
        results = merged
    doc = {"commands": commands, "host": host, "results": results,
           "goals": (stream_goals if args.plan == "stream" else cost_goals)(results)}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{name}.md").write_text(cost_markdown(doc, args.plan))
    for g in doc["goals"]:
        log(g)
    log(f"wrote {shown(str(out / f'{name}.json'))}, {name}.md")
    return 0
