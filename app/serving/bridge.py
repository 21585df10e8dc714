"""Bridge a blocking generator running in a slot thread to an async iterator.

Design
------
``BlockingStream`` connects exactly one producer (the engine generator, pulled
in the slot's own single-thread executor) to exactly one consumer (a coroutine
on the event loop). No extra thread per stream is needed:

* Producer -> buffer: the slot thread calls ``next(gen)`` and appends each item
  to a bounded deque guarded by a ``threading.Condition``. When the deque holds
  ``maxsize`` items the thread waits on the condition: the engine stops being
  pulled (backpressure), so at most ``maxsize`` chunks are buffered plus the
  one the thread holds; with ``max_bytes`` it also waits while the buffered items
  hold that many bytes (encoded pieces have a ``len()``), so backpressure counts
  bytes, not just chunks, and with a shared ``budget`` (``app/serving/buffers.py``)
  while all streams together hold the server's limit (one item always fits).
  The wait is woken by the consumer taking an item or by ``cancel()``; it also
  re-checks every ``poll_s`` (the cancel flag, and the budget that other
  streams' consumers free).
* Buffer -> consumer: ``__anext__`` takes an item under the lock (never held
  for more than a few deque operations, so the loop is not blocked). When the
  deque is empty it parks on an ``asyncio.Future`` and the producer resolves it
  with ``loop.call_soon_threadsafe`` -- only when a consumer is actually parked,
  so there is at most one cross-thread wake-up per wait, not one per chunk.
* End, errors, cancel: ``StopIteration`` is caught in the slot thread (it never
  crosses the thread boundary; one raised inside the generator body is turned
  into ``RuntimeError`` by PEP 479 and transported like any error). Any other
  exception from the engine is stored and raised to the consumer after the
  chunks before it. ``cancel()`` sets the threading cancel flag (the same
  ``threading.Event`` the engine receives) and wakes a blocked producer, which
  then closes the generator (``gen.close()``, in its own thread) and returns.
  ``abort(exc)`` does the same from the loop and makes the consumer see ``exc``
  at once, dropping buffered chunks (deadline, shutdown).

The future returned by ``start()`` completes when the slot thread has returned,
which is the only moment its slot may be reused. ``app/serving/job.py`` wraps
one stream per request (deadline, client cancel, slot and permit).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Generic, TypeVar

from app.serving.buffers import StreamBudget

T = TypeVar("T")

GeneratorFactory = Callable[[threading.Event], Iterable[T]]


class BlockingStream(Generic[T]):
    """One blocking producer in a thread -> one async consumer, bounded and cancellable."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        maxsize: int,
        cancel_event: threading.Event | None = None,
        poll_s: float = 0.1,
        max_bytes: int | None = None,
        budget: StreamBudget | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self._loop = loop
        self._maxsize = maxsize
        self._max_bytes = max_bytes  # also bound the buffered bytes (items with a len())
        self._bytes = 0
        self._budget = budget  # the server-wide bytes of all streams' buffers
        self._poll_s = poll_s
        self.cancel_event = cancel_event if cancel_event is not None else threading.Event()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False  # the producer has stopped (end, error or cancel)
        self._error: BaseException | None = None
        self._abort: BaseException | None = None
        self._delivered_end = False
        # Observable by the owner (read on the loop, written by the producer).
        self.exhausted = False  # the generator ran to its end
        self.produced = 0  # items pulled from the generator
        self.max_buffered = 0  # high-water mark of the buffer
        self.max_buffered_bytes = 0  # high-water mark of the buffered bytes
        self.first_item_at: float | None = None  # time.monotonic() of the first item
        self.blocked_s = 0.0  # seconds the producer waited for room (a consumer slower than the engine)
        self.paused_s = 0.0  # seconds the producer paused as ``pace`` asked (a long job yielding)
        self.produced_audio_s = 0.0  # the audio of the items pulled (items with a ``duration_s``)
        # (seconds the item took, seconds of audio ahead of real time) -> seconds to pause before the next
        self.pace: Callable[[float, float], float] | None = None

    # -- owner side ------------------------------------------------------------------
    def start(self, executor: Executor, open_gen: GeneratorFactory[T]) -> asyncio.Future[None]:
        """Run the producer in ``executor``; the future completes when that thread returned."""
        return self._loop.run_in_executor(executor, self.run, open_gen)

    @property
    def error(self) -> BaseException | None:
        """The exception the generator raised, if any (set once the producer stopped)."""
        return self._error

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._items)

    def cancel(self) -> None:
        """Ask the producer to stop; safe from any thread, idempotent."""
        with self._space:
            self.cancel_event.set()
            self._space.notify_all()

    def abort(self, exc: BaseException) -> None:
        """From the loop: cancel the producer and make the consumer raise ``exc`` now."""
        with self._space:
            if self._abort is None and not self._delivered_end:
                self._abort = exc
            self._drop_items()
            self.cancel_event.set()
            self._space.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def discard(self) -> None:
        """The consumer is gone: drop what is buffered (its bytes go back to the budget); idempotent."""
        with self._space:
            self._drop_items()
            self._space.notify_all()

    def _drop_items(self) -> None:
        self._items.clear()
        if self._budget is not None:
            self._budget.sub(self._bytes)
        self._bytes = 0

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    # -- producer side (slot thread) -------------------------------------------------------
    def run(self, open_gen: GeneratorFactory[T]) -> None:
        """Pull the generator into the buffer until it ends, fails or is cancelled."""
        error: BaseException | None = None
        gen: Iterable[T] | None = None
        try:
            if not self.cancel_event.is_set():
                gen = open_gen(self.cancel_event)
                it = iter(gen)
                while not self.cancel_event.is_set():
                    began = time.monotonic()
                    try:
                        item = next(it)
                    except StopIteration:
                        # An engine may just stop when it sees the flag: that is not a full run.
                        self.exhausted = not self.cancel_event.is_set()
                        break
                    worked = time.monotonic() - began
                    self.produced += 1
                    self.produced_audio_s += getattr(item, "duration_s", 0.0)
                    if not self._put(item):
                        break
                    self._pause(worked)
        except BaseException as exc:  # noqa: BLE001 - the thread boundary: everything is transported
            error = exc
        if gen is not None:
            close = getattr(gen, "close", None)
            if close is not None:
                try:
                    close()
                except BaseException as exc:  # noqa: BLE001 - a generator failing while closing
                    error = error or exc
        self._finish(error)

    def _pause(self, worked_s: float) -> None:
        """Yield as ``pace`` asks after a piece of work (waking at once on cancel)."""
        if self.pace is None:
            return
        since_first = time.monotonic() - (self.first_item_at or time.monotonic())
        pause = self.pace(worked_s, self.produced_audio_s - since_first)
        if pause > 0:
            since = time.monotonic()
            self.cancel_event.wait(pause)
            self.paused_s += time.monotonic() - since

    def _full(self, size: int = 0) -> bool:
        if len(self._items) >= self._maxsize:
            return True
        if not self._items:
            return False  # one item always fits: a stream that is read keeps moving
        if self._max_bytes is not None and self._bytes + size > self._max_bytes:
            return True
        return self._budget is not None and not self._budget.fits(size)

    def _put(self, item: T) -> bool:
        size = _size(item)
        with self._space:
            if self._full(size):
                since = time.monotonic()
                if self._budget is not None and self._items and not self._budget.fits(size):
                    self._budget.note_wait()
                try:
                    while self._full(size):
                        if self.cancel_event.is_set():
                            return False
                        self._space.wait(self._poll_s)
                finally:
                    self.blocked_s += time.monotonic() - since
            if self.cancel_event.is_set():
                return False
            self._items.append(item)
            self._bytes += size
            if self._budget is not None:
                self._budget.add(size)
            self.max_buffered = max(self.max_buffered, len(self._items))
            self.max_buffered_bytes = max(self.max_buffered_bytes, self._bytes)
            if self.first_item_at is None:
                self.first_item_at = time.monotonic()
            waiter, self._waiter = self._waiter, None
        self._wake(waiter)
        return True

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            self._finished = True
            self._error = error
            waiter, self._waiter = self._waiter, None
        self._wake(waiter)

    def _wake(self, waiter: asyncio.Future[None] | None) -> None:
        if waiter is None:
            return
        try:
            self._loop.call_soon_threadsafe(_resolve, waiter)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            pass

    # -- consumer side (event loop) --------------------------------------------------------
    def __aiter__(self) -> BlockingStream[T]:
        return self

    async def __anext__(self) -> T:
        while True:
            with self._space:
                if self._delivered_end:
                    raise StopAsyncIteration
                if self._abort is not None:
                    self._delivered_end = True
                    raise self._abort
                if self._items:
                    item = self._items.popleft()
                    size = _size(item)
                    self._bytes -= size
                    if self._budget is not None:
                        self._budget.sub(size)
                    self._space.notify()
                    return item
                if self._finished:
                    self._delivered_end = True
                    if self._error is not None:
                        raise self._error
                    raise StopAsyncIteration
                if self._waiter is not None:
                    raise RuntimeError("BlockingStream supports one consumer at a time")
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._waiter = waiter
            try:
                await waiter
            finally:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None


def _size(item: object) -> int:
    """Bytes an item holds in the buffer: ``len()`` of encoded pieces, 0 for anything else."""
    try:
        return len(item)  # type: ignore[arg-type]
    except TypeError:
        return 0


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
