"""The GPU check: does cosyserve's engine run right, and how fast, on this CUDA machine?

    python -m bench gpu                       # CUDA: full-size v2 built here, .cache/bench/gpu_check/gpu.{md,json}
    python -m bench gpu --device cpu --quick  # CI: tiny v2 on the CPU, .cache/bench/gpu_check/cpu.{md,json}
    make gpu-check                            # the first, after installing the wheels in .whl/ (docs/gpu.md)

The engine in-process, no HTTP; what it reports: docs/gpu.md, "The GPU check". A phase that would
overrun ``--budget-s`` is skipped and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import gpu_markdown, percentile

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Batching many requests together makes the language model far cheaper per token.",
    "A sentence of middling length, spoken once and then forgotten.",
]
STREAM_TEXT = "The train to the city leaves at seven every morning, and the people who ride it read or sleep."
log = logging.getLogger("cosyserve.gpu_check")


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- environment and model ----------------------------------------------------------------------------
def environment(device: Any) -> dict:
    import importlib.metadata as md

    import torch

    from app.engines.cosyvoice.device import describe_device

    info = describe_device(device)
    versions = {}
    for dist in ("torch", "torchaudio", "transformers", "numpy", "onnxruntime", "cosyvoice-minicpmo", "diffusers"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    info.update(python=platform.python_version(), platform=platform.platform(), versions=versions,
                cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    return info


def model_dir(args: argparse.Namespace) -> tuple[str, float]:
    """The model dir to check and the seconds it took to build (0 when it was there)."""
    if args.model_dir:
        return args.model_dir, 0.0
    t0 = time.monotonic()
    if args.quick:
        from app.devmodels.tiny import ensure_tiny_model

        return str(ensure_tiny_model(ROOT / ".cache" / "models", 2)), time.monotonic() - t0
    from app.engines.cosyvoice.layout import TINY_MARKER
    from bench.lib.model import ensure_full_model

    path = ROOT / ".cache" / "gpu_check" / "full2"
    built = not (path / TINY_MARKER).is_file()
    return ensure_full_model(path), time.monotonic() - t0 if built else 0.0


@dataclass
class Recorder:
    """The engine's observer (LLM steps and flow rounds), thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: list[tuple[int, float]] = field(default_factory=list)
    rounds: list[tuple[int, float]] = field(default_factory=list)

    def on_step(self, batch_size: int, seconds: float) -> None:
        with self.lock:
            self.steps.append((batch_size, seconds))

    def on_tokens(self, n: int) -> None:
        pass

    def on_flow_round(self, batch_size: int, seconds: float) -> None:
        with self.lock:
            self.rounds.append((batch_size, seconds))


def load_engine(mdir: str, device: str, threads: int, **engine_kw: Any) -> Any:
    """A loaded batched engine (``engine_kw``: more engine settings) with a :class:`Recorder` as ``.recorder``."""
    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings.runtime import engine_config_of

    recorder = Recorder()
    eng = CosyVoiceEngine(engine_config_of(mdir, device=device, batching=True, max_batch_size=16, torch_threads=threads,
                                           text_normalization="off", **engine_kw), llm_observer=recorder)
    eng.load()
    eng.recorder = recorder
    return eng


def request(eng: Any, text: str, stream: bool = False, seed: int | None = None) -> Any:
    from app.engines.base import SynthesisRequest

    return SynthesisRequest(text=text, mode="sft", speaker=eng.voices()[0], stream=stream, seed=seed)


def llm_input(eng: Any, text: str) -> dict:
    from tests.support.llm_reference import llm_inputs

    return llm_inputs(eng, request(eng, text))


@contextlib.contextmanager
def scheduler(lm: Any, greedy: bool, trace: bool = False, probe: Any = None) -> Iterator[Any]:
    """A started batched LLM scheduler over ``lm``, stopped when the block ends."""
    from app.engines.cosyvoice.llm.sampling import SamplingRules
    from app.engines.cosyvoice.llm.scheduler import LLMScheduler

    sched = LLMScheduler(lm, max_batch_size=16, rules=SamplingRules.from_llm(lm.llm, greedy=greedy), trace_logp=trace,
                         step_probe=probe)
    sched.start()
    try:
        yield sched
    finally:
        sched.stop()


def finish(seqs: list, timeout: float = 300) -> None:
    for seq in seqs:
        seq.wait_for(1 << 30, timeout=timeout)


# -- parity ---------------------------------------------------------------------------------------------
def parity(eng: Any, texts: list[str]) -> dict:
    """Batched greedy tokens against CosyVoice's own ``llm.inference`` alone (greedy, ranked_greedy)."""
    from app.engines.cosyvoice.llm.forward import BatchedLM
    from tests.support.llm_reference import reference, submit

    inputs = [llm_input(eng, t) for t in texts]
    refs = [reference(eng, mi, greedy=True) for mi in inputs]
    lm = BatchedLM(eng.loaded.model.llm)
    with scheduler(lm, greedy=True, trace=True) as sched:
        seqs = [submit(lm, sched, mi) for mi in inputs]
        finish(seqs)
    equal = [s.tokens == ref for s, (ref, _) in zip(seqs, refs, strict=True)]
    worst = 0.0
    for seq, (_, steps) in zip(seqs, refs, strict=True):
        for a, b in zip(seq.logp_trace, steps, strict=False):
            live = b > -50.0
            worst = max(worst, float((a[live] - b[live]).abs().max()))
    return {"requests": len(texts), "tokens_equal": sum(equal), "tokens": [len(r) for r, _ in refs],
            "max_logp_diff": worst, "batch": sched.max_batch_seen}


def seeded(eng: Any, device: Any, texts: list[str], seed: int = 1234) -> dict:
    """Seeded tokens: alone vs inside a batch on this device, and this device vs the CPU."""
    import torch

    from app.engines.cosyvoice.llm.forward import BatchedLM
    from tests.support.llm_reference import submit

    llm = eng.loaded.model.llm
    inputs = [llm_input(eng, t) for t in texts]
    lm = BatchedLM(llm)
    with scheduler(lm, greedy=False) as sched:
        alone = submit(lm, sched, inputs[1], seed=seed)
        finish([alone])
        batch = [submit(lm, sched, mi, seed=seed if i == 1 else 7 + i) for i, mi in enumerate(inputs)]
        finish(batch)
    out = {"alone_equals_batched": alone.tokens == batch[1].tokens, "tokens": len(alone.tokens)}
    if device.type == "cpu":
        out["cpu_equals_device"] = None  # one device only
        return out
    cpu_llm = copy.deepcopy(llm).to("cpu")
    cpu_lm = BatchedLM(cpu_llm)
    with scheduler(cpu_lm, greedy=False) as cpu_sched:
        on_cpu = submit(cpu_lm, cpu_sched, {k: v.cpu() if isinstance(v, torch.Tensor) else v
                                            for k, v in inputs[1].items()}, seed=seed)
        finish([on_cpu], timeout=600)
    pairs = enumerate(zip(on_cpu.tokens, alone.tokens, strict=False))
    first_diff = next((i for i, (a, b) in pairs if a != b), None)
    out.update(cpu_equals_device=on_cpu.tokens == alone.tokens, cpu_tokens=len(on_cpu.tokens),
               first_difference=first_diff)
    del cpu_llm
    return out


def drift(eng: Any, device: Any, text: str, steps: int = 60) -> dict:
    """Half-precision LLM log-probs against fp32, teacher-forced on fp32's greedy tokens."""
    import torch

    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.precision import llm_in

    llm = eng.loaded.model.llm
    model_input = llm_input(eng, text)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    args = (model_input["text"], model_input.get("prompt_text", empty),
            model_input.get("llm_prompt_speech_token", empty))
    out, ref = {}, BatchedLM(llm)
    for name in ["fp16"] if device.type == "cuda" and not torch.cuda.is_bf16_supported() else ["fp16", "bf16"]:
        half = copy.deepcopy(llm)
        llm_in(half, torch.float16 if name == "fp16" else torch.bfloat16)
        low = BatchedLM(half)
        worst_rel, worst_abs, agree = 0.0, 0.0, 0
        with torch.inference_mode():
            kv32, kvh = ref.new_cache(), low.new_cache()
            _, p32 = ref.prefill(kv32, ref.prefix(*args)[0])
            _, ph = low.prefill(kvh, low.prefix(*args)[0])
            for _ in range(steps):
                a, b = ph.float().cpu(), p32.float().cpu()
                live = b > -50.0
                worst_abs = max(worst_abs, float((a[live] - b[live]).abs().max()))
                worst_rel = max(worst_rel, float((a - b).norm() / b.norm()))
                token = int(b.argmax())
                agree += int(a.argmax()) == token
                p32, ph = ref.decode(kv32, [token])[0], low.decode(kvh, [token])[0]
        out[name] = {"steps": steps, "max_abs_live": worst_abs, "max_rel_l2": worst_rel, "top1_agree": agree / steps,
                     "kv_dtype": str(kvh.dtype).replace("torch.", "")}
        del half, low
    return out


# -- time ----------------------------------------------------------------------------------------------
def stages(eng: Any, device: Any, repeats: int = 3) -> dict:
    """One non-streamed request's seconds per stage, the device synchronised at each boundary (median)."""
    import torch

    model = eng.loaded.model
    rows = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        model_input = llm_input(eng, TEXTS[1])
        t1 = time.perf_counter()
        seq = eng.runner.submit(model_input, threading.Event(), seed=i)
        seq.wait_for(1 << 30, timeout=300)
        t2 = time.perf_counter()
        tokens = torch.tensor([seq.tokens], dtype=torch.int32, device=device)
        n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32, device=device)
        prompt = model_input.get("flow_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32)).to(device)
        feat = model_input.get("prompt_speech_feat", torch.zeros(1, 0, 80)).to(device)
        emb = model_input.get("flow_embedding", torch.zeros(0, 192)).to(device)
        with torch.inference_mode():
            sync(device)
            t3 = time.perf_counter()
            mel, _ = model.flow.inference(token=tokens, token_len=n(tokens), prompt_token=prompt,
                                          prompt_token_len=n(prompt), prompt_feat=feat, prompt_feat_len=n(feat),
                                          embedding=emb, streaming=False, finalize=True)
            sync(device)
            t4 = time.perf_counter()
            speech, _ = model.hift.inference(speech_feat=mel)
            sync(device)
            t5 = time.perf_counter()
        if i:  # the first is a warm-up
            rows.append({"frontend": t1 - t0, "llm": t2 - t1, "flow": t4 - t3, "hift": t5 - t4,
                         "tokens": len(seq.tokens), "audio_s": speech.shape[1] / eng.sample_rate})
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["tokens"] = int(out["tokens"])
    return out


@dataclass
class Streamed:
    """What closed-loop clients got: per request its time to first audio and audio seconds; errors; wall time;
    the LLM steps and flow rounds (batch, seconds) the engine's recorder saw meanwhile."""

    ttfa: list[float] = field(default_factory=list)
    audio: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    steps: list[tuple[int, float]] = field(default_factory=list)
    rounds: list[tuple[int, float]] = field(default_factory=list)


def closed_loop(eng: Any, requests: list[Any], concurrency: int, keep_going: Any = lambda: True) -> Streamed:
    """``concurrency`` client threads take ``requests`` (``SynthesisRequest``s) from the list until it is empty
    (or ``keep_going()`` says stop) and run each through ``eng.synthesize``; an error is counted, not raised."""
    todo = list(requests)
    lock = threading.Lock()
    out = Streamed()
    recorder: Recorder = eng.recorder
    with recorder.lock:
        steps0, rounds0 = len(recorder.steps), len(recorder.rounds)

    def client() -> None:
        while True:
            with lock:
                if not todo or not keep_going():
                    return
                req = todo.pop()
            t0 = time.perf_counter()
            first, seconds = None, 0.0
            try:
                for chunk in eng.synthesize(req, threading.Event()):
                    first = first if first is not None else time.perf_counter() - t0
                    seconds += chunk.duration_s
            except Exception as exc:
                with lock:
                    out.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                out.ttfa.append(first if first is not None else float("nan"))
                out.audio.append(seconds)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="gpu-check") as pool:
        for _ in range(concurrency):
            pool.submit(client)
    out.wall_s = time.perf_counter() - t0
    with recorder.lock:
        out.steps, out.rounds = recorder.steps[steps0:], recorder.rounds[rounds0:]
    return out


def streaming(eng: Any, concurrency: int, requests: int, left: Callable[[], float]) -> dict:
    """Closed loop: ``concurrency`` threads stream ``requests`` requests in all (until ``left()`` s run out)."""
    got = closed_loop(eng, [request(eng, STREAM_TEXT, stream=True, seed=i) for i in range(requests)], concurrency,
                      keep_going=lambda: left() >= 0)
    ttfa, audio, errors, wall, steps = got.ttfa, got.audio, got.errors, got.wall_s, got.steps
    step_s = [s for _, s in steps]
    return {"concurrency": concurrency, "requests": len(ttfa), "errors": errors[:3], "error_count": len(errors),
            "ttfa_p50_s": percentile(ttfa, 50), "ttfa_p95_s": percentile(ttfa, 95),
            "audio_s_per_wall_s": sum(audio) / wall if wall > 0 else None, "wall_s": wall,
            "llm_step_ms_p50": 1000 * statistics.median(step_s) if step_s else None,
            "llm_mean_batch": statistics.mean(b for b, _ in steps) if steps else None,
            "llm_steps": len(step_s)}


def syncs(eng: Any, device: Any) -> dict:
    """Host syncs per decode step of 4 sequences: the CPU proxy, and on CUDA the driver's own count."""
    from app.engines.cosyvoice.llm.forward import BatchedLM
    from tests.support.llm_reference import submit
    from tests.support.syncs import CudaSyncCounter, HostSyncCounter, summary

    out = {}
    counters: list[tuple[str, Any]] = [("proxy", HostSyncCounter())]
    if device.type == "cuda":
        counters.append(("cuda_flagged", CudaSyncCounter()))
    inputs = [llm_input(eng, t) for t in TEXTS]
    for name, counter in counters:
        lm = BatchedLM(eng.loaded.model.llm)
        with scheduler(lm, greedy=False, probe=counter.probe) as sched:
            finish([submit(lm, sched, mi, seed=i) for i, mi in enumerate(inputs)])
        out[name] = summary(counter.per_step[1:])  # the first step may include one-off setup
        kind = "kinds" if name == "proxy" else "messages"
        out[name][kind] = dict(getattr(counter, kind))
    out["by_design"] = "one event wait per step (the log-prob download); not flagged by set_sync_debug_mode"
    return out


def prefill(eng: Any, quick: bool) -> dict:
    """16 requests joining 4 running ones at once: the running batch's token gap, one-by-one vs batched prefill."""
    from app.engines.cosyvoice.llm.forward import BatchedLM
    from tests.support.prefill_stall import compare

    lm = BatchedLM(eng.loaded.model.llm)
    return compare(lm, joiners=16, running=4, rounds=1 if quick else 3, prompt=(50, 150) if quick else (100, 300))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def token2wav_point(eng: Any, concurrency: int, requests: int) -> dict:
    """``requests`` streamed requests per client thread at one concurrency: TTFA, throughput, flow rounds, LLM steps."""
    reqs = [request(eng, STREAM_TEXT, stream=True, seed=1 + i) for i in range(requests * concurrency)]
    got = closed_loop(eng, reqs, concurrency)
    ttfa, audio, wall, steps, rounds = got.ttfa, got.audio, got.wall_s, got.steps, got.rounds
    return {
        "concurrency": concurrency, "requests": len(audio), "errors": got.errors, "stream": True,
        "first_chunk_tokens": None, "wall_s": wall,
        "ttfa_p50_s": statistics.median(ttfa) if ttfa else None, "ttfa_p95_s": _pct(ttfa, 0.95),
        "audio_s": sum(audio), "audio_s_per_s": sum(audio) / wall if wall > 0 else None,
        "req_per_s": len(audio) / wall if wall > 0 else None,
        "flow_rounds": len(rounds),
        "flow_batch_mean": statistics.fmean(b for b, _ in rounds) if rounds else None,
        "flow_batch_max": max((b for b, _ in rounds), default=None),
        "flow_round_ms_mean": 1000 * statistics.fmean(s for _, s in rounds) if rounds else None,
        "llm_steps": len(steps),
        "llm_batch_mean": statistics.fmean(b for b, _ in steps) if steps else None,
        "llm_step_ms_mean": 1000 * statistics.fmean(s for _, s in steps) if steps else None,
    }


def token2wav(mdir: str, device: str, quick: bool, threads: int) -> dict:
    """``engine.token2wav_batch`` off vs on: the same streamed requests on one engine per setting."""
    levels = (1, 4) if quick else (1, 4, 8, 16)
    runs: dict[str, list[dict]] = {}
    for setting in ("off", "on"):
        eng = load_engine(mdir, device, threads, token2wav_batch=setting)
        try:
            eng.warmup()
            runs[setting] = [token2wav_point(eng, c, 1 if quick else 2) for c in levels]
        finally:
            eng.close()
    return {"levels": list(levels), "runs": runs}


def gpu_memory(device: Any) -> dict | None:
    """Peak GPU memory while streaming (the model, the KV cache, 16 requests' flow/HiFT)."""
    import torch

    if device.type != "cuda":
        return None
    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "allocated_after_bytes": int(torch.cuda.memory_allocated(device))}


# -- main ------------------------------------------------------------------------------------------------
def phase(doc: dict, name: str, fn: Any, needs: float, left: Callable[[], float]) -> None:
    """``doc[name] = fn()`` and its seconds, or why not: skipped (under ``needs`` s of budget left) or failed."""
    if left() < needs:
        doc[name] = {"skipped": f"time budget ({left():.0f} s left, needs ~{needs} s)"}
        say(f"{name}: skipped (time budget)")
        return
    t = time.monotonic()
    try:
        doc[name] = fn()
    except Exception as exc:
        log.exception("phase %s failed", name)
        doc[name] = {"failed": repr(exc)}
    doc[name + "_s"] = round(time.monotonic() - t, 1)
    say(f"{name}: {json.dumps(doc[name], default=str)[:300]}")


def run(args: argparse.Namespace) -> dict:
    import torch

    from app.engines.cosyvoice.device import resolve_device

    end = time.monotonic() + args.budget_s
    left = lambda: end - time.monotonic()
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    doc: dict[str, Any] = {"mode": "quick" if args.quick else "full", "budget_s": args.budget_s,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": environment(device)}
    say(f"device {device}: {doc['environment'].get('name')}")
    mdir, built_s = model_dir(args)
    doc["model"] = {"dir": os.path.relpath(mdir, ROOT) if mdir.startswith(str(ROOT)) else Path(mdir).name,
                    "build_s": built_s, "full_size": not args.quick}
    t0 = time.monotonic()
    eng = load_engine(mdir, str(device), args.threads)
    doc["model"]["load_s"] = time.monotonic() - t0
    doc["model"]["precision"] = eng.loaded.precision.stage_dtypes()
    say(f"loaded in {doc['model']['load_s']:.1f} s")
    phases = [
        ("parity", lambda: parity(eng, TEXTS if not args.quick else TEXTS[:3]), 60),
        ("seeded", lambda: seeded(eng, device, TEXTS[:3]), 60),
        ("drift", lambda: drift(eng, device, TEXTS[1], steps=30 if args.quick else 60), 30),
        ("stages", lambda: stages(eng, device, repeats=2 if args.quick else 3), 30),
        ("syncs", lambda: syncs(eng, device), 20),
        ("prefill", lambda: prefill(eng, args.quick), 30),
    ]
    levels = [(1, 2, 20), (4, 4, 30), (16, 16, 60)] if args.quick else [(1, 4, 30), (4, 12, 60), (16, 32, 90)]
    try:
        eng.warmup()
        for name, fn, needs in phases:
            phase(doc, name, fn, needs, left)
        doc["streaming"] = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the peak below is the serving one
        for c, n, needs in levels:
            if left() < needs:
                doc["streaming"].append({"concurrency": c, "skipped": "time budget"})
                continue
            point = streaming(eng, c, n, left)
            doc["streaming"].append(point)
            say(f"concurrency {c}: {json.dumps(point, default=str)[:300]}")
        doc["gpu_memory"] = gpu_memory(device)
    finally:
        eng.close()
    # two more engines (one per setting) and their streams
    phase(doc, "token2wav", lambda: token2wav(mdir, str(device), args.quick, args.threads),
          60 if args.quick else 150, left)
    doc["elapsed_s"] = round(args.budget_s - left(), 1)
    return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--quick", action="store_true", help="the tiny v2 model and fewer requests (CI, ~1-2 min on a CPU)")
    ap.add_argument("--model-dir", help="check this CosyVoice2 dir instead of building the full-size one")
    ap.add_argument("--budget-s", type=float, default=None, help="time budget in seconds (default 480; quick 240)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 4 on CUDA, 1 on a CPU)")
    ap.add_argument("--out", help="output prefix (default .cache/bench/gpu_check/gpu, on a CPU .../cpu; git-ignored)")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    args.budget_s = args.budget_s or (240.0 if args.quick else 480.0)
    args.threads = args.threads or (1 if cpu else 4)
    args.out = args.out or str(ROOT / ".cache" / "bench" / "gpu_check" / ("cpu" if cpu else "gpu"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "cpu":  # before torch starts CUDA: what the CUDA image sets (docs/gpu.md)
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from app.engines.cosyvoice.device import DeviceUnavailable

    try:
        doc = run(args)
    except DeviceUnavailable as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(gpu_markdown(doc), encoding="utf-8")
    say(f"wrote {out.with_suffix('.md')} and .json in {doc['elapsed_s']} s")
    failed = [k for k, v in doc.items() if isinstance(v, dict) and "failed" in v]
    return 1 if failed else 0
