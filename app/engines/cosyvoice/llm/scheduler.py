"""The LLM scheduler: one thread owns a model's LLM and decodes every request in one batch.

Continuous (iteration-level) batching, in one process::

    slot thread (per request)                    scheduler thread (per model)
      submit(lm_input, limits) -> Sequence --->  prefill it, sample its first token
      for tokens in seq: token2wav ...   <-----  each step: ONE forward over all rows,
      seq.cancel() / cancel flag set     ----->  sample each row, hand out tokens,
                                                 drop finished/cancelled rows at once

A sequence joins at the next step after its prefill (joiners of one step prefilled together,
``prefill.py``) and leaves at once when finished, cancelled or failed, freeing its cache row; at
most ``max_batch_size`` run, later ones wait FIFO. Sampling runs on the host, each sequence with
its own generator (``sampling.py``, ``decide.py``). An out-of-memory step sends the newest
sequence back to the queue and runs again. Bulk sequences step only in the room the pool leaves
(``bulk.py``). The whole design, its numbers and its tests: docs/batching.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from app.engines.cosyvoice.llm.bistream import BistreamFeed
from app.engines.cosyvoice.llm.bulk import (
    POLL_BULK_S,
    BulkRoom,
    Room,
    bulk_left,
    plan_step,
)
from app.engines.cosyvoice.llm.decide import LEAVE, PARK, next_token
from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.llm.observer import LLMObserver, NullObserver
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

STOP = object()  # _wait_for_work: the scheduler is stopping
POLL_PARKED_S = 0.2  # while bistream sequences wait for text: how often to look for set cancel flags


class SchedulerClosed(RuntimeError):
    """The scheduler was stopped; no more sequences are decoded."""


class LLMScheduler:
    """Owns one BatchedLM; ``start()`` launches its thread, ``stop()`` ends it."""

    def __init__(self, lm: BatchedLM, max_batch_size: int = 16, rules: SamplingRules | None = None,
                 observer: LLMObserver | None = None, trace_logp: bool = False,
                 step_probe: Callable[[], Any] | None = None, max_prefill_tokens: int | None = None,
                 max_prefill_batch: int | None = 1) -> None:
        """``step_probe`` (measurement): a context manager factory entered around each decode step,
        in the scheduler thread (``tests/support/syncs.py`` counts host syncs with it). ``max_prefill_tokens``:
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
        self.observer: LLMObserver = observer or NullObserver()
        self.trace_logp = trace_logp
        self._kv = lm.new_cache()
        self._joins = GroupPrefill(lm, self._kv, max_tokens=max_prefill_tokens,
                                   max_batch=max_prefill_batch or max_batch_size,
                                   on_forward=getattr(self.observer, "on_prefill", None))
        self._rows: list[Sequence] = []  # _rows[r] decodes in cache row r
        self._pending: deque[Sequence] = deque()
        self._bulk_pending: deque[Sequence] = deque()  # bulk sequences waiting for room, oldest first
        self._room = BulkRoom()
        self._parked: list[Sequence] = []  # bistream sequences waiting for text, out of the batch
        self._joining: list[Sequence] = []  # being prefilled now
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # observable (tests, stats)
        self.steps = 0
        self.max_batch_seen = 0
        self.oom_preemptions = 0  # sequences sent back to the queue by an out-of-memory step
        self.bulk_evictions = 0  # bulk rows sent back to their queue to make room for interactive ones

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

    def set_bulk_room(self, fn: Room | None) -> None:
        """``fn()``: how many bulk sequences may step now (read before each step, from this thread:
        it must be cheap and thread-safe); None: bulk is not limited (every row steps, as without classes)."""
        self._room = BulkRoom(fn)
        self._wake()

    def submit(self, lm_input: Any, min_len: int, max_len: int, *, seed: int | None = None,
               cancel: threading.Event | None = None, request_id: str = "", ready: Any = None,
               sampler: Sampler | None = None, bulk: bool = False, since: float | None = None) -> Sequence:
        """Queue one sequence. ``ready``: a CUDA event recorded after ``lm_input`` was made on the
        caller's stream (``device.ready_event``); ``sampler``: its own sampler (default: the rules, ``seed``);
        ``bulk``: its class (``bulk.py``); ``since``: its request's start (``time.monotonic()``; default now)."""
        seq = Sequence(lm_input=lm_input, min_len=min_len, max_len=max_len,
                       sampler=sampler or Sampler(self.rules, self.lm.spec.eos_token, seed=seed),
                       cancel_flag=cancel, request_id=request_id, ready=ready,
                       logp_trace=[] if self.trace_logp else None, bulk=bulk)
        if since is not None:
            seq.since = since
        with self._cond:
            if self._stopping:
                raise SchedulerClosed("the LLM scheduler is stopped")
            (self._bulk_pending if bulk else self._pending).append(seq)
            self._cond.notify_all()
        return seq

    def submit_bistream(self, feed: BistreamFeed, *, seed: int | None = None,
                        cancel: threading.Event | None = None, request_id: str = "", bulk: bool = False,
                        since: float | None = None) -> Sequence:
        """A sequence fed text over time (``feed``); it joins the batch whenever it has input (bulk: and room)."""
        seq = Sequence(lm_input=None, min_len=0, max_len=1 << 30,
                       sampler=Sampler(self.rules, self.lm.spec.eos_token, seed=seed),
                       cancel_flag=cancel, request_id=request_id, feed=feed, bulk=bulk)
        if since is not None:
            seq.since = since
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
            bulk_pending = len(self._bulk_pending)
            parked = len(self._parked)
        rows, positions = self._kv.capacity
        return {"running": len(self._rows), "pending": pending, "waiting_for_text": parked, "steps": self.steps,
                "bulk_running": sum(1 for s in list(self._rows) if s.bulk), "bulk_pending": bulk_pending,
                "bulk_evictions": self.bulk_evictions,
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
                    room = self._wait_for_work()
                    if room is STOP:
                        break
                    self._drop_stopped()
                    joining = self._arrivals(room)
                    joiners = [j for j in (arrival(self.lm, seq) for seq in joining) if j is not None]
                    joiners += self._returning(self.max_batch_size - len(self._rows) - len(joiners),
                                               bulk_left(self._rows, room) - sum(j.seq.bulk for j in joiners))
                    if joiners:
                        self._joining = [j.seq for j in joiners]  # failed too, should the loop crash meanwhile
                        self._joins.run(joiners, self._admit, self._join_failed)
                        self._joining = []
                        self._drop_stopped()
                    if self._rows:
                        self._step(self._room.read())
        except BaseException as exc:  # a bug in the loop: fail everyone rather than hang them
            log.exception("LLM scheduler crashed")
            with torch.inference_mode():  # the cache tensors are inference tensors
                self._fail_all(exc)
        finally:
            with torch.inference_mode():
                self._fail_all(SchedulerClosed("the LLM scheduler is stopped"))

    def _wait_for_work(self) -> int | None | object:
        """Wait while there is nothing to step, admit or drop; then the bulk room read now (``STOP`` when stopping).

        While only bulk work waits for room the room is read again every ``POLL_BULK_S``
        (the pool does not signal it); a cancelled waiting bulk sequence counts as work (to drop)."""
        while True:
            room = self._room.read()  # outside the lock: the pool's function may take its own
            with self._cond:
                if self._stopping:
                    return STOP
                if self._has_work(room):
                    return room
                if self._rows or self._bulk_pending or any(s.bulk and s.feed.dirty for s in self._parked):
                    self._cond.wait(POLL_BULK_S)
                else:
                    self._cond.wait(POLL_PARKED_S if self._parked else None)

    def _has_work(self, room: int | None) -> bool:
        left = bulk_left(self._rows, room)
        admits = len(self._rows) < min(self.max_batch_size, self._cap) or any(self._evictable())
        return bool((self._pending and admits) or self._parked_due(left, admits)
                    or (self._bulk_pending and left > 0)
                    or any(not s.bulk or room != 0 or s.should_stop for s in self._rows)
                    or any(s.should_stop for s in self._bulk_pending))

    def _arrivals(self, room: int | None) -> list[Sequence]:
        """Queued sequences to prefill now: interactive ones (bulk rows make room), then bulk ones that would step."""
        free = min(self.max_batch_size, self._cap) - len(self._rows)
        with self._cond:
            wanted = len(self._pending) + sum(1 for s in self._parked if not s.bulk and s.feed.dirty)
        if wanted > free:
            free += self._evict_bulk(wanted - free)
        joining: list[Sequence] = []
        with self._cond:
            while self._pending and len(joining) < free:
                joining.append(self._pending.popleft())
            left = min(free - len(joining), bulk_left(self._rows, room))
            while self._bulk_pending and left > 0:
                joining.append(self._bulk_pending.popleft())
                left -= 1
        return joining

    def _evict_bulk(self, count: int) -> int:
        """Send up to ``count`` bulk rows, newest first, back to the head of the bulk queue; how many went.

        Their caches are rebuilt from input and tokens when they rejoin (same tokens); a bistream
        row cannot be rebuilt and stays (it leaves at its next fill)."""
        victims = sorted(self._evictable(), key=lambda s: s.since, reverse=True)[:count]
        for seq in victims:
            self._remove_row(seq)
        with self._cond:
            for seq in victims:  # newest first: the oldest ends at the head
                self._bulk_pending.appendleft(seq)
        self.bulk_evictions += len(victims)
        return len(victims)

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

    def _evictable(self) -> Iterator[Sequence]:
        return (s for s in self._rows if s.bulk and s.feed is None and s.lm_input is not None)

    def _parked_due(self, bulk_room: float = float("inf"), admits: bool = True) -> bool:
        """A waiting bistream sequence to drop, or one with new text that may rejoin now."""
        return any(s.should_stop or (admits and s.feed.dirty and (not s.bulk or bulk_room > 0)) for s in self._parked)

    def _returning(self, room: int, bulk_room: float = float("inf")) -> list[Joiner]:
        """Bistream sequences with new text (or at its end), as joiners after their saved cache, room permitting
        (interactive ones first; bulk ones within ``bulk_room``)."""
        out: list[Joiner] = []
        for seq in sorted(self._parked, key=lambda s: s.bulk):
            if len(out) >= room:
                break
            if not seq.feed.dirty or seq.should_stop or (seq.bulk and bulk_room <= 0):
                continue
            parts = seq.feed.next_input()
            if parts is None:
                continue
            with self._cond:
                self._parked.remove(seq)
            bulk_room -= seq.bulk
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

    def _step(self, room: int | None = None) -> None:
        """One decode step of every interactive row and the bulk rows ``room`` allows (``bulk.plan_step``)."""
        n, swaps = plan_step(self._rows, room)
        if n == 0:
            return  # only bulk rows, and no room: they keep their rows and wait
        for a, b in swaps:
            self._swap_rows(a, b)
        t0 = time.perf_counter()
        rows = self._rows[:n]
        tokens = [seq.tokens[-1] for seq in rows]
        probe = self.step_probe() if self.step_probe is not None else contextlib.nullcontext()
        with probe:
            try:
                out = self.lm.decode(self._kv, tokens) if n == len(self._rows) else self.lm.decode(self._kv, tokens, n)
                logp = self.io.download(out)
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

    def _swap_rows(self, a: int, b: int) -> None:
        self._kv.swap_rows(a, b)
        rows = self._rows
        rows[a], rows[b] = rows[b], rows[a]
        rows[a].row, rows[b].row = a, b

    def _preempt_newest(self, exc: BaseException) -> bool:
        """After an out-of-memory step: take the newest sequence out of the batch (False: nothing to keep).

        It goes back to the head of the queue (its cache is rebuilt from its input and
        tokens when it rejoins); one that cannot be rebuilt (bistream) fails. The batch
        may then grow again one sequence per finished one.
        """
        if len(self._rows) < 2:
            return False  # alone: it fails (nothing else to make room for)
        victim = max(self._rows, key=lambda s: (s.bulk, s.started))  # a bulk row first
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
            (self._bulk_pending if victim.bulk else self._pending).appendleft(victim)
        return True

    def _accept(self, seq: Sequence, logp: Any) -> None:
        """Sample ``seq``'s next token from ``logp`` (a host row); hand it out, park or end the sequence.
        Any failure here (its sampler, its token rules) ends this sequence only."""
        try:
            token, then = next_token(seq, logp, self.lm.spec)
            if then == PARK:
                self._park(seq)
                return
            if token is not None:
                seq.push(token)
                self.observer.on_tokens(1)
            if then == LEAVE:
                self._leave(seq)
        except Exception as exc:  # noqa: BLE001 - one request's failure, never the scheduler's
            log.error("sampling failed (request %s): %r", seq.request_id, exc)
            with self._cond:
                if seq in self._parked:  # a bistream sequence that failed right after sitting out
                    self._parked.remove(seq)
            if not seq.done:
                self._leave(seq, exc)

    def _drop_stopped(self) -> None:
        for seq in [s for s in self._rows if s.should_stop]:
            self._leave(seq)
        with self._cond:
            gone = [s for s in self._parked if s.should_stop]
            for seq in gone:
                self._parked.remove(seq)
            waiting = [s for s in self._bulk_pending if s.should_stop]  # bulk may wait long for room
            for seq in waiting:
                self._bulk_pending.remove(seq)
        for seq in gone:
            seq.saved = None
            seq.finish()
        for seq in waiting:
            seq.lm_input = None
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
            pending = list(self._pending) + list(self._bulk_pending) + list(self._parked)
            self._pending.clear()
            self._bulk_pending.clear()
            self._parked.clear()
        for seq in list(self._rows) + pending + self._joining:
            if not seq.done:
                self._leave(seq, error)  # frees its row, if it has one
        self._rows.clear()
        self._kv.clear()

