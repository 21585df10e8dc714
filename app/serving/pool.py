"""EnginePool: preloaded engine slots, admission, FIFO leases, jobs, drain and close.

Life of a request::

    ticket = pool.admit()              # non-blocking permit, or Overloaded/Draining/NotReady
    lease = await pool.acquire(ticket) # FIFO wait for a free slot, or QueueTimeout
    job = pool.run(lease, req)         # engine.synthesize() in the slot's own thread
    async with job:                    # aclose(): cancel flag, wait for the thread, release
        first, rest = await job.first_chunk()
        async for chunk in rest: ...

Capacity is ``workers + max_queue`` permits. A slot is reused only after its
thread has returned from the engine generator; the permit is released once the
thread has returned and the consumer is done (end, error, cancel or aclose).
Everything here runs on one event loop; only engine calls run in slot threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.engines.base import Engine, EngineInfo, SynthesisRequest
from app.serving.errors import (
    Draining,
    HealthCheckTimeout,
    NotReady,
    Overloaded,
    QueueTimeout,
)
from app.serving.job import Job
from app.serving.lease import Lease, PoolConfig, Ticket
from app.serving.lease import Slot as _Slot
from app.serving.stats import (
    NullObserver,
    PoolObserver,
    SafeObserver,
    ServiceTimeEstimator,
)

__all__ = ["EnginePool", "Job", "Lease", "NullObserver", "PoolConfig", "PoolObserver", "Ticket"]

log = logging.getLogger(__name__)

THREAD_PREFIX = "cosyserve-slot-"

# Wraps an engine generator inside the slot thread: (chunks, cancel flag) -> items.
Transform = Callable[[Iterator[Any], threading.Event], Iterator[Any]]


def _name_thread(name: str) -> None:
    threading.current_thread().name = name


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
        self._estimator = ServiceTimeEstimator()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: list[_Slot] = []
        self._idle: deque[_Slot] = deque()
        self._waiters: deque[asyncio.Future[_Slot]] = deque()
        self._jobs: set[Job] = set()
        self._started = False
        self._loaded = False
        self._failed = False
        self._draining = False
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        self._slots_shut = False
        self._permits = 0
        self._queued = 0
        self._running = 0
        self._admitted_total = 0
        self._rejected: dict[str, int] = {}
        self._stuck_total = 0
        self._idle_event = asyncio.Event()
        self._idle_event.set()

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
            self._slots.append(_Slot(i, executor))
        loading = self._slots[:1] if self.config.share_engine else self._slots
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
                slot.engine = fut.result()
            else:
                slot.state = "failed"
                errors.append(exc)
                log.error("engine slot %d failed to load: %r", slot.index, exc)
        if errors or cancelled is not None:
            self._failed = True
            await self._shutdown_slots()
            raise cancelled if cancelled is not None else errors[0]
        for slot in self._slots:
            slot.engine = self._slots[0].engine if self.config.share_engine else slot.engine
            slot.state = "idle"
            self._idle.append(slot)
        self._loaded = True

    def _load_engine(self, index: int) -> Engine:
        engine = self._factory(index)
        engine.load()
        engine.warmup()
        return engine

    async def begin_drain(self) -> None:
        """Stop admitting (ready -> False at once); queued and running work continues."""
        self._draining = True

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once no admitted request is queued, running or still being consumed."""
        if self._permits == 0:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._idle_event.wait()
        except TimeoutError:
            return self._permits == 0
        return True

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
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(shutdown)
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
        closing: list[asyncio.Future[None]] = []
        hung = {job.slot_index for job in self._jobs if not job.done}
        for slot in self._slots:
            first_owner = not self.config.share_engine or slot.index == 0
            if slot.engine is not None and first_owner and slot.index not in hung:
                closing.append(self._loop.run_in_executor(slot.executor, slot.engine.close))
        if closing:
            for result in await asyncio.gather(*closing, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.error("engine close failed: %r", result)
        for slot in self._slots:
            if slot.index in hung:
                slot.executor.shutdown(wait=False, cancel_futures=True)
            else:
                slot.executor.shutdown(wait=True)
            if slot.state != "failed":
                slot.state = "closed"
        self._idle.clear()

    # -- properties and info -----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._loaded and not self._draining and not self._closed

    @property
    def draining(self) -> bool:
        return self._draining or self._closed

    @property
    def capacity(self) -> int:
        return self.config.workers + self.config.max_queue

    def _engine(self) -> Engine:
        engine = self._slots[0].engine if self._slots and self._loaded else None
        if engine is None:
            raise NotReady("the engine is not loaded")
        return engine

    def engine_info(self) -> EngineInfo:
        return self._engine().info()

    def voices(self) -> list[str]:
        return list(self._engine().voices())

    async def check_health(self) -> None:
        """Run engine.health_check() in an idle slot's thread; skipped when no slot is free.

        Bounded by ``health_timeout_s`` (then ``HealthCheckTimeout``); the slot comes
        back only when its thread has returned from the check.
        """
        if self._closed:
            raise Draining("the engine pool is closed")
        self._engine()  # NotReady until loaded
        if not self._idle or self._has_waiters():
            return
        slot = self._idle.popleft()
        slot.state = "busy"
        assert slot.engine is not None
        fut = self._require_loop().run_in_executor(slot.executor, slot.engine.health_check)

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved here too, in case the caller was cancelled
            self._return_slot(slot, leased=False)

        fut.add_done_callback(done)
        try:
            async with asyncio.timeout(self.config.health_timeout_s):
                await asyncio.shield(fut)
        except TimeoutError:
            log.error("engine health check did not return within %g s (slot %d)", self.config.health_timeout_s,
                      slot.index)
            raise HealthCheckTimeout(f"the engine health check did not return within "
                                     f"{self.config.health_timeout_s:g} s") from None

    def stuck_slots(self) -> list[int]:
        """Slots whose job has been in the engine past ``request_timeout_s + stuck_grace_s``.

        Such a job's deadline has fired and its cancel flag is set, yet its thread has not
        returned: the engine is wedged, and only a restart frees the slot. Each job is
        logged once when first found. Empty when ``request_timeout_s`` is 0 (no deadline).
        """
        if self.config.request_timeout_s <= 0:
            return []
        limit = self.config.request_timeout_s + self.config.stuck_grace_s
        now = time.monotonic()
        stuck = []
        for job in self._jobs:
            if not job.done and now - job.started_at > limit:
                stuck.append(job.slot_index)
                if not job.stuck_reported:
                    job.stuck_reported = True
                    self._stuck_total += 1
                    log.error("slot %d is stuck in the engine: job %s has run %.0f s (deadline %g s + grace %g s)",
                              job.slot_index, job.request_id, now - job.started_at,
                              self.config.request_timeout_s, self.config.stuck_grace_s)
        return sorted(stuck)

    # -- admission ----------------------------------------------------------------------------
    def retry_after_s(self) -> float:
        return self._estimator.retry_after(self._queued, self.config.workers)

    def _reject(self, reason: str) -> None:
        self._rejected[reason] = self._rejected.get(reason, 0) + 1
        self._observer.on_reject(reason)

    def admit(self) -> Ticket:
        """Take an admission permit at once, or raise Overloaded / Draining / NotReady."""
        if self._draining or self._closed:
            self._reject("draining")
            raise Draining("the server is draining and takes no new requests", self.retry_after_s())
        if not self._loaded:
            self._reject("not_ready")
            raise NotReady("the engine is not loaded yet" if not self._failed else "the engine failed to load")
        if self._permits >= self.capacity:
            self._reject("queue_full")
            raise Overloaded(
                f"all {self.config.workers} workers are busy and {self.config.max_queue} requests are waiting",
                self.retry_after_s(),
            )
        self._permits += 1
        self._queued += 1
        self._admitted_total += 1
        self._idle_event.clear()
        self._observer.on_queue_depth(self._queued)
        return Ticket(self)

    def _release_permit(self, was_queued: bool) -> None:
        self._permits -= 1
        if was_queued:
            self._queued -= 1
            self._observer.on_queue_depth(self._queued)
        if self._permits == 0:
            self._idle_event.set()

    def _has_waiters(self) -> bool:
        return any(not w.done() for w in self._waiters)

    async def acquire(self, ticket: Ticket) -> Lease:
        """Wait FIFO for a free slot. On any failure the ticket's permit is released.

        The queue wait (and ``queue_timeout_s``) counts from this call, not from
        ``admit()``: a permit taken at the edge before the request body arrived
        does not charge the upload time to the queue.
        """
        if ticket._pool is not self or ticket.state != "admitted":
            raise RuntimeError("acquire() needs a fresh ticket from this pool's admit()")
        asked_at = time.monotonic()
        try:
            slot = await self._wait_for_slot()
        except QueueTimeout:
            ticket.release()
            self._reject("queue_timeout")
            raise
        except BaseException:
            ticket.release()
            raise
        wait = time.monotonic() - asked_at
        ticket.state = "leased"
        self._queued -= 1
        self._running += 1
        slot.state = "busy"
        self._observer.on_queue_depth(self._queued)
        self._observer.on_queue_wait(wait)
        return Lease(self, slot, ticket, wait)

    async def _wait_for_slot(self) -> _Slot:
        if self._closed:
            raise Draining("the engine pool is closed", self.retry_after_s())
        if self._idle and not self._has_waiters():
            return self._idle.popleft()
        fut: asyncio.Future[_Slot] = self._require_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                return await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()  # a slot arrived as the timer fired: keep it
            raise QueueTimeout(
                f"no worker became free within {self.config.queue_timeout_s:g} s", self.retry_after_s()
            ) from None
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._return_slot(fut.result(), leased=False)  # handed over as we were cancelled: pass it on
            raise
        finally:
            if not fut.done():
                fut.cancel()
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass

    def _return_slot(self, slot: _Slot, leased: bool) -> None:
        """Hand a freed slot to the oldest live waiter (no barging), or mark it idle."""
        if leased:
            self._running -= 1
        if self._closed:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        slot.state = "idle"
        self._idle.append(slot)

    # -- running --------------------------------------------------------------------------------
    def run(self, lease: Lease, req: SynthesisRequest, transform: Transform | None = None) -> Job:
        """Start engine.synthesize(req, cancel) in the lease's slot thread.

        ``transform(chunks, cancel)``, when given, wraps the engine generator in the same
        thread (e.g. encoding PCM to bytes); the job then yields what it yields.
        """
        if transform is None:
            return self._start(lease, lambda engine, cancel: engine.synthesize(req, cancel), req.request_id)
        return self._start(lease, lambda engine, cancel: transform(engine.synthesize(req, cancel), cancel),
                           req.request_id)

    async def call(self, fn: Callable[[Engine], Any], request_id: str = "") -> Any:
        """Run ``fn(engine)`` once in a slot's thread, under the same admission, queue and deadline.

        For engine work that is not a stream (e.g. computing a voice's prompt features).
        """

        def one(engine: Engine, cancel: Any) -> Iterator[Any]:
            yield fn(engine)

        ticket = self.admit()
        lease = await self.acquire(ticket)
        async with self._start(lease, one, request_id) as job:
            result, _ = await job.first_chunk()
            return result

    def _start(self, lease: Lease, open_gen: Callable[[Engine, Any], Iterator[Any]], request_id: str) -> Job:
        if lease._pool is not self or lease._owned or not lease._slot_held:
            raise RuntimeError("run() needs a live lease from this pool's acquire()")
        if self._closed:
            lease.release()
            raise Draining("the engine pool is closed", self.retry_after_s())
        engine = lease._slot.engine
        assert engine is not None
        try:
            job = Job(
                loop=self._require_loop(),
                executor=lease._slot.executor,
                open_gen=lambda cancel: open_gen(engine, cancel),
                request_id=request_id or uuid.uuid4().hex,
                queue_wait_s=lease.queue_wait_s,
                slot_index=lease.slot_index,
                buffer_chunks=self.config.stream_buffer_chunks,
                buffer_bytes=self.config.stream_buffer_bytes,
                deadline_s=self.config.request_timeout_s,
                on_thread_done=lambda j: self._job_ended(j, lease),
                on_released=lambda j: lease.ticket.release(),
            )
        except BaseException:
            lease.release()
            raise
        lease._owned = True
        self._jobs.add(job)
        self._observer.on_job_start()
        return job

    def _job_ended(self, job: Job, lease: Lease) -> None:
        """The job's slot thread returned: count it and free the slot."""
        self._jobs.discard(job)
        lease._slot.jobs_done += 1
        seconds = job.service_s or 0.0
        if job.outcome in ("ok", "error"):
            self._estimator.observe(seconds)
        self._observer.on_job_end(job.outcome, seconds)
        lease._release_slot()

    async def synthesize(self, req: SynthesisRequest, ticket: Ticket | None = None) -> Job:
        """admit (unless given a fresh ``ticket``) + acquire + run; the permit is released if acquire fails."""
        ticket = ticket if ticket is not None else self.admit()
        lease = await self.acquire(ticket)
        return self.run(lease, req)

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise NotReady("the engine pool has not been started")
        return self._loop

    # -- stats --------------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "workers": self.config.workers,
            "slots": [{"index": s.index, "state": s.state, "jobs_done": s.jobs_done} for s in self._slots],
            "running": self._running,
            "queued": self._queued,
            "in_flight": self._permits,
            "capacity": self.capacity,
            "admitted": self._admitted_total,
            "rejected": dict(self._rejected),
            "avg_service_s": self._estimator.average_s,
            "stuck": len(self.stuck_slots()),
            "stuck_total": self._stuck_total,
            "ready": self.ready,
            "draining": self.draining,
        }
