"""One thread owns the flow: the ready hops of every request run in batched rounds.

With ``engine.token2wav_batch`` on, each request's ``token2wav`` still runs in its slot
thread (CosyVoice's own code: the hop schedule, HiFT and its per-request cache), but its
``flow.inference`` call becomes a :class:`FlowJob` handed to :class:`FlowScheduler`, and
the slot thread waits for its mel. The scheduler thread, like the LLM scheduler for the
LLM, repeatedly takes the jobs that are waiting and runs them as one round of
:class:`~app.engines.cosyvoice.flow.batch.BatchedFlow`:

* **order**: interactive jobs before bulk ones (bulk fills the places interactive work
  leaves in a round); within a class first hops first (time to first audio), then by the
  request's start (older streams finish first); a job left out of a round moves to the
  front of its class after ``MAX_SKIPS`` rounds, so nothing starves while its class has room;
* **size**: at most ``max_batch`` jobs. A call longer than those of its kind already in
  the round (streaming or not: they run as separate passes) would pad them all: it joins
  only within ``MAX_LENGTH_RATIO`` of the shortest, so a 100-frame first hop does not wait
  for a 2,000-frame final call (which runs next round). A shorter call joins: it pads
  only itself, and would otherwise wait for this round anyway. Overdue jobs always join,
  except a bulk one that would pad interactive calls of its kind (it waits for a round
  without them);
* **cancellation**: a cancelled request's job leaves the queue at once, or its rows leave
  the running round at the next ODE step; its waiter returns at once;
* **failure**: when a round raises, each of its jobs runs again alone, so only the
  request whose call fails gets the error. A crash of the loop itself fails every waiter
  and ``alive`` turns false (the engine's health check reports it).

Measurements go to a ``FlowObserver`` (``tts_token2wav_batch_size``, round seconds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engines.cosyvoice.flow.batch import BatchedFlow, FlowItem
from app.engines.threads import lower_this_thread

log = logging.getLogger("cosyserve.engine")

MAX_SKIPS = 2  # rounds a job may be left out of before it goes first
MAX_LENGTH_RATIO = 2.0  # longest / shortest call of one kind in a round
POLL_S = 0.05  # how often a waiting slot thread re-checks its cancel flag


class FlowObserver(Protocol):
    def on_flow_round(self, batch_size: int, seconds: float) -> None: ...


class _NullObserver:
    def on_flow_round(self, batch_size: int, seconds: float) -> None:
        pass


class FlowCancelled(Exception):
    """The request was cancelled while its flow call waited or ran (raised in its slot thread)."""


class FlowStopped(RuntimeError):
    """The flow scheduler is not running (stopped, or its thread crashed)."""


@dataclass(eq=False)
class FlowJob:
    item: FlowItem
    frames: int  # estimator frames (its cost in a round)
    first: bool  # the request's first hop
    started: float  # when the request's token2wav started (older first)
    cancel: threading.Event
    request_id: str = ""
    bulk: bool = False  # traffic class bulk: only the places interactive jobs leave in a round
    submitted: float = field(default_factory=time.monotonic)
    skipped: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    mel: Any = None
    error: BaseException | None = None

    @property
    def overdue(self) -> bool:
        return self.skipped >= MAX_SKIPS

    def finish(self, mel: Any = None, error: BaseException | None = None) -> None:
        self.mel, self.error = mel, error
        self.done.set()


def pick_round(pending: list[FlowJob], max_batch: int) -> list[FlowJob]:
    """The jobs of the next round, in priority order (see the module docstring)."""
    order = sorted(pending, key=lambda j: (j.bulk, not (j.first or j.overdue), j.started, j.submitted))
    chosen: list[FlowJob] = []
    groups: dict[bool, tuple[int, int]] = {}  # streaming -> (shortest, longest) frames so far
    interactive: set[bool] = set()  # the kinds (streaming or not) with interactive jobs in the round
    for job in order:
        if len(chosen) >= max_batch:
            break
        shortest, longest = groups.get(job.item.streaming, (job.frames, job.frames))
        # a call no longer than the group's longest only pads itself (and would wait for this round anyway);
        # a longer one pads everyone: it joins only within MAX_LENGTH_RATIO of the shortest
        forced = job.overdue and not (job.bulk and job.item.streaming in interactive)
        if job.frames > longest and not forced and job.frames > MAX_LENGTH_RATIO * max(1, shortest):
            continue
        if not job.bulk:
            interactive.add(job.item.streaming)
        groups[job.item.streaming] = (min(shortest, job.frames), max(longest, job.frames))
        chosen.append(job)
    return chosen


class FlowScheduler:
    def __init__(self, flow: BatchedFlow, *, max_batch: int = 16, observer: FlowObserver | None = None,
                 autocast: Any = None) -> None:
        self.flow = flow
        self.max_batch = max(1, int(max_batch))
        self.observer: FlowObserver = observer or _NullObserver()
        self._autocast = autocast  # a context manager factory for the rounds (CUDA fp16), or None
        self._cv = threading.Condition()
        self._pending: list[FlowJob] = []
        self._running: list[FlowJob] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.crashed: BaseException | None = None
        self._stats = {"rounds": 0, "jobs": 0, "max_batch_seen": 0, "cancelled": 0, "failed": 0, "isolated": 0}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cosyserve-flow", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stats(self) -> dict:
        with self._cv:
            return dict(self._stats, pending=len(self._pending), running=len(self._running))

    # -- the slot threads' side ---------------------------------------------------------------
    def submit(self, item: FlowItem, *, first: bool, started: float, cancel: threading.Event,
               request_id: str = "", bulk: bool = False) -> FlowJob:
        job = FlowJob(item=item, frames=self.flow.frames(item), first=first, started=started, cancel=cancel,
                      request_id=request_id, bulk=bulk)
        with self._cv:
            if self._stopping:  # (jobs may queue before start(): the first round takes them all)
                raise FlowStopped("the flow scheduler is not running")
            self._pending.append(job)
            self._cv.notify_all()
        return job

    def run(self, item: FlowItem, *, first: bool, started: float, cancel: threading.Event,
            request_id: str = "", bulk: bool = False) -> Any:
        """``item``'s mel, once a round has made it (raises FlowCancelled if ``cancel`` is set first)."""
        job = self.submit(item, first=first, started=started, cancel=cancel, request_id=request_id, bulk=bulk)
        while not job.done.wait(POLL_S):
            if cancel.is_set():
                self._withdraw(job)
                raise FlowCancelled()
            if self._stopping and not job.done.is_set():
                raise FlowStopped("the flow scheduler stopped")
        if job.error is not None:
            raise job.error
        if job.mel is None:
            raise FlowCancelled()
        return job.mel

    def _withdraw(self, job: FlowJob) -> None:
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
                self._stats["cancelled"] += 1
        # a running job's rows leave its round at the next ODE step (its cancel flag is set)

    # -- the scheduler thread -----------------------------------------------------------------
    def _loop(self) -> None:
        lower_this_thread()  # below the event loop (app/engines/threads.py)
        try:
            while True:
                with self._cv:
                    while not self._pending and not self._stopping:
                        self._cv.wait()
                    if self._stopping:
                        break
                    self._drop_cancelled()
                    jobs = pick_round(self._pending, self.max_batch)
                    chosen = set(map(id, jobs))
                    rest = [j for j in self._pending if id(j) not in chosen]
                    for job in rest:
                        job.skipped += 1
                    self._pending, self._running = rest, jobs
                if jobs:
                    self._round(jobs)
                with self._cv:
                    self._running = []
        except BaseException as exc:  # noqa: BLE001 - a bug in the loop: fail everyone rather than hang them
            log.exception("the flow scheduler crashed")
            self.crashed = exc
            with self._cv:
                self._stopping = True
                for job in self._pending + self._running:
                    if not job.done.is_set():
                        job.finish(error=FlowStopped("the flow scheduler crashed"))
                self._pending, self._running = [], []
            return
        with self._cv:
            for job in self._pending:
                job.finish(error=FlowStopped("the flow scheduler stopped"))
            self._pending = []

    def _drop_cancelled(self) -> None:
        live = []
        for job in self._pending:
            if job.cancel.is_set():
                job.finish()
                self._stats["cancelled"] += 1
            else:
                live.append(job)
        self._pending = live

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        import torch

        with torch.inference_mode(), (self._autocast() if self._autocast is not None else contextlib.nullcontext()):
            yield

    def _round(self, jobs: list[FlowJob]) -> None:
        t0 = time.perf_counter()
        try:
            with self._context():
                mels = self.flow([j.item for j in jobs], alive=lambda i: not jobs[i].cancel.is_set())
        except Exception as exc:  # noqa: BLE001 - isolate: each job alone, so only the failing one fails
            if len(jobs) == 1:
                self._fail(jobs[0], exc)
            else:
                log.warning("a batched flow round of %d failed (%s); running its calls one by one",
                            len(jobs), type(exc).__name__)
                for job in jobs:
                    self._alone(job)
        else:
            for job, mel in zip(jobs, mels):
                job.finish(mel=mel)
        seconds = time.perf_counter() - t0
        with self._cv:
            self._stats["rounds"] += 1
            self._stats["jobs"] += len(jobs)
            self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(jobs))
            self._stats["cancelled"] += sum(1 for j in jobs if j.mel is None and j.error is None)
        try:
            self.observer.on_flow_round(len(jobs), seconds)
        except Exception:  # noqa: BLE001 - metrics must not break synthesis
            log.exception("flow observer failed")

    def _alone(self, job: FlowJob) -> None:
        with self._cv:
            self._stats["isolated"] += 1
        try:
            with self._context():
                (mel,) = self.flow([job.item], alive=lambda _i: not job.cancel.is_set())
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            self._fail(job, exc)
        else:
            job.finish(mel=mel)

    def _fail(self, job: FlowJob, exc: BaseException) -> None:
        with self._cv:
            self._stats["failed"] += 1
        log.warning("flow call failed for request %s: %s: %s", job.request_id or "-", type(exc).__name__, exc)
        job.finish(error=exc)


# -- binding a request's flow calls to the scheduler ------------------------------------------------

@dataclass(frozen=True)
class FlowCall:
    """What the scheduler needs to know about the calling request's next flow call."""

    first: bool
    started: float
    cancel: threading.Event
    request_id: str = ""
    prompt: Any = None  # flow_prefix.PromptRef: the voice's cached prompt state for streamed calls
    bulk: bool = False  # traffic class bulk: after interactive calls in a round


_local = threading.local()


def current_call() -> FlowCall | None:
    return getattr(_local, "call", None)


@contextlib.contextmanager
def bound_call(call: FlowCall | None) -> Iterator[None]:
    previous = current_call()
    _local.call = call
    try:
        yield
    finally:
        _local.call = previous


def install(flow: Any, scheduler: FlowScheduler) -> None:
    """Route ``flow.inference`` calls made under :func:`bound_call` to ``scheduler`` (others run as before).

    Installing again on the same flow (a new runner over the same model) re-targets the route.
    """
    route = getattr(flow.inference, "_cosyserve_flow_rounds", None)
    if route is not None:
        route[0] = scheduler
        return
    original = flow.inference
    route = [scheduler]

    def inference(*args: Any, **kw: Any) -> Any:
        call = current_call()
        if call is None or args:
            return original(*args, **kw)
        mel = route[0].run(FlowItem.from_kwargs(**kw, prompt=call.prompt), first=call.first, started=call.started,
                           cancel=call.cancel, request_id=call.request_id, bulk=call.bulk)
        return mel, None

    inference.__wrapped__ = original  # type: ignore[attr-defined]
    inference._cosyserve_flow_rounds = route  # type: ignore[attr-defined]
    flow.inference = inference
