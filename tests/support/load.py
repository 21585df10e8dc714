"""Steady open-loop load from a real client (httpx, async) in a background thread.

Requests start at a fixed rate whatever the server does (a closed loop would slow down
exactly when the cluster misbehaves and hide it). Every request's outcome is recorded: when
it started and ended, its status, which replica served it (nginx's ``X-Upstream`` header, added
by the test's wrapper config), and whether the audio arrived whole, checked with a real decoder
(soundfile for WAV) or by exact length (raw PCM streams).
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Self

import httpx
import soundfile as sf

SAMPLE_RATE = 24000
FAKE_SAMPLES = 3 * int(0.2 * SAMPLE_RATE)  # the fake engine: 3 chunks of 0.2 s each


@dataclass
class Outcome:
    start: float
    end: float
    stream: bool
    status: int | None = None  # None: no HTTP response at all
    ok: bool = False
    upstream: str | None = None
    retry_after: str | None = None
    error: str | None = None


@dataclass
class Load:
    base_url: str
    rate: float  # requests started per second
    stream_share: float = 0.5  # this fraction of requests streams raw PCM, the rest asks for a whole WAV
    timeout_s: float = 30.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- control (from the test's thread) ---------------------------------------------------------
    def start(self) -> Self:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.timeout_s + 30)
        assert not self._thread.is_alive(), "the load generator did not stop"
        with self._lock:
            return sorted(self.outcomes, key=lambda o: o.start)

    def run_for(self, seconds: float) -> list[Outcome]:
        self.start()
        time.sleep(seconds)
        return self.stop()

    # -- the client ---------------------------------------------------------------------------------
    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, limits=limits) as http:
            tasks: set[asyncio.Task] = set()
            period, n = 1.0 / self.rate, 0
            t0 = time.monotonic()
            while not self._stop.is_set():
                stream = int((n + 1) * self.stream_share) > int(n * self.stream_share)  # evenly interleaved
                task = asyncio.create_task(self._one(http, stream))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                await asyncio.sleep(max(0.0, t0 + n * period - time.monotonic()))
            if tasks:
                await asyncio.wait(tasks)

    async def _one(self, http: httpx.AsyncClient, stream: bool) -> None:
        o = Outcome(start=time.monotonic(), end=0.0, stream=stream)
        body = {"text": "hello from the cluster test", "voice": "fake_female",
                "format": "pcm" if stream else "wav", "stream": stream}
        try:
            async with http.stream("POST", "/v1/tts", json=body) as r:
                o.status, o.upstream = r.status_code, r.headers.get("x-upstream")
                o.retry_after = r.headers.get("retry-after")
                data = await r.aread()
            if o.status == 200:
                o.ok = _whole(data, stream)
                if not o.ok:
                    o.error = f"incomplete audio ({len(data)} bytes)"
            else:
                o.error = f"HTTP {o.status}"
        except httpx.HTTPError as exc:
            o.error = f"{type(exc).__name__}: {exc}"
        o.end = time.monotonic()
        with self._lock:
            self.outcomes.append(o)


def _whole(data: bytes, stream: bool) -> bool:
    if stream:
        return len(data) == 2 * FAKE_SAMPLES  # raw 16-bit mono PCM
    try:
        pcm, rate = sf.read(io.BytesIO(data), dtype="int16")
    except (sf.LibsndfileError, RuntimeError):
        return False
    return rate == SAMPLE_RATE and len(pcm) == FAKE_SAMPLES


def rate_ok(outcomes: list[Outcome], t_from: float, t_to: float) -> float:
    """Successful requests per second that ended within [t_from, t_to) (monotonic clock)."""
    return sum(1 for o in outcomes if o.ok and t_from <= o.end < t_to) / (t_to - t_from)
