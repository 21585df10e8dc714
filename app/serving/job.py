"""``Job``: one request's engine generator running in its slot thread, read as an async iterator.

``EnginePool.run`` builds it once the request has a slot, around one
:class:`~app.serving.bridge.BlockingStream`: the engine call, the request
deadline (``loop.call_later`` -> ``abort(DeadlineExceeded)``) and the
client-cancel path (``CancelledError`` while reading sets the cancel flag and
re-raises).

The job owns the request's slot lease and admission ticket (moved in by the
pool) and gives each back exactly once, when the slot thread has returned from
the engine: the lease first (the slot may be reused only then), then the ticket.
A permit is held while the engine works, not while a client reads: audio not yet
read waits in the stream's buffer (bounded per stream and server-wide, see
``app/serving/buffers.py``), which the consumer's end (end, error, cancellation
or ``aclose``) gives back. That is the one place a started request's permit is
released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Generic, Self, TypeVar

from app.engines.base import Cancelled
from app.serving.admission import Ticket
from app.serving.bridge import BlockingStream, GeneratorFactory
from app.serving.buffers import StreamBudget
from app.serving.errors import DeadlineExceeded
from app.serving.slots import Lease
from app.text.stream import TextStream

log = logging.getLogger(__name__)

T = TypeVar("T")


class Job(Generic[T]):
    """One running synthesis: an async iterator (of AudioChunk, or what a transform yields).

    Built by ``EnginePool.run``; of the pool it knows one callback, called once on
    the loop when the slot thread has returned (outcome known), before the lease goes
    back: ``on_thread_done(job)``.
    """

    def __init__(
        self,
        ticket: Ticket,
        lease: Lease,
        open_gen: GeneratorFactory[T],
        *,
        request_id: str,
        queue_wait_s: float,
        buffer_chunks: int,
        deadline_s: float,
        buffer_bytes: int | None = None,
        budget: StreamBudget | None = None,
        text: TextStream | None = None,
        on_thread_done: Callable[[Job], None],
    ) -> None:
        if not (ticket.held and lease.held):
            raise RuntimeError("a job needs a held admission ticket and slot lease")
        loop = asyncio.get_running_loop()
        self.request_id = request_id
        self.queue_wait_s = queue_wait_s
        self.slot_index = lease.slot.index
        self.time_to_first_chunk_s: float | None = None
        self.audio_s = 0.0
        self.outcome = "running"  # then ok | cancelled | error | timeout
        self.service_s: float | None = None
        self._deadline_s = deadline_s
        self._text = text  # text still arriving (a WebSocket utterance): the deadline counts from its last piece
        self._on_thread_done_cb = on_thread_done
        self._timed_out = False
        self._consumer_done = False
        self._settled = False  # the thread-returned bookkeeping ran
        self._reading = False  # first_chunk() or iteration has begun
        self._loop = loop
        self._stream: BlockingStream[T] = BlockingStream(loop, buffer_chunks, max_bytes=buffer_bytes, budget=budget)
        self._stream.pace = ticket.pause_s  # a long job in a lane yields to short requests (admission)
        self._started_at = time.monotonic()
        self.stuck_reported = False  # the pool logged this job as stuck in the engine
        self._thread_done = self._stream.start(lease.slot.executor, open_gen)  # if this raises, nothing was taken
        self._ticket = ticket.take()
        self._lease = lease
        self._thread_done.add_done_callback(self._on_thread_done)
        self._timer = loop.call_later(deadline_s, self._on_deadline) if deadline_s > 0 else None

    # -- consumer API -------------------------------------------------------------------------
    async def first_chunk(self) -> tuple[T | None, AsyncIterator[T]]:
        """The first item (None if the engine yielded none) and an iterator over the rest.

        Engine errors before the first item raise here. Call it before reading the job,
        at most once: the first item is handed out here and nowhere else.
        """
        if self._reading:
            raise RuntimeError("first_chunk() must be the first read of a job")
        self._reading = True
        return await self._next(), self

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        self._reading = True
        item = await self._next()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self, wait_s: float | None = None) -> None:
        """The one way a job is closed (idempotent): cancel it if it still runs, wait for its thread.

        When it returns (or raises) the consumer side is done (what was buffered is dropped);
        once the slot thread has returned, the slot and then the permit are released (here, or
        by the thread-done callback). ``wait_s`` bounds the wait: an engine that ignores its cancel flag must
        not hold the caller (and its client) hostage; its slot and permit go back whenever
        its thread returns. A caller cancelled during a bounded wait still finishes it, then
        re-raises, so a cancelled request has freed what it could before it unwinds.
        """
        self._stream.cancel()
        self._consumer_finished()
        until = None if wait_s is None else self._loop.time() + wait_s
        try:
            await self._wait_returned(until)
        except asyncio.CancelledError:
            if until is not None:
                await self._wait_returned(until)
            raise
        if not self._thread_done.done():
            log.warning("job %s: slot %d has not returned from the engine %g s after cancel; the slot stays "
                        "busy until it does", self.request_id, self.slot_index, wait_s)
            return
        self._settle()  # an await on a finished future resumes before its done callbacks run

    async def _wait_returned(self, until: float | None) -> None:
        if not self._thread_done.done():
            timeout = None if until is None else max(0.0, until - self._loop.time())
            await asyncio.wait({self._thread_done}, timeout=timeout)  # never cancels the thread's future

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def stream(self) -> BlockingStream[T]:
        """The bridge from the slot thread (read-only use: its counters, e.g. ``buffered``)."""
        return self._stream

    @property
    def ticket(self) -> Ticket:
        """The request's admission ticket (held by the job until it releases it; read-only use)."""
        return self._ticket

    @property
    def busy_s(self) -> float:
        """Service time without the time the slot thread waited for a slow consumer or paused for short
        requests (0 before the end)."""
        return max(0.0, (self.service_s or 0.0) - self._stream.blocked_s - self._stream.paused_s)

    @property
    def deadline_s(self) -> float:
        """Seconds from ``started_at`` it may run before it is cancelled with 504 (0: no deadline).

        A job whose text arrives while it runs may run ``request_timeout_s`` past its last text, so a
        client that types slowly is not cut off, and the time it takes to speak is what that text costs.
        The time a long job paused for short requests (``paused_s``) is added: a yield, not a slow engine.
        """
        if self._deadline_s <= 0:
            return self._deadline_s
        base = self._deadline_s + self._stream.paused_s  # the time it yielded is not the engine's
        if self._text is None:
            return base
        return max(base, self._text.last_at - self._started_at + base)

    @property
    def paused_s(self) -> float:
        """Seconds its slot thread paused, yielding to short requests (a long job in a lane)."""
        return self._stream.paused_s

    @property
    def started_at(self) -> float:
        """``time.monotonic()`` when the job was handed to its slot thread."""
        return self._started_at

    @property
    def done(self) -> bool:
        """The slot thread has returned from the engine generator."""
        return self._thread_done.done()

    @property
    def thread_returned(self) -> asyncio.Future[None]:
        """Completes when the slot thread has returned; shield it before awaiting it."""
        return self._thread_done

    def abort(self, exc: BaseException) -> None:
        """Cancel the engine job and make the consumer raise ``exc`` (used by pool.close)."""
        if not self._thread_done.done():
            self._stream.abort(exc)

    def settle(self) -> None:
        """Run the thread-returned bookkeeping now if the thread has returned (idempotent)."""
        self._settle()

    # -- internals -------------------------------------------------------------------------------
    async def _next(self) -> T | None:
        if self._consumer_done:
            return None
        try:
            chunk = await self._stream.__anext__()
        except StopAsyncIteration:
            self._consumer_finished()
            return None
        except asyncio.CancelledError:
            self._stream.cancel()  # the client left: abort the engine job, then re-raise
            self._consumer_finished()
            raise
        except BaseException:
            self._consumer_finished()
            raise
        if self.time_to_first_chunk_s is None and self._stream.first_item_at is not None:
            self.time_to_first_chunk_s = max(0.0, self._stream.first_item_at - self._started_at)
        self.audio_s += getattr(chunk, "duration_s", 0.0)
        return chunk

    def _on_deadline(self) -> None:
        left = self._started_at + self.deadline_s - time.monotonic()
        if left > 0.001 and not self._thread_done.done():  # text came since it was armed: follow it
            self._timer = self._loop.call_later(left, self._on_deadline)
            return
        if not self._thread_done.done():
            self._timed_out = True
            since = "" if self._text is None else " of its last text"
            self._stream.abort(DeadlineExceeded(f"the request did not finish within {self._deadline_s:g} s{since}"))

    def _on_thread_done(self, fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is not None:  # run() catches everything
            log.error("slot thread failed outside the engine", exc_info=fut.exception())
        self._settle()

    def _settle(self) -> None:
        if self._settled or not self._thread_done.done():
            return
        self._settled = True
        if self._timer is not None:
            self._timer.cancel()
        self.service_s = time.monotonic() - self._started_at
        error = self._stream.error
        if self._timed_out:
            self.outcome = "timeout"
        elif error is not None and not (isinstance(error, Cancelled) and self._stream.cancel_event.is_set()):
            self.outcome = "error"
        elif self._stream.exhausted:
            self.outcome = "ok"
        else:
            self.outcome = "cancelled"
        self._on_thread_done_cb(self)
        self._lease.release()  # the slot thread has returned: the slot may serve the next request
        self._maybe_release()

    def _consumer_finished(self) -> None:
        if not self._consumer_done:
            self._consumer_done = True
            self._stream.discard()  # nobody reads on: give its buffered bytes back

    def _maybe_release(self) -> None:
        if self._settled and self._ticket.held:
            self._ticket.release()  # the one release of a started request's permit
