"""EnginePool: the lifecycle of preloaded engine slots, running requests on them, and stats.

Life of a request::

    ticket = pool.gate.admit_now()       # non-blocking permit, or Overloaded/Draining/NotReady
    job = await pool.run(ticket, req)    # takes the ticket; FIFO wait for a slot (or QueueTimeout),
                                         # then engine.synthesize() in the slot's own thread
    async with job:                      # aclose(): cancel flag, wait for the thread
        first, rest = await job.first_chunk()
        async for chunk in rest: ...

The parts: ``gate.py`` (admission for both traffic classes), ``slots.py`` (idle slots, FIFO
hand-off, a self-returning ``Lease``), ``job.py`` (one running request) and ``bridge.py`` (slot
thread -> event loop). This module loads and warms the engines in their slot threads, runs requests
on them, drains and closes. With a shared (batched) engine bulk requests run in slot threads of
their own, so a running bulk request never holds a thread an interactive one needs; the engine,
when it can, lets them compute only in the room interactive work leaves (``set_bulk_room``).

Capacity is ``workers + max_queue`` permits. A slot is reused only after its
thread has returned from the engine generator, and the permit is released then
too: a client still reading its stream holds buffered bytes (``stream_budget``),
not a permit.
Everything here runs on one event loop; only engine calls run in slot threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.engines.base import Engine, EngineInfo, SynthesisRequest
from app.engines.threads import lower_this_thread
from app.serving.admission import PermitError, Ticket
from app.serving.admission.classes import Priority
from app.serving.admission.gate import Gate
from app.serving.buffers import StreamBudget
from app.serving.config import PoolConfig
from app.serving.errors import Draining, HealthCheckTimeout, NotReady, QueueTimeout
from app.serving.job import Job
from app.serving.observer import NullObserver, PoolObserver, SafeObserver
from app.serving.slots import Slot, Slots
from app.text.stream import TextStream

__all__ = ["EnginePool", "Job", "NullObserver", "PoolConfig", "PoolObserver", "Ticket"]

log = logging.getLogger(__name__)

THREAD_PREFIX = "cosyserve-slot-"
BULK_THREAD_PREFIX = "cosyserve-bulk-"  # a shared engine's slot threads for bulk requests

# Wraps an engine generator inside the slot thread: (chunks, cancel flag) -> items.
Transform = Callable[[Iterator[Any], threading.Event], Iterator[Any]]


@dataclass(frozen=True)
class Loaded:
    """What a slot thread hands back from loading: the engine and what it can do, read there once."""

    engine: Engine
    info: EngineInfo
    presets: tuple[str, ...]


def _name_thread(name: str) -> None:
    threading.current_thread().name = name
    lower_this_thread()  # a slot runs synthesis: below the event loop (app/engines/threads.py)


class EnginePool:
    """Preloaded engine slots, each with its own single-thread executor."""

    def __init__(
        self,
        engine_factory: Callable[[int], Engine],
        config: PoolConfig,
        observer: PoolObserver | None = None,
    ) -> None:
        self.config = config
        self._factory = engine_factory
        self._observer = SafeObserver(observer if observer is not None else NullObserver())
        self.stream_budget = StreamBudget(config.stream_buffer_total_bytes)  # all streams' unread audio
        self.gate = Gate(config, self._observer, refill=lambda: self._slots.refill())
        admission = self._admission = self.gate.admission
        # lease no more slots than the limit (fixed: capacity) and one per long job in a lane; the rest wait FIFO
        self._slots = Slots(cap=lambda: admission.slot_cap)
        self._completed = dict.fromkeys(Priority, 0)  # jobs that ended ok, per class (throughput)
        self._slot_list: list[Slot] = []
        self._bulk_slots = Slots()  # shared engine: bulk requests' own slot threads (bulk_room bounds them)
        self._bulk_slot_list: list[Slot] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loaded: Loaded | None = None  # slot 0's engine, info and presets, once every slot is loaded
        self._jobs: set[Job] = set()  # started jobs whose slot thread has not returned
        self._started = False
        self._draining = False
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        self._slots_shut = False
        self._stuck_total = 0

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Build, load and warm up every slot's engine in that slot's thread, all in parallel."""
        if self._started:
            raise RuntimeError("EnginePool.start() may be called only once")
        self._started = True
        loop = self._loop = asyncio.get_running_loop()
        for i in range(self.config.workers):
            name = f"{THREAD_PREFIX}{i}"
            executor = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=_name_thread, initargs=(name,))
            self._slot_list.append(Slot(i, executor))
        loading = self._slot_list[:1] if self.config.share_engine else self._slot_list
        futs = [loop.run_in_executor(slot.executor, self._load_engine, slot.index) for slot in loading]
        cancelled: asyncio.CancelledError | None = None
        try:
            await asyncio.wait(futs)
        except asyncio.CancelledError as exc:  # a load cannot be interrupted: let it end, then clean up
            cancelled = exc
            await asyncio.wait(futs)
        errors: list[BaseException] = []
        for slot, fut in zip(loading, futs):
            exc = fut.exception()
            if exc is None:
                slot.engine = fut.result().engine
            else:
                slot.state = "failed"
                errors.append(exc)
                log.error("engine slot %d failed to load: %r", slot.index, exc)
        if errors or cancelled is not None:
            self.gate.failed()
            await self._shutdown_slots()
            raise cancelled if cancelled is not None else errors[0]
        first = self._slot_list[0]
        for slot in self._slot_list:
            slot.engine = first.engine if self.config.share_engine else slot.engine
            self._slots.add_idle(slot)
        if self.config.share_engine:  # bulk gets threads of its own (started at its first job) on the engine
            for i in range(self.config.workers):
                name = f"{BULK_THREAD_PREFIX}{i}"
                executor = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=_name_thread, initargs=(name,))
                slot = Slot(self.config.workers + i, executor, engine=first.engine)
                self._bulk_slot_list.append(slot)
                self._bulk_slots.add_idle(slot)
        self._loaded = futs[0].result()
        if not self._draining:
            self.gate.open()

    def _load_engine(self, index: int) -> Loaded:
        """In the slot's thread: build, load, warm up, then read what the engine can do (once).

        Nothing engine-side runs on the event loop afterwards: ``info`` and ``presets``
        are these values.
        """
        engine = self._factory(index)
        engine.load()
        engine.warmup()
        set_bulk_room = getattr(engine, "set_bulk_room", None)
        if callable(set_bulk_room):  # the engine can make bulk work yield to interactive work
            set_bulk_room(self.gate.bulk_room)
        return Loaded(engine, engine.info(), tuple(engine.voices()))

    async def begin_drain(self) -> None:
        """Stop admitting (ready -> False at once); queued and running work continues, except the
        bulk requests still waiting for room: they get 503 draining at once."""
        self._draining = True
        self.gate.close()

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once no admitted request is queued, running or still being consumed."""
        start = time.monotonic()
        if not await self._admission.wait_idle(timeout):
            return False
        if self.gate.bulk_account.in_flight == 0:
            return True
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        try:
            async with asyncio.timeout(left):
                await self.gate.bulk_account.wait_idle()
        except TimeoutError:
            pass
        return self.gate.idle()

    async def close(self) -> None:
        """Cancel what still runs, wait for slot threads, close engines, join executors."""
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        self._closed = self._draining = True
        if self._loop is None:
            return
        self._close_done = self._loop.create_future()
        try:
            shutdown = Draining("the server is shutting down")
            self.gate.close()
            self._slots.close(shutdown)
            self._bulk_slots.close(shutdown)
            for job in list(self._jobs):
                job.abort(shutdown)
            pending = [job.thread_returned for job in self._jobs]
            if pending:
                _, late = await asyncio.wait(pending, timeout=self.config.close_timeout_s)
                if late:
                    log.error("%d slot thread(s) did not return within %g s", len(late), self.config.close_timeout_s)
            for job in list(self._jobs):
                job.settle()
            await self._shutdown_slots()
        finally:
            self._close_done.set_result(None)

    async def _shutdown_slots(self) -> None:
        """engine.close() in each slot's thread (once for a shared engine), then join the threads."""
        assert self._loop is not None
        if self._slots_shut:
            return
        self._slots_shut = True
        self._slots.close(Draining("the engine pool is closed"))
        self._bulk_slots.close(Draining("the engine pool is closed"))
        closing: list[asyncio.Future[None]] = []
        hung = {job.slot_index for job in self._jobs if not job.done}
        for slot in self._slot_list:
            first_owner = not self.config.share_engine or slot.index == 0
            if slot.engine is not None and first_owner and slot.index not in hung:
                closing.append(self._loop.run_in_executor(slot.executor, slot.engine.close))
        if closing:
            for result in await asyncio.gather(*closing, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.error("engine close failed: %r", result)
        for slot in (*self._slot_list, *self._bulk_slot_list):  # a bulk slot shares slot 0's engine
            if slot.index in hung:
                slot.executor.shutdown(wait=False, cancel_futures=True)
            else:
                slot.executor.shutdown(wait=True)
            if slot.state != "failed":
                slot.state = "closed"

    # -- properties and info -----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._loaded is not None and not self._draining and not self._closed

    @property
    def draining(self) -> bool:
        return self._draining or self._closed

    @property
    def capacity(self) -> int:
        return self._admission.capacity

    @property
    def info(self) -> EngineInfo:
        """What the engine can do, read once in a slot thread at load; NotReady before."""
        return self._require_loaded().info

    @property
    def presets(self) -> tuple[str, ...]:
        """The engine's preset speakers, read once in a slot thread at load; NotReady before."""
        return self._require_loaded().presets

    def _require_loaded(self) -> Loaded:
        if self._loaded is None:
            raise NotReady("the engine is not loaded")
        return self._loaded

    async def check_health(self) -> None:
        """Run engine.health_check() in an idle slot's thread; skipped when no slot is free.

        Bounded by ``health_timeout_s`` (then ``HealthCheckTimeout``); the slot comes
        back only when its thread has returned from the check.
        """
        if self._closed:
            raise Draining("the engine pool is closed")
        self._require_loaded()
        lease = self._slots.try_acquire()
        if lease is None:
            return
        engine = lease.slot.engine
        assert engine is not None
        fut = self._require_loop().run_in_executor(lease.slot.executor, engine.health_check)

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved here too, in case the caller was cancelled
            lease.release()

        fut.add_done_callback(done)
        try:
            async with asyncio.timeout(self.config.health_timeout_s):
                await asyncio.shield(fut)
        except TimeoutError:
            log.error("engine health check did not return within %g s (slot %d)", self.config.health_timeout_s,
                      lease.slot.index)
            raise HealthCheckTimeout(f"the engine health check did not return within "
                                     f"{self.config.health_timeout_s:g} s") from None

    def _deadline_s(self, bulk: bool) -> float:
        """``request_timeout_s``; a bulk job's adds its class timeout (``bulk_queue_timeout_s``): the engine
        holds a started bulk request back while interactive work fills the room, and that time is a wait,
        not a slow or wedged engine (so neither a 504 nor a stuck slot)."""
        base = self.config.request_timeout_s
        return base + self.config.bulk_queue_timeout_s if bulk and base > 0 else base

    def stuck_slots(self) -> list[int]:
        """Slots whose job has been in the engine past ``request_timeout_s + stuck_grace_s``.

        Such a job's deadline has fired and its cancel flag is set, yet its thread has not
        returned: the engine is wedged, and only a restart frees the slot. Each job is
        logged once when first found. Empty when ``request_timeout_s`` is 0 (no deadline).
        """
        if self.config.request_timeout_s <= 0:
            return []
        now = time.monotonic()
        stuck = []
        for job in self._jobs:
            if not job.done and now - job.started_at > job.deadline_s + self.config.stuck_grace_s:
                stuck.append(job.slot_index)
                if not job.stuck_reported:
                    job.stuck_reported = True
                    self._stuck_total += 1
                    log.error("slot %d is stuck in the engine: job %s has run %.0f s (deadline %g s + grace %g s)",
                              job.slot_index, job.request_id, now - job.started_at,
                              job.deadline_s, self.config.stuck_grace_s)
        return sorted(stuck)

    # -- running --------------------------------------------------------------------------------
    async def run(self, ticket: Ticket, req: SynthesisRequest, transform: Transform | None = None) -> Job:
        """Take ``ticket``, wait FIFO for a free slot, start engine.synthesize(req, cancel) in its thread.

        ``transform(chunks, cancel)``, when given, wraps the engine generator in the same
        thread (e.g. encoding PCM to bytes); the job then yields what it yields. The queue
        wait (and ``queue_timeout_s``) counts from this call, not from ``admit()``: a permit
        taken at the edge before the request body arrived does not charge the upload time
        to the queue. If no job starts (queue timeout, cancelled, shut down), the permit
        goes back before this raises.
        """
        if transform is None:
            return await self._submit(ticket, lambda engine, cancel: engine.synthesize(req, cancel), req.request_id,
                                      req.text_stream)
        return await self._submit(ticket, lambda engine, cancel: transform(engine.synthesize(req, cancel), cancel),
                                  req.request_id, req.text_stream)

    async def call(self, fn: Callable[[Engine], Any], request_id: str = "") -> Any:
        """Run ``fn(engine)`` once in a slot's thread, under the same admission, queue and deadline.

        For engine work that is not a stream (e.g. computing a voice's prompt features).
        """

        def one(engine: Engine, cancel: Any) -> Iterator[Any]:
            yield fn(engine)

        ticket = self.gate.admit_now()
        ticket.exclude()  # not synthesis: its latency says nothing about the speech capacity
        async with await self._submit(ticket, one, request_id) as job:
            result, _ = await job.first_chunk()
            return result

    async def _submit(self, ticket: Ticket, open_gen: Callable[[Engine, Any], Iterator[Any]], request_id: str,
                      text: TextStream | None = None) -> Job:
        if not self.gate.issued(ticket):
            raise PermitError("run() needs a ticket from this pool's gate")
        bulk = self.gate.is_bulk(ticket)
        ticket = ticket.take()  # ours now: the caller's handle is empty, whatever happens here
        try:
            if self._closed:
                raise Draining("the engine pool is closed", self.gate.retry_after_s())
            asked_at = time.monotonic()
            try:
                if bulk and self._bulk_slot_list:
                    lease = await self._bulk_slots.acquire(self.config.queue_timeout_s)
                else:
                    lease = await self._slots.acquire(self.config.queue_timeout_s, bulk=bulk)
            except TimeoutError:
                self._admission.reject("queue_timeout")
                raise QueueTimeout(f"no worker became free within {self.config.queue_timeout_s:g} s",
                                   self.gate.retry_after_s()) from None
            wait = time.monotonic() - asked_at
            ticket.started()
            self._observer.on_queue_wait(wait)
            if bulk:  # its wait: from joining the bulk queue to a slot
                since = asked_at if ticket.enqueued_at is None else ticket.enqueued_at
                self._observer.on_class_wait(Priority.BULK.value, self._admission.clock() - since)
            else:
                self._observer.on_class_wait(Priority.INTERACTIVE.value, wait)
            engine = lease.slot.engine
            assert engine is not None
            try:
                job = Job(ticket, lease, lambda cancel: open_gen(engine, cancel),
                          request_id=request_id or uuid.uuid4().hex, queue_wait_s=wait,
                          buffer_chunks=self.config.stream_buffer_chunks,
                          buffer_bytes=self.config.stream_buffer_bytes, budget=self.stream_budget,
                          deadline_s=self._deadline_s(bulk), text=text, on_thread_done=self._job_ended)
            except BaseException:
                lease.release()
                raise
        except BaseException:
            ticket.release()  # no job started: the permit goes back now
            raise
        self._jobs.add(job)
        self._observer.on_job_start()
        return job

    def _job_ended(self, job: Job) -> None:
        """The job's slot thread returned: count it (its lease goes back next)."""
        self._jobs.discard(job)
        slots = self._slot_list if job.slot_index < len(self._slot_list) else self._bulk_slot_list
        slots[job.slot_index % len(self._slot_list)].jobs_done += 1
        seconds = (job.service_s or 0.0) - job.paused_s  # a long job's pauses were yields, not service
        self._admission.lane_paused_s += job.paused_s
        bulk = self.gate.is_bulk(job.ticket)
        if job.outcome in ("ok", "error") and not bulk:  # bulk work yields: its times say nothing of a wait
            self._admission.observe_service(seconds)
        if job.outcome == "ok":
            self._completed[Priority.BULK if bulk else Priority.INTERACTIVE] += 1
            self._admission.observe_latency(job.ticket, job.busy_s)  # the queue wait is the waiting room's
        self._observer.on_job_end(job.outcome, seconds)

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise NotReady("the engine pool has not been started")
        return self._loop

    # -- stats --------------------------------------------------------------------------------------
    def stats(self) -> dict:
        a = self._admission
        return {
            "workers": self.config.workers,
            "slots": [{"index": s.index, "state": s.state, "jobs_done": s.jobs_done} for s in self._slot_list],
            "running": len(self._jobs),
            "queued": a.queued,
            "in_flight": a.in_flight,
            "capacity": a.capacity,
            "admitted": a.admitted,
            "rejected": dict(a.rejected),
            "ticket_misuses": a.misuses + self.gate.bulk_account.misuses,
            "avg_service_s": a.average_service_s,
            "admission": a.snapshot(),
            "classes": self.gate.class_stats(self._completed),
            "stream_buffers": self.stream_budget.snapshot(),
            "stuck": len(self.stuck_slots()),
            "stuck_total": self._stuck_total,
            "ready": self.ready,
            "draining": self.draining,
        }
