"""LLM inputs of given lengths and a scheduler they join together: the batched prefill tests' shared runs.

Imports torch: import it after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import torch

from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.llm.sampling import SamplingRules
from app.engines.cosyvoice.llm.scheduler import LLMScheduler
from tests.support.prefill_stall import JoinGate, Recorder

MIXED = [5, 61, 23, 140, 9, 77, 31, 190, 12, 48, 103, 7, 66, 150, 3, 88]  # 16 lengths, 1 310 tokens in all
MAX_LEN = 24  # tokens per request in the decode tests (min 8)


def make_inputs(lm: BatchedLM, lengths: list[int], seed: int = 0) -> list:
    """LLM inputs of exactly these lengths: start marker, text, task marker, prompt speech."""
    gen = torch.Generator().manual_seed(seed)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    out = []
    with torch.inference_mode():
        for n in lengths:
            n_text = max(1, (n - 2) // 3)
            text = torch.randint(0, 3000, (1, n_text), generator=gen, dtype=torch.int32)
            speech = torch.randint(0, lm.spec.speech_token_size, (1, max(0, n - 2 - n_text)), generator=gen,
                                   dtype=torch.int32)
            out.append(lm.prefix(text, empty, speech)[0][:, :n])  # under 3 tokens: the head of a 3-token one
            assert out[-1].shape[1] == n
    return out


def scheduler(lm, greedy: bool, start: bool = True, **kw) -> tuple[LLMScheduler, Recorder, JoinGate]:
    """A scheduler with a ``Recorder`` observer and a ``JoinGate`` step probe; ``start=False``: queue first."""
    rec, gate = kw.pop("observer", None) or Recorder(), JoinGate()
    kw.setdefault("max_prefill_batch", None)  # batched prefill (the scheduler's default is one by one)
    sched = LLMScheduler(lm, max_batch_size=kw.pop("max_batch_size", 32),
                         rules=SamplingRules.from_llm(lm.llm, greedy=greedy), observer=rec, step_probe=gate, **kw)
    if start:
        sched.start()
    return sched, rec, gate


def submit(sched, x, i: int, max_len: int = MAX_LEN):
    """Request i: seeded with 100 + i; a long one (max_len > MAX_LEN) has end-of-speech masked throughout."""
    return sched.submit(x, 8 if max_len <= MAX_LEN else max_len, max_len, seed=100 + i)


def queued_together(lm, xs, greedy: bool, **kw) -> tuple[list[list[int]], Recorder, dict]:
    """Every input queued before the loop first looks, decoded: (tokens, the recorder, the stopped scheduler's stats)."""
    sched, rec, _ = scheduler(lm, greedy, start=False, **kw)
    try:
        seqs = [submit(sched, x, i) for i, x in enumerate(xs)]
        sched.start()
        got = finish(seqs)
    finally:
        sched.stop()
    return got, rec, sched.stats()


def finish(seqs) -> list[list[int]]:
    for seq in seqs:
        seq.wait_for(1 << 30, timeout=120)
        assert seq.error is None, seq.error
    return [list(s.tokens) for s in seqs]
