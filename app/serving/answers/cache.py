"""``AnswerCache``: both tiers, one computation per key at a time, and what it counts.

A request whose answer is reproducible (a seed, given or derived) asks :meth:`AnswerCache.fetch`:
a stored answer comes back at once (memory, else the directory, which then fills memory), or
the caller gets a :class:`Flight`, computes, feeds it what it sends and ends it. While a flight
is up, an identical request waits for it instead of computing again, then reads what it stored
(or, if it failed, leads its own). Loop-only, except the directory's file I/O (a thread).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.engines.base import SynthesisRequest
from app.serving.answers.disk import DiskTier
from app.serving.answers.key import Answer, answer_key, derived_seed, request_parts
from app.serving.answers.memory import MemoryTier
from app.serving.encoded import OutputSpec
from app.serving.errors import ClientGone

log = logging.getLogger("cosyserve.cache")


@dataclass(frozen=True)
class CacheConfig:
    """Built from the ``cache`` settings (app/settings/runtime.py), which say what each means."""

    enabled: bool
    memory_bytes: int
    disk_dir: str | None
    disk_bytes: int
    max_entry_bytes: int
    derive_seed: bool
    per_key: bool


class Flight:
    """One computation of an answer: collects the bytes sent; ``end(ok)`` stores (or drops) them."""

    def __init__(self, cache: AnswerCache, key: str, done: asyncio.Event | None) -> None:
        self.cache, self.key, self._done = cache, key, done
        self._chunks: list[bytes] = []
        self._bytes = 0
        self._fits = True
        self.ended = False

    def feed(self, data: bytes) -> None:
        if not self._fits or not data:
            return
        self._bytes += len(data)
        if self._bytes > self.cache.config.max_entry_bytes:
            self._fits, self._chunks = False, []  # too large to keep: sent, not stored
            return
        self._chunks.append(data)

    def end(self, ok: bool, media_type: str = "", sample_rate: int = 0, audio_s: float = 0.0) -> None:
        """Idempotent. ``ok``: the whole answer was produced and sent; store it."""
        if self.ended:
            return
        self.ended = True
        if ok and self._fits and self._chunks:
            self.cache.store(self.key, Answer(media_type, sample_rate, audio_s, tuple(self._chunks)))
        elif ok and not self._fits:
            self.cache.too_large += 1
        if self._done is not None:
            self.cache.land(self.key, self._done)


class AnswerCache:
    def __init__(self, config: CacheConfig, model: str) -> None:
        self.config = config
        self.model = model  # the model's fingerprint: its files and every engine setting
        self.memory = MemoryTier(config.memory_bytes)
        self.disk = DiskTier(config.disk_dir, config.disk_bytes) if config.disk_dir else None
        self.hits = {"memory": 0, "disk": 0}
        self.misses = 0
        self.stores = 0
        self.too_large = 0
        self.waits = 0  # identical requests that waited for one computing
        self._flights: dict[str, asyncio.Event] = {}
        self._writes: set[asyncio.Future] = set()

    @property
    def enabled(self) -> bool:
        return self.config.enabled and (self.memory.budget > 0 or self.disk is not None)

    def key(self, req: SynthesisRequest, voice_id: str | None, out: OutputSpec, tenant: str | None) -> str | None:
        """The answer's key, or None when it is not reproducible (no seed, text arriving over time).

        With ``derive_seed``, an unseeded request is given the seed its own request derives (set on ``req``)."""
        if not self.enabled or req.text_stream is not None:
            return None
        parts = request_parts(req, voice_id)
        if req.seed is None:
            if not self.config.derive_seed:
                return None
            req.seed = derived_seed(self.model, parts)
        return answer_key(self.model, parts, req.seed, out, tenant if self.config.per_key else None)

    async def get(self, key: str) -> Answer | None:
        answer = self.memory.get(key)
        if answer is not None:
            self.hits["memory"] += 1
            return answer
        if self.disk is not None:
            answer = await asyncio.to_thread(self.disk.get, key)
            if answer is not None:
                self.hits["disk"] += 1
                self.memory.put(key, answer)
                return answer
        return None

    async def fetch(self, key: str, refresh: bool = False, gone: asyncio.Event | None = None) -> Answer | Flight:
        """The stored answer, or a Flight the caller must ``end``. ``refresh``: compute afresh (Cache-Control:
        no-cache), unless an identical computation is running: its answer is as fresh. ClientGone if ``gone``
        fires while waiting for one."""
        while True:
            if not refresh:
                answer = await self.get(key)
                if answer is not None:
                    return answer
            running = self._flights.get(key)
            if running is None:
                self.misses += 1
                done = self._flights[key] = asyncio.Event()
                return Flight(self, key, done)
            self.waits += 1
            await _wait(running, gone)
            refresh = False

    def store(self, key: str, answer: Answer) -> None:
        self.stores += 1
        self.memory.put(key, answer)
        if self.disk is not None:
            write = asyncio.get_running_loop().run_in_executor(None, self.disk.put, key, answer)
            self._writes.add(write)
            write.add_done_callback(self._written)

    def _written(self, write: asyncio.Future) -> None:
        self._writes.discard(write)
        if not write.cancelled() and write.exception() is not None:
            log.warning("answer cache: a write failed: %s", write.exception())

    def land(self, key: str, done: asyncio.Event) -> None:
        if self._flights.get(key) is done:
            del self._flights[key]
        done.set()

    async def close(self) -> None:
        """Wait for the directory writes still running."""
        if self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def stats(self) -> dict:
        disk = self.disk
        return {
            "hits": dict(self.hits), "misses": self.misses, "stores": self.stores, "too_large": self.too_large,
            "waits": self.waits, "entries": len(self.memory),
            "bytes": {"memory": self.memory.bytes, "disk": disk.bytes if disk else 0},
            "budget": {"memory": self.memory.budget, "disk": disk.budget if disk else 0},
            "evictions": {"memory": self.memory.evictions, "disk": disk.evictions if disk else 0},
            "corrupt": disk.corrupt if disk else 0,
        }


async def _wait(event: asyncio.Event, gone: asyncio.Event | None) -> None:
    if gone is None:
        await event.wait()
        return
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(gone.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    if not event.is_set():
        raise ClientGone("the client closed the connection while an identical request was computed")
