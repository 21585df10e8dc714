"""Batched prefill when something goes wrong: it fails one joiner at most, never the others.

* a joiner cancelled before its prefill (while the loop is held, or while an earlier
  forward of the same step runs) ends without tokens and is never prefilled;
* a joiner whose input is malformed, whose forward fails, or whose first sampling fails
  ends with that error; the others join and decode exactly as alone;
* an out-of-memory error in a batched prefill forward splits it in halves and retries
  (every joiner gets its tokens); one that does not fit even alone fails by itself.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.support.prefill_stall import Recorder

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.llm.sampling import Sampler  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from tests.support.llm_batches import (  # noqa: E402
    MIXED,
    make_inputs,
    queued_together,
    scheduler,
    submit,
)

COUNT = 8


@pytest.fixture(scope="module")
def lm(tiny_models):
    return BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)


@pytest.fixture(scope="module")
def want(lm):
    """The 8 inputs and their tokens, all joining in one forward with nothing going wrong (greedy)."""
    xs = make_inputs(lm, MIXED[:COUNT], seed=4)
    tokens, rec, _ = queued_together(lm, xs, greedy=True)
    assert [n for _, n, _ in rec.prefills] == [COUNT]
    return xs, tokens


def run(lm, xs, *, sampler_for=None, cancel=(), **kw):
    """All of ``xs`` queued before the loop starts; returns the sequences (done), the recorder, the stats."""
    sched, rec, _ = scheduler(lm, greedy=True, start=False, **kw)
    seqs = []
    try:
        for i, x in enumerate(xs):
            sampler = sampler_for(i, sched) if sampler_for else None
            seqs.append(sched.submit(x, 8, 24, seed=100 + i, sampler=sampler))  # as tests' submit(), or its sampler
        for i in cancel:
            seqs[i].cancel()
        sched.start()
        for seq in seqs:
            with contextlib.suppress(Exception):  # a failed one re-raises its error: checked by the caller
                seq.wait_for(1 << 30, timeout=120)
            assert seq.done
    finally:
        sched.stop()
    return seqs, rec, sched.stats()


def assert_others_as_alone(seqs, want_tokens, but: set[int]) -> None:
    for i, (seq, tokens) in enumerate(zip(seqs, want_tokens)):
        if i not in but:
            assert seq.error is None and seq.tokens == tokens, i


def test_a_joiner_cancelled_before_its_prefill_ends_without_tokens_and_is_never_prefilled(lm, want):
    xs, tokens = want
    seqs, rec, stats = run(lm, xs, cancel=(2,))
    assert seqs[2].done and seqs[2].tokens == [] and seqs[2].error is None
    assert_others_as_alone(seqs, tokens, but={2})
    assert [n for _, n, _ in rec.prefills] == [COUNT - 1] and stats["kv_bytes"] == 0


class CancelAfterFirstForward(Recorder):
    victim = None

    def on_prefill(self, joiners: int, seconds: float) -> None:
        if not self.prefills:
            self.victim.cancel()
        super().on_prefill(joiners, seconds)


def test_a_joiner_cancelled_while_an_earlier_forward_of_its_step_runs_is_not_prefilled(lm, want):
    """A 200-token cap puts the 8 inputs (5..190 tokens) in several forwards; the first one's observer
    callback (in the scheduler thread, after that forward) cancels a joiner of a later one."""
    xs, tokens = want
    rec = CancelAfterFirstForward()
    sched, _, _ = scheduler(lm, greedy=True, start=False, max_prefill_tokens=200, observer=rec)
    seqs = [submit(sched, x, i) for i, x in enumerate(xs)]
    victim = min(range(COUNT), key=lambda i: xs[i].shape[1])  # the shortest: in the last forward
    rec.victim = seqs[victim]
    try:
        sched.start()
        for seq in seqs:
            seq.wait_for(1 << 30, timeout=120)
    finally:
        sched.stop()
    assert len(rec.prefills) > 1
    assert seqs[victim].tokens == [] and seqs[victim].error is None
    assert sum(n for _, n, _ in rec.prefills) == COUNT - 1
    assert_others_as_alone(seqs, tokens, but={victim})


def test_a_malformed_input_fails_that_joiner_only(lm, want):
    xs, tokens = want
    bad = list(xs)
    bad[3] = torch.zeros(1, 12, lm.hidden + 4)  # wrong width: refused before any forward
    seqs, rec, _ = run(lm, bad)
    assert isinstance(seqs[3].error, ValueError) and seqs[3].tokens == []
    assert_others_as_alone(seqs, tokens, but={3})
    assert [n for _, n, _ in rec.prefills] == [COUNT - 1]


class FailFor:
    """``lm.prefill_many`` that raises ``error`` for any forward holding ``victim``'s input (or more than ``limit``)."""

    def __init__(self, lm, victim=None, error=None, limit: int | None = None) -> None:
        self.real, self.victim, self.error, self.limit = lm.prefill_many, victim, error, limit
        self.raised = 0

    def __call__(self, kv, items):
        if any(x is self.victim for x, _ in items) or (self.limit is not None and len(items) > self.limit):
            self.raised += 1
            raise self.error
        return self.real(kv, items)


@pytest.mark.parametrize("error", [RuntimeError("a planted failure"), torch.OutOfMemoryError("CUDA out of memory")],
                         ids=["error", "oom"])
def test_a_forward_failing_for_one_input_is_split_until_that_joiner_fails_alone(lm, want, error):
    xs, tokens = want
    lm.prefill_many = FailFor(lm, victim=xs[5], error=error)
    try:
        seqs, rec, stats = run(lm, xs)
    finally:
        del lm.prefill_many
    assert seqs[5].error is error and seqs[5].tokens == []
    assert_others_as_alone(seqs, tokens, but={5})
    assert sum(n for _, n, _ in rec.prefills) == COUNT - 1
    assert stats["prefill_splits"] == 3  # 8 -> 4 -> 2 -> 1: one failing forward per level
    assert stats["kv_bytes"] == 0


def test_an_out_of_memory_batched_prefill_is_retried_in_halves_and_everyone_gets_its_tokens(lm, want):
    xs, tokens = want
    lm.prefill_many = injector = FailFor(lm, error=torch.OutOfMemoryError("CUDA out of memory (planted)"), limit=2)
    try:
        seqs, rec, stats = run(lm, xs)
    finally:
        del lm.prefill_many
    assert [s.tokens for s in seqs] == tokens and all(s.error is None for s in seqs)
    assert [n for _, n, _ in rec.prefills] == [2, 2, 2, 2]
    assert injector.raised == 3 and stats["prefill_splits"] == 3  # 8, then both halves of 4


class BadSampler(Sampler):
    def sample(self, logp, decoded, ignore_eos):
        raise RuntimeError("a planted sampling failure")


def test_a_joiner_whose_first_sampling_fails_fails_alone(lm, want):
    xs, tokens = want

    def sampler_for(i, sched):
        return BadSampler(sched.rules, lm.spec.eos_token, seed=0) if i == 1 else None

    seqs, rec, stats = run(lm, xs, sampler_for=sampler_for)
    assert isinstance(seqs[1].error, RuntimeError) and seqs[1].tokens == []
    assert_others_as_alone(seqs, tokens, but={1})
    assert [n for _, n, _ in rec.prefills] == [COUNT] and stats["kv_bytes"] == 0
