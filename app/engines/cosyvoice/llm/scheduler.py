"""The LLM scheduler: one thread owns a model's LLM and decodes every request in one batch.

Continuous (iteration-level) batching, in one process::

    slot thread (per request)                    scheduler thread (per model)
      submit(lm_input, limits) -> Sequence --->  prefill it, sample its first token
      for tokens in seq: token2wav ...   <-----  each step: ONE forward over all rows,
      seq.cancel() / cancel flag set     ----->  sample each row, hand out tokens,
                                                 drop finished/cancelled rows at once

A new sequence joins at the next step after its prefill; a finished, cancelled
or failed one leaves at once and its cache row is freed. At most
``max_batch_size`` sequences run; later ones wait (FIFO) for a row. The sequences
that join at one step (new ones, and bistream ones back with more text) are
prefilled together when ``max_prefill_batch`` allows (``engine.prefill_batch``, on for
CUDA), in as few forwards as ``max_prefill_tokens`` allows (``prefill.py``), so a burst
of arrivals stalls the running batch once; by default one forward each.

Sampling runs on the host: each step's log-probs ``[n, V]`` come off the device in
one copy (fp32), and every sequence samples from its row with its own CPU
generator (see ``sampling.py``), so a seeded request gets the same tokens on any
device, alone or in any batch. A failure while sampling one sequence ends that
sequence only. An out-of-memory error in a step takes the newest sequence out of
the batch (back to the head of the queue, its cache rebuilt when it rejoins) and
the step runs again with the others; the batch then grows back one sequence per
finished one. On CUDA the thread runs on its own stream (``device.StepIO``).

Consumers read a sequence's tokens with :meth:`Sequence.wait_for` (``sequence.py``),
which blocks until enough tokens are there or the sequence ended; it never busy-waits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from app.engines.cosyvoice.llm.bistream import BistreamFeed
from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.llm.prefill import (
    GroupPrefill,
    Joiner,
    arrival,
    out_of_memory,
)
from app.engines.cosyvoice.llm.sampling import Sampler, SamplingRules
from app.engines.cosyvoice.llm.sequence import Sequence
from app.engines.threads import lower_this_thread

log = logging.getLogger("cosyserve.engine.batch")

POLL_PARKED_S = 0.2  # while bistream sequences wait for text: how often to look for set cancel flags


class LLMObserver(Protocol):
    """Receives scheduler measurements (the metrics layer implements it).

    It may also have ``on_prefill(joiners, seconds)``, called after each prefill forward
    (how many sequences joined in it, its seconds with the log-prob download), and
    ``on_flow_cache_recompute()``, which the batched runner calls when a stream does not
    fit the flow cache budget (``flow_budget.py``).
    """

    def on_step(self, batch_size: int, seconds: float) -> None: ...

    def on_tokens(self, n: int) -> None: ...


class _NullObserver:
    def on_step(self, batch_size: int, seconds: float) -> None:
        pass

    def on_tokens(self, n: int) -> None:
        pass


class SchedulerClosed(RuntimeError):
    """The scheduler was stopped; no more sequences are decoded."""


class LLMScheduler:
    """Owns one BatchedLM; ``start()`` launches its thread, ``stop()`` ends it."""

    def __init__(self, lm: BatchedLM, max_batch_size: int = 16, rules: SamplingRules | None = None,
                 observer: LLMObserver | None = None, trace_logp: bool = False,
                 step_probe: Callable[[], Any] | None = None, max_prefill_tokens: int | None = None,
                 max_prefill_batch: int | None = 1) -> None:
        """``step_probe`` (measurement): a context manager factory entered around each decode step,
        in the scheduler thread (``bench/probes/syncs.py`` counts host syncs with it). ``max_prefill_tokens``:
        padded input tokens per prefill forward (None: ``prefill.MAX_PREFILL_TOKENS``); ``max_prefill_batch``:
        joiners per prefill forward (1, the default: one by one, what a CPU does best; None: as many as join,
        ``engine.prefill_batch`` on a GPU)."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.lm = lm
        self.io = lm.io
        self.max_batch_size = max_batch_size
        self.step_probe = step_probe
        self._cap = max_batch_size  # lowered after an out-of-memory step, regrown as sequences finish
        self.rules = rules or SamplingRules.from_llm(lm.llm)
        self.observer: LLMObserver = observer or _NullObserver()
        self.trace_logp = trace_logp
        self._kv = lm.new_cache()
        self._joins = GroupPrefill(lm, self._kv, max_tokens=max_prefill_tokens,
                                   max_batch=max_prefill_batch or max_batch_size,
                                   on_forward=getattr(self.observer, "on_prefill", None))
        self._rows: list[Sequence] = []  # _rows[r] decodes in cache row r
        self._pending: deque[Sequence] = deque()
        self._parked: list[Sequence] = []  # bistream sequences waiting for text, out of the batch
        self._joining: list[Sequence] = []  # being prefilled now
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # observable (tests, stats)
        self.steps = 0
        self.max_batch_seen = 0
        self.oom_preemptions = 0  # sequences sent back to the queue by an out-of-memory step

    # -- public ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("scheduler already started")
        self._thread = threading.Thread(target=self._run, name="cosyserve-llm", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The scheduler thread runs (False before start and after stop or a crash)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, lm_input: Any, min_len: int, max_len: int, *, seed: int | None = None,
               cancel: threading.Event | None = None, request_id: str = "", ready: Any = None,
               sampler: Sampler | None = None) -> Sequence:
        """Queue one sequence. ``ready``: a CUDA event recorded after ``lm_input`` was made on the
        caller's stream (``device.ready_event``); ``sampler``: its own sampler (default: the rules, ``seed``)."""
        seq = Sequence(lm_input=lm_input, min_len=min_len, max_len=max_len,
                       sampler=sampler or Sampler(self.rules, self.lm.spec.eos_token, seed=seed),
                       cancel_flag=cancel, request_id=request_id, ready=ready,
                       logp_trace=[] if self.trace_logp else None)
        with self._cond:
            if self._stopping:
                raise SchedulerClosed("the LLM scheduler is stopped")
            self._pending.append(seq)
            self._cond.notify_all()
        return seq

    def submit_bistream(self, feed: BistreamFeed, *, seed: int | None = None,
                        cancel: threading.Event | None = None, request_id: str = "") -> Sequence:
        """A sequence fed text over time (``feed``); it joins the batch whenever it has input."""
        seq = Sequence(lm_input=None, min_len=0, max_len=1 << 30,
                       sampler=Sampler(self.rules, self.lm.spec.eos_token, seed=seed),
                       cancel_flag=cancel, request_id=request_id, feed=feed)
        seq.notify = self._wake
        feed.bind(self._wake)
        with self._cond:
            if self._stopping:
                raise SchedulerClosed("the LLM scheduler is stopped")
            self._parked.append(seq)
            self._cond.notify_all()
        return seq

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict:
        with self._cond:
            pending = len(self._pending)
            parked = len(self._parked)
        rows, positions = self._kv.capacity
        return {"running": len(self._rows), "pending": pending, "waiting_for_text": parked, "steps": self.steps,
                "max_batch_seen": self.max_batch_seen, "kv_rows": rows, "kv_positions": positions,
                "kv_bytes": self._kv.nbytes(), "oom_preemptions": self.oom_preemptions,
                "prefill_forwards": self._joins.forwards, "prefill_max_joiners": self._joins.largest,
                "prefill_splits": self._joins.splits}

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        lower_this_thread()  # below the event loop (app/engines/threads.py)
        try:
            with self.io.context(), torch.inference_mode():
                while True:
                    joining = self._next_arrivals()
                    if joining is None:
                        break
                    self._drop_stopped()
                    joiners = [j for j in (arrival(self.lm, seq) for seq in joining) if j is not None]
                    joiners += self._returning(self.max_batch_size - len(self._rows) - len(joiners))
                    if joiners:
                        self._joining = [j.seq for j in joiners]  # failed too, should the loop crash meanwhile
                        self._joins.run(joiners, self._admit, self._join_failed)
                        self._joining = []
                        self._drop_stopped()
                    if self._rows:
                        self._step()
        except BaseException as exc:  # a bug in the loop: fail everyone rather than hang them
            log.exception("LLM scheduler crashed")
            with torch.inference_mode():  # the cache tensors are inference tensors
                self._fail_all(exc)
        finally:
            with torch.inference_mode():
                self._fail_all(SchedulerClosed("the LLM scheduler is stopped"))

    def _next_arrivals(self) -> list[Sequence] | None:
        """Sequences to admit now (waits while idle); None when stopping."""
        with self._cond:
            while not self._stopping and not self._rows and not self._pending and not self._parked_due():
                self._cond.wait(POLL_PARKED_S if self._parked else None)
            if self._stopping:
                return None
            room = min(self.max_batch_size, self._cap) - len(self._rows)
            joining = []
            while self._pending and len(joining) < room:
                joining.append(self._pending.popleft())
            return joining

    def _admit(self, group: list[Joiner], rows: list[int], logp: Any) -> None:
        """A prefill forward worked: its sequences take their rows, then each samples its next token."""
        for j, row in zip(group, rows):
            j.seq.saved = None
            j.seq.row = row
            self._rows.append(j.seq)
        for i, j in enumerate(group):
            if j.sample:
                self._accept(j.seq, logp[i])

    def _join_failed(self, joiner: Joiner, exc: BaseException | None) -> None:
        seq = joiner.seq
        seq.saved = None
        if exc is not None:
            log.error("LLM prefill failed (request %s): %r", seq.request_id, exc)
        seq.finish(exc)

    def _parked_due(self) -> bool:
        return any(s.feed.dirty or s.should_stop for s in self._parked)

    def _returning(self, room: int) -> list[Joiner]:
        """Bistream sequences with new text (or at its end), as joiners after their saved cache, room permitting."""
        out: list[Joiner] = []
        for seq in list(self._parked):
            if len(out) >= room:
                break
            if not seq.feed.dirty or seq.should_stop:
                continue
            parts = seq.feed.next_input()
            if parts is None:
                continue
            with self._cond:
                self._parked.remove(seq)
            try:
                out.append(Joiner(seq, self.lm.embed(parts), past=seq.saved))
            except Exception as exc:  # noqa: BLE001 - fails this sequence only, as a bad arrival does
                log.error("LLM bistream input failed (request %s): %r", seq.request_id, exc)
                seq.saved = None
                seq.finish(exc)
        return out

    def _park(self, seq: Sequence) -> None:
        """Take a bistream sequence out of the batch until its next text arrives (its cache kept)."""
        seq.saved = self._kv.snapshot(seq.row)
        self._remove_row(seq)
        seq.feed.dirty = True  # text may already be waiting (or have ended): look again at the next turn
        with self._cond:
            self._parked.append(seq)

    def _step(self) -> None:
        t0 = time.perf_counter()
        n = len(self._rows)
        rows = list(self._rows)
        probe = self.step_probe() if self.step_probe is not None else contextlib.nullcontext()
        with probe:
            try:
                logp = self.io.download(self.lm.decode(self._kv, [seq.tokens[-1] for seq in rows]))
            except Exception as exc:
                if out_of_memory(exc) and self._preempt_newest(exc):
                    return
                log.exception("batched LLM step failed with %d sequences", n)
                for seq in rows:
                    self._leave(seq, exc)
                return
            for seq, row_logp in zip(rows, logp):
                self._accept(seq, row_logp)
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, n)
        self.observer.on_step(n, time.perf_counter() - t0)

    def _preempt_newest(self, exc: BaseException) -> bool:
        """After an out-of-memory step: take the newest sequence out of the batch (False: nothing to keep).

        It goes back to the head of the queue (its cache is rebuilt from its input and
        tokens when it rejoins); one that cannot be rebuilt (bistream) fails. The batch
        may then grow again one sequence per finished one.
        """
        if len(self._rows) < 2:
            return False  # alone: it fails (nothing else to make room for)
        victim = max(self._rows, key=lambda s: s.started)
        self._remove_row(victim)
        self.io.release_cache()
        self._cap = max(1, len(self._rows))
        if victim.feed is not None or victim.lm_input is None:
            log.warning("LLM step out of memory with %d sequences: request %s fails (its cache cannot be rebuilt)",
                        len(self._rows) + 1, victim.request_id)
            victim.finish(exc)
            return True
        self.oom_preemptions += 1
        log.warning("LLM step out of memory with %d sequences: request %s waits for room (batch capped at %d)",
                    len(self._rows) + 1, victim.request_id, self._cap)
        with self._cond:
            self._pending.appendleft(victim)
        return True

    def _accept(self, seq: Sequence, logp: Any) -> None:
        """Sample ``seq``'s next token from ``logp`` (a host row); hand it out, or end the sequence.

        Any failure here (its sampler, its token rules) ends this sequence only.
        """
        try:
            self._sample(seq, logp)
        except Exception as exc:  # noqa: BLE001 - one request's failure, never the scheduler's
            log.error("sampling failed (request %s): %r", seq.request_id, exc)
            with self._cond:
                if seq in self._parked:  # a bistream sequence that failed right after sitting out
                    self._parked.remove(seq)
            if not seq.done:
                self._leave(seq, exc)

    def _sample(self, seq: Sequence, logp: Any) -> None:
        step = len(seq.tokens)
        if seq.feed is not None:
            self._accept_bistream(seq, logp)
            return
        if seq.logp_trace is not None:
            seq.logp_trace.append(logp.detach().clone())
        token = seq.sampler.sample(logp, seq.tokens, ignore_eos=step < seq.min_len)
        if token in self.lm.spec.stop_tokens:
            self._leave(seq)
            return
        seq.push(token)
        self.observer.on_tokens(1)
        if len(seq.tokens) >= seq.max_len:
            self._leave(seq)

    def _accept_bistream(self, seq: Sequence, logp: Any) -> None:
        feed = seq.feed
        token = feed.decide(logp, seq.sampler.sample, len(seq.tokens))
        if not feed.final and token == feed.fill:
            self._park(seq)
            return
        if token in self.lm.spec.stop_tokens or token >= self.lm.spec.speech_token_size:
            self._leave(seq)
            return
        seq.push(token)
        self.observer.on_tokens(1)
        if feed.final and len(seq.tokens) >= feed.max_len:
            self._leave(seq)

    def _drop_stopped(self) -> None:
        for seq in [s for s in self._rows if s.should_stop]:
            self._leave(seq)
        with self._cond:
            gone = [s for s in self._parked if s.should_stop]
            for seq in gone:
                self._parked.remove(seq)
        for seq in gone:
            seq.saved = None
            seq.finish()

    def _leave(self, seq: Sequence, error: BaseException | None = None) -> None:
        """Remove ``seq`` from the batch now and free its cache row."""
        self._remove_row(seq)
        seq.lm_input = None
        seq.finish(error)
        if self._cap < self.max_batch_size:
            self._cap += 1  # after an out-of-memory step: grow back one finished sequence at a time

    def _remove_row(self, seq: Sequence) -> None:
        if seq.row is not None:
            row = seq.row
            moved = self._kv.remove_row(row)
            last = self._rows.pop()
            if moved is not None:
                self._rows[row] = last
                last.row = row
            seq.row = None

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            self._stopping = True
            pending = list(self._pending) + list(self._parked)
            self._pending.clear()
            self._parked.clear()
        for seq in list(self._rows) + pending + self._joining:
            if not seq.done:
                self._leave(seq, error)  # frees its row, if it has one
        self._rows.clear()
        self._kv.clear()

