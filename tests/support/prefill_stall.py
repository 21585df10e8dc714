"""How long the running batch stalls when many requests join at once: one-by-one vs batched prefill.

    python -m tests.support.prefill_stall --model-dir DIR [--joiners 8 16] [--running 4] [--rounds 3]
                                   [--prompt 100:300] [--threads 1] [--device cpu]

In-process, on the LLM scheduler alone (no HTTP, no token2wav). Each round starts
``--running`` sequences, holds one decode step (:class:`JoinGate`, a step probe) while
``--joiners`` requests are submitted, lets it go, and reads the scheduler's own step
timestamps: the gap between the running sequences' token before the join and their next
one (every joiner's prefill plus one step of the grown batch), against the usual gap
before the join. The inputs are random LLM inputs (text and prompt speech tokens) of
``--prompt`` lengths, the same in both modes; sampling is seeded, so each joiner's first
tokens must match between the modes (checked). ``bench.gpu_check`` runs :func:`compare`
as its prefill phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

JOIN_SEED = 1000  # joiner i samples with seed JOIN_SEED + i in every mode


class JoinGate:
    """A scheduler step probe: once armed, the next decode step waits (in the scheduler thread) until ``go``.

    While it waits the scheduler takes nothing from its queue, so everything submitted
    meanwhile joins at the same step.
    """

    def __init__(self) -> None:
        self.armed = False
        self.held = threading.Event()
        self.go = threading.Event()

    def arm(self) -> None:
        self.held.clear()
        self.go.clear()
        self.armed = True

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.armed:
            self.armed = False
            self.held.set()
            if not self.go.wait(120):
                raise TimeoutError("JoinGate was never released")
        yield


class Recorder:
    """The scheduler's observer: when each step ended, its batch and seconds; each prefill forward."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int, float]] = []  # (end, batch, seconds)
        self.prefills: list[tuple[float, int, float]] = []  # (end, joiners, seconds)
        self._cond = threading.Condition()

    def on_step(self, batch_size: int, seconds: float) -> None:
        with self._cond:
            self.steps.append((time.perf_counter(), batch_size, seconds))
            self._cond.notify_all()

    def on_tokens(self, n: int) -> None:
        pass

    def on_prefill(self, joiners: int, seconds: float) -> None:
        self.prefills.append((time.perf_counter(), joiners, seconds))

    def wait_steps(self, count: int, timeout: float = 300) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.steps) >= count, timeout):
                raise TimeoutError(f"the scheduler made {len(self.steps)} steps, not {count}")


def random_inputs(lm: Any, count: int, prompt: tuple[int, int], seed: int = 0) -> list[Any]:
    """``count`` LLM inputs ``[1, T, D]``: 1/4 text tokens, 3/4 prompt speech tokens, T spread over ``prompt``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lo, hi = prompt
    out = []
    with torch.inference_mode():
        for i in range(count):
            total = lo + (hi - lo) * i // max(1, count - 1)
            n_text = max(1, total // 4)
            text = torch.randint(0, 3000, (1, n_text), generator=gen, dtype=torch.int32)
            speech = torch.randint(0, lm.spec.speech_token_size, (1, max(0, total - n_text - 2)), generator=gen,
                                   dtype=torch.int32)
            x, _, _ = lm.prefix(text, torch.zeros(1, 0, dtype=torch.int32), speech)
            out.append(x)
    return out


def one_round(lm: Any, running: list[Any], joiners: list[Any], one_by_one: bool) -> dict:
    """One join of ``joiners`` into a batch of ``running``: the running sequences' token gaps around it."""
    from app.engines.cosyvoice.llm.sampling import SamplingRules
    from app.engines.cosyvoice.llm.scheduler import LLMScheduler

    rec, gate = Recorder(), JoinGate()
    sched = LLMScheduler(lm, max_batch_size=len(running) + len(joiners), rules=SamplingRules.from_llm(lm.llm),
                         observer=rec, step_probe=gate, max_prefill_batch=1 if one_by_one else None)
    sched.start()
    seqs = []
    try:
        never = 1 << 20  # end-of-speech masked: they run until cancelled
        seqs = [sched.submit(x, never, never, seed=i) for i, x in enumerate(running)]
        for seq in seqs:
            seq.wait_for(4, timeout=300)
        gate.arm()
        if not gate.held.wait(120):
            raise TimeoutError("no decode step came")
        mark = len(rec.steps)  # the held step records at this index
        joined = [sched.submit(x, never, never, seed=JOIN_SEED + i) for i, x in enumerate(joiners)]
        seqs += joined
        gate.go.set()
        rec.wait_steps(mark + 3)
        firsts = [list(s.tokens[:2]) for s in joined]
    finally:
        for seq in seqs:
            seq.cancel()
        sched.stop()
    held, join = rec.steps[mark], rec.steps[mark + 1]
    before = [b[0] - a[0] for a, b in zip(rec.steps[1:mark], rec.steps[2:mark])]
    prefills = [p for p in rec.prefills if held[0] < p[0] <= join[0]]
    return {"gap_s": join[0] - held[0], "usual_gap_s": statistics.median(before) if before else None,
            "prefill_s": sum(p[2] for p in prefills), "prefill_forwards": len(prefills),
            "join_step_s": join[2], "batch_before": held[1], "batch_after": join[1], "first_tokens": firsts}


def compare(lm: Any, joiners: int = 16, running: int = 4, rounds: int = 3, prompt: tuple[int, int] = (100, 300),
            seed: int = 0) -> dict:
    """The stall at ``joiners`` arrivals, one-by-one vs batched prefill (medians over ``rounds``)."""
    inputs = random_inputs(lm, running + joiners, prompt, seed)
    run_in, join_in = inputs[:running], inputs[running:]
    out: dict[str, Any] = {"joiners": joiners, "running": running, "rounds": rounds, "prompt_tokens": list(prompt),
                           "input_tokens": sum(int(x.shape[1]) for x in join_in)}
    firsts = {}
    for mode in ("one_by_one", "batched"):
        results = [one_round(lm, run_in, join_in, one_by_one=mode == "one_by_one") for _ in range(rounds)]
        firsts[mode] = results[0]["first_tokens"]
        out[mode] = {
            "gap_ms": 1000 * statistics.median(r["gap_s"] for r in results),
            "usual_gap_ms": 1000 * statistics.median(r["usual_gap_s"] for r in results if r["usual_gap_s"]),
            "prefill_ms": 1000 * statistics.median(r["prefill_s"] for r in results),
            "join_step_ms": 1000 * statistics.median(r["join_step_s"] for r in results),
            "prefill_forwards": max(r["prefill_forwards"] for r in results),
            "all_joined_at_once": all(r["batch_after"] == running + joiners and r["batch_before"] == running
                                      for r in results),
        }
    out["first_tokens_equal"] = firsts["one_by_one"] == firsts["batched"]
    out["speedup"] = out["one_by_one"]["prefill_ms"] / out["batched"]["prefill_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="a CosyVoice2/3 model dir (tiny or full-size)")
    ap.add_argument("--joiners", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--running", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", default="100:300", help="LLM input lengths of the joiners, lo:hi tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    import torch

    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.load import load_model_dir

    torch.set_num_threads(args.threads)
    lm = BatchedLM(load_model_dir(args.model_dir, device=args.device).model.llm)
    lo, hi = (int(v) for v in args.prompt.split(":"))
    for n in args.joiners:
        print(json.dumps(compare(lm, n, args.running, args.rounds, (lo, hi)) | {"threads": args.threads}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
