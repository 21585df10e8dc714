"""Batched prefill: the sequences that join the batch at one step are prefilled together.

Between two decode steps the scheduler takes every sequence that may join now: new
requests, ones sent back by an out-of-memory step (their cache rebuilt from their input
and tokens) and bistream sequences back with more text (their saved cache restored, the
new input after it). :class:`GroupPrefill` runs them in as few forwards as their sizes
allow (``BatchedLM.prefill_many``): longest input first, a forward holds joiners while
``joiners x longest input <= max_tokens`` (one longer input runs alone) and at most
``max_batch`` of them. So 16 arrivals stall the running batch for one forward instead
of 16, and a forward's memory stays bounded: its MLPs see only the real tokens, but its
attention is per joiner, padded to the longest input (scores ~ joiners x longest x keys),
so one huge prompt runs alone rather than padding everyone else's.

Each forward's log-probs come off the device in ONE copy and every joiner samples its
first token on the host, as in a decode step. A forward that fails is split in halves and
retried (an out-of-memory error first hands the allocator's cached blocks back): the
joiner that cannot be prefilled even alone fails, the others join. Nothing here decides
who joins or samples: the scheduler passes the joiners in and gets each group back
through ``admit`` (rows, host log-probs) or each failed joiner through ``fail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.llm.kv import BatchedKV, SavedRow
from app.engines.cosyvoice.llm.sequence import Sequence

log = logging.getLogger("cosyserve.engine.batch")

MAX_PREFILL_TOKENS = 4096  # padded input tokens per prefill forward (joiners x longest input)


@dataclass(eq=False)
class Joiner:
    """One sequence about to join: its input, the cache it follows (bistream) and whether it samples now."""

    seq: Sequence
    lm_input: Any  # [1, T, D] on the LLM's device
    past: SavedRow | None = None
    sample: bool = True  # False: back from an out-of-memory step, its next token is already known

    @property
    def length(self) -> int:
        return int(self.lm_input.shape[1])


def plan(joiners: list[Joiner], max_tokens: int, max_batch: int) -> list[list[Joiner]]:
    """Joiners in forwards: longest first, each forward's padded tokens within ``max_tokens``."""
    groups: list[list[Joiner]] = []
    for j in sorted(joiners, key=lambda j: -j.length):  # stable: arrival order among equal lengths
        group = groups[-1] if groups else None
        if group and len(group) < max_batch and (len(group) + 1) * group[0].length <= max_tokens:
            group.append(j)
        else:
            groups.append([j])
    return groups


def arrival(lm: BatchedLM, seq: Sequence) -> Joiner | None:
    """A queued sequence as a joiner; None when it ended here (cancelled, or an input that cannot run)."""
    if seq.should_stop:
        seq.finish()
        return None
    seq.started = time.perf_counter()
    resumed = bool(seq.tokens)  # back from an out-of-memory step: rebuild its cache, its next token is known
    try:
        lm.io.adopt(seq.lm_input, seq.ready)
        seq.ready = None
        lm_input = lm.resume_input(seq.lm_input, seq.tokens) if resumed else seq.lm_input
        lm.check_input(lm_input)
    except Exception as exc:
        log.error("LLM prefill failed (request %s): %r", seq.request_id, exc)
        seq.finish(exc)
        return None
    return Joiner(seq, lm_input, sample=not resumed)


def out_of_memory(exc: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom)


class GroupPrefill:
    """Runs joiners' prefills in few forwards over one LM and cache (the scheduler thread only)."""

    def __init__(self, lm: BatchedLM, kv: BatchedKV, *, max_tokens: int | None = None,
                 max_batch: int = 1 << 30, on_forward: Callable[[int, float], None] | None = None) -> None:
        """``kv``: the scheduler's cache; ``max_tokens``: padded tokens per forward (None: ``MAX_PREFILL_TOKENS``);
        ``on_forward(joiners, seconds)``: after each forward that worked."""
        max_tokens = MAX_PREFILL_TOKENS if max_tokens is None else max_tokens
        if max_tokens < 1 or max_batch < 1:
            raise ValueError("max_tokens and max_batch must be at least 1")
        self.lm = lm
        self.kv = kv
        self.max_tokens = max_tokens
        self.max_batch = max_batch
        self.on_forward = on_forward
        # observable (stats, tests)
        self.forwards = 0
        self.splits = 0  # forwards that failed with more than one joiner and were retried in halves
        self.largest = 0  # most joiners in one forward so far

    def run(self, joiners: list[Joiner], admit: Callable[[list[Joiner], list[int], Any], None],
            fail: Callable[[Joiner, BaseException | None], None]) -> None:
        """Prefill ``joiners``; each group that worked goes to ``admit(group, rows, host_logp)``
        (``host_logp`` [n, V] on the host, or None when no joiner of the group samples), before
        the next forward runs; each joiner that failed alone goes to ``fail(joiner, error)``, and
        one cancelled before its forward to ``fail(joiner, None)``."""
        for group in plan(joiners, self.max_tokens, self.max_batch):
            self._forward(group, admit, fail)

    def _forward(self, group: list[Joiner], admit: Callable[[list[Joiner], list[int], Any], None],
                 fail: Callable[[Joiner, BaseException | None], None]) -> None:
        for j in [j for j in group if j.seq.should_stop]:  # cancelled while an earlier group ran
            group.remove(j)
            fail(j, None)
        if not group:
            return
        t0 = time.perf_counter()
        try:
            rows, logp = self.lm.prefill_many(self.kv, [(j.lm_input, j.past) for j in group])
            host = self.lm.io.download(logp) if any(j.sample for j in group) else None
        except Exception as exc:
            if len(group) == 1:
                fail(group[0], exc)
                return
            self.splits += 1
            oom = out_of_memory(exc)
            if oom:
                self.lm.io.release_cache()
            log.warning("LLM prefill of %d joiners failed (%s): retrying them in two halves",
                        len(group), "out of memory" if oom else repr(exc))
            half = len(group) // 2
            self._forward(group[:half], admit, fail)
            self._forward(group[half:], admit, fail)
            return
        self.forwards += 1
        self.largest = max(self.largest, len(group))
        if self.on_forward is not None:
            self.on_forward(len(group), time.perf_counter() - t0)
        admit(group, rows, host)
