"""What the batching benchmark sends and how many: texts, systems, per-point request counts, estimate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ~19 text tokens with the tiny/full-size BPE tokenizer -> ~38 speech tokens (~1.5 s of audio)
# with the full-size model's calibrated stop (app/devmodels/fullsize.py).
FULL_TEXT = "The train to the city leaves at seven every single morning."
SAMPLE_RATE = 24000  # CosyVoice2; requested explicitly, so PCM bytes / 2 / rate = audio seconds
SPEECH_TOKENS_PER_S = 25  # CosyVoice2: one speech token per 40 ms of audio
CONCURRENCY = (1, 2, 4, 8, 16)
PER_REQUEST_WORKERS = 2  # the known best pool size on 2 cores (docs/benchmarks/README.md)

# Rough CPU-seconds per request on this CPU (COSYVOICE_FACTS.md): full size ~40 speech tokens
# at ~110 ms + flow ~8 s + HiFT ~0.8 s; streaming re-runs the flow over the prefix (~1.6x).
CPU_S = {"full": 13.0, "tiny": 0.55}
STREAM_FACTOR = 1.6
LOAD_S = {"full": 60.0, "tiny": 20.0}  # server start to ready (imports, load per slot, warm-up)
PARALLEL = {"full": 2, "tiny": 1}  # tiny models are GIL-bound: a second core barely helps


@dataclass(frozen=True)
class SystemSpec:
    key: str  # per_request | batched
    label: str
    batching: bool
    workers: int
    max_batch_size: int = 16

    def config(self, model_dir: str, run_dir: Path, max_queue: int, timeout_s: float) -> dict[str, Any]:
        """The cosyserve config for this system (written to the run dir as yaml)."""
        return {
            "server": {"log_level": "warning", "drain_timeout_s": 10},
            "engine": {"model_dir": model_dir, "torch_threads": 1, "batching": self.batching,
                       "max_batch_size": self.max_batch_size},
            "pool": {"workers": self.workers, "max_queue": max_queue, "queue_timeout_s": timeout_s,
                     "request_timeout_s": timeout_s},
            "voices": {"dir": str(run_dir / "voices")},
            "metrics": {"enabled": True},
        }


def systems(batched_workers: int = 16, max_batch_size: int = 16) -> list[SystemSpec]:
    return [
        SystemSpec("per_request", f"per-request pool ({PER_REQUEST_WORKERS} workers)", False, PER_REQUEST_WORKERS),
        SystemSpec("batched", f"batched LLM ({batched_workers} workers, batch <= {max_batch_size})", True,
                   batched_workers, max_batch_size),
    ]


@dataclass
class ModelPlan:
    key: str  # full | tiny
    text: str
    nonstream: dict[int, int]  # concurrency -> requests
    stream: dict[int, int]
    cap_s: float  # per point: no new request starts after this many seconds
    warmup: int = 2
    notes: list[str] = field(default_factory=list)


def plan_for(model: str, quick: bool, concurrency: tuple[int, ...] = CONCURRENCY,
             stream_concurrency: tuple[int, ...] | None = None) -> ModelPlan:
    """Request counts per point. Full size: max(c, 2)..2c, sized to the ~30 min budget."""
    if model == "full":
        if quick:
            ns = {c: max(1, c) for c in concurrency}
            st = stream_concurrency or (1, 8)
            return ModelPlan("full", FULL_TEXT, ns, {c: max(1, c) for c in st if c in concurrency}, 120.0, 1)
        ns = {c: (2 * c if c <= 2 else c) for c in concurrency}
        st = stream_concurrency or (1, 4, 8)
        return ModelPlan("full", FULL_TEXT, ns, {c: (2 * c if c <= 2 else c) for c in st}, 300.0, 2)
    if model == "tiny":
        if quick:
            ns = {c: max(2, c) for c in concurrency}
            st = stream_concurrency or (1, 8)
            return ModelPlan("tiny", FULL_TEXT, ns, {c: max(2, c) for c in st}, 30.0, 2)
        ns = {c: max(8, 2 * c) for c in concurrency}
        st = stream_concurrency or concurrency
        return ModelPlan("tiny", FULL_TEXT, ns, {c: max(8, 2 * c) for c in st}, 90.0, 4)
    raise ValueError(f"unknown model {model!r} (expected full or tiny)")


def estimate_s(plan: ModelPlan, n_systems: int = 2, cores: int = 2) -> float:
    """A pessimistic wall estimate: every system at the per-request pool's cost, CPU-bound on ``cores``."""
    cost = CPU_S[plan.key]
    per_system = LOAD_S[plan.key] + plan.warmup * cost
    for counts, factor in ((plan.nonstream, 1.0), (plan.stream, STREAM_FACTOR)):
        for c, n in counts.items():
            per_system += n * cost * factor / min(c, cores, PARALLEL[plan.key])
    return n_systems * per_system


def describe(plan: ModelPlan) -> str:
    ns = ", ".join(f"c={c}: {n}" for c, n in plan.nonstream.items())
    st = ", ".join(f"c={c}: {n}" for c, n in plan.stream.items())
    return (f"{plan.key}: non-streaming {ns}; streaming {st}; warm-up {plan.warmup}; "
            f"cap {plan.cap_s:.0f} s per point; estimate {estimate_s(plan) / 60:.1f} min for both systems")
