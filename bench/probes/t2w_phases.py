"""Batched token2wav phases: time to first audio, throughput, flow rounds and LLM steps per concurrency.

In-process (no HTTP), one CosyVoice engine at a time, the same requests for every setting:

    python -m bench.probes.t2w_phases --model-dir DIR [--batch off,on] [--concurrency 1,4,8] [--requests 2]
                               [--whole] [--first-chunk-tokens N] [--json OUT]

For the GPU check (``bench/gpu_check.py``), call :func:`compare` (or :func:`load_engine` +
:func:`phase`) with the model dir; it returns plain dicts:

    from bench.probes.t2w_phases import compare
    results = compare(model_dir, batches=("off", "on"), concurrency=(1, 4, 8, 16), stream=True,
                      engine_kw={"dtype": "fp16"})
    # {"off": [{"concurrency": 1, "ttfa_p50_s": ..., ...}, ...], "on": [...]}

Per concurrency level ``c``: ``c`` client threads each take requests from a list of
``requests * c`` until it is empty (closed loop); each request is a streamed (or whole,
``stream=False``) sft request with the first preset speaker, seeded. Reported: time to
first audio p50/p95 (seconds from the request's start to its first chunk), audio
seconds per wall second, requests per second, and from the engine's observer the flow
rounds (count, mean and largest batch, mean ms) and the LLM steps (count, mean batch,
mean ms). With ``token2wav_batch: off`` there are no flow rounds (the counts are 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."


@dataclass
class Recorder:
    """The engine's observer (LLM steps and flow rounds), thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: list[tuple[int, float]] = field(default_factory=list)
    rounds: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0

    def on_step(self, batch_size: int, seconds: float) -> None:
        with self.lock:
            self.steps.append((batch_size, seconds))

    def on_tokens(self, n: int) -> None:
        with self.lock:
            self.tokens += n

    def on_flow_round(self, batch_size: int, seconds: float) -> None:
        with self.lock:
            self.rounds.append((batch_size, seconds))

    def mark(self) -> tuple[int, int]:
        with self.lock:
            return len(self.steps), len(self.rounds)


def load_engine(model_dir: str, token2wav_batch: str = "auto", *, max_batch_size: int = 16,
                torch_threads: int = 1, **engine_kw: Any) -> Any:
    """A loaded, warmed-up batched CosyVoice engine with a :class:`Recorder` as ``engine.recorder``.

    ``token2wav_batch="default"`` leaves the setting out: the engine's default, also on builds that
    predate it (for before/after runs of the same phases).
    """
    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings import EngineSettings
    from app.settings.runtime import engine_config_of

    recorder = Recorder()
    if token2wav_batch != "default":
        if "token2wav_batch" not in EngineSettings.model_fields:
            raise ValueError("this build has no engine.token2wav_batch; use token2wav_batch='default'")
        engine_kw["token2wav_batch"] = token2wav_batch
    cfg = engine_config_of(str(model_dir), batching=True, max_batch_size=max_batch_size,
                           torch_threads=torch_threads, **engine_kw)
    engine = CosyVoiceEngine(cfg, llm_observer=recorder)
    engine.load()
    engine.warmup()
    engine.recorder = recorder
    return engine


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Streamed:
    """What closed-loop clients got: per request its time to first audio and audio seconds; errors; wall time."""

    ttfa: list[float]
    audio: list[float]
    errors: list[str]
    wall_s: float


def closed_loop(engine: Any, requests: list[Any], concurrency: int, keep_going: Any = lambda: True) -> Streamed:
    """``concurrency`` client threads take ``requests`` (``SynthesisRequest``s) from the list until it is empty
    (or ``keep_going()`` says stop) and run each through ``engine.synthesize``; an error is counted, not raised."""
    todo = list(requests)
    lock = threading.Lock()
    out = Streamed([], [], [], 0.0)

    def client() -> None:
        while True:
            with lock:
                if not todo or not keep_going():
                    return
                req = todo.pop()
            t0 = time.perf_counter()
            first, seconds = None, 0.0
            try:
                for chunk in engine.synthesize(req, threading.Event()):
                    first = first if first is not None else time.perf_counter() - t0
                    seconds += chunk.duration_s
            except Exception as exc:  # noqa: BLE001 - reported, not fatal to the phase
                with lock:
                    out.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                out.ttfa.append(first if first is not None else float("nan"))
                out.audio.append(seconds)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, name=f"t2w-bench-{k}") for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.wall_s = time.perf_counter() - t0
    return out


def phase(engine: Any, concurrency: int, *, requests: int = 2, stream: bool = True, text: str = TEXT,
          first_chunk_tokens: int | None = None, seed: int = 1) -> dict:
    """One concurrency level on a loaded engine (see the module docstring)."""
    from app.engines.base import SynthesisRequest

    speaker = engine.voices()[0]
    extra = {"first_chunk_tokens": first_chunk_tokens} if stream and first_chunk_tokens else {}
    reqs = [SynthesisRequest(text=text, mode="sft", speaker=speaker, stream=stream, seed=seed + i, **extra)
            for i in range(requests * concurrency)]
    recorder: Recorder = engine.recorder
    steps0, rounds0 = recorder.mark()
    got = closed_loop(engine, reqs, concurrency)
    ttfa, audio, errors, wall = got.ttfa, got.audio, got.errors, got.wall_s
    with recorder.lock:
        steps = recorder.steps[steps0:]
        rounds = recorder.rounds[rounds0:]
    return {
        "concurrency": concurrency, "requests": len(audio), "errors": errors, "stream": stream,
        "first_chunk_tokens": first_chunk_tokens, "wall_s": wall,
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


def compare(model_dir: str, *, batches: tuple[str, ...] = ("off", "on"), concurrency: tuple[int, ...] = (1, 4, 8),
            requests: int = 2, stream: bool = True, text: str = TEXT, first_chunk_tokens: int | None = None,
            engine_kw: dict | None = None, log: Any = print) -> dict[str, list[dict]]:
    """Every concurrency level for each ``token2wav_batch`` setting, one engine loaded at a time."""
    out: dict[str, list[dict]] = {}
    for batch in batches:
        engine = load_engine(model_dir, batch, max_batch_size=max(16, max(concurrency)), **(engine_kw or {}))
        try:
            out[batch] = []
            for c in concurrency:
                row = phase(engine, c, requests=requests, stream=stream, text=text,
                            first_chunk_tokens=first_chunk_tokens)
                out[batch].append(row)
                if log is not None:
                    log(line(batch, row))
        finally:
            engine.close()
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def _n(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def header() -> str:
    return ("| token2wav_batch | c | reqs | TTFA p50 ms | TTFA p95 ms | audio-s/s | req/s | flow rounds | "
            "round batch mean / max | round ms | LLM step ms (batch) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")


def line(batch: str, r: dict) -> str:
    rounds = f"{_n(r['flow_batch_mean'])} / {r['flow_batch_max'] or '-'}"
    llm = f"{_n(r['llm_step_ms_mean'], '.1f')} ({_n(r['llm_batch_mean'], '.1f')})"
    return (f"| {batch} | {r['concurrency']} | {r['requests']} | {_ms(r['ttfa_p50_s'])} | {_ms(r['ttfa_p95_s'])} | "
            f"{_n(r['audio_s_per_s'])} | {_n(r['req_per_s'])} | {r['flow_rounds']} | {rounds} | "
            f"{_n(r['flow_round_ms_mean'], '.0f')} | {llm} |" + (f" errors: {len(r['errors'])}" if r["errors"] else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", default="off,on", help="token2wav_batch settings, comma-separated "
                    "(auto, on, off; default: leave it out)")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests per client thread")
    ap.add_argument("--whole", action="store_true", help="whole-file requests instead of streamed ones")
    ap.add_argument("--first-chunk-tokens", type=int, default=None)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    ap.add_argument("--flow-runtime", default="auto", help="engine.flow_runtime (default auto, the server's: "
                    "ONNX Runtime on a CPU for the per-request flow)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    print(header())
    results = compare(args.model_dir, batches=tuple(args.batch.split(",")),
                      concurrency=tuple(int(c) for c in args.concurrency.split(",")), requests=args.requests,
                      stream=not args.whole, text=args.text, first_chunk_tokens=args.first_chunk_tokens,
                      engine_kw={"torch_threads": args.threads, "llm_greedy": False,
                                 "flow_runtime": args.flow_runtime})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
