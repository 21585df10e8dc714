"""Async HTTP load (httpx): closed-loop clients and open-loop (Poisson) arrivals, each request timed from send to
its first body byte (TTFA) and its last (latency); a 503 is a rejection, a client timeout a timeout, anything else
non-2xx or a broken body an error."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class RequestSpec:
    """One request shape: a JSON body."""

    method: str
    path: str
    json: dict | None = None


@dataclass
class Result:
    start: float  # monotonic, seconds
    status: int  # 0: no response (timeout / connection error)
    latency_s: float
    ttfa_s: float | None
    nbytes: int
    kind: str  # ok | rejected | timeout | error
    audio_s: float = 0.0  # seconds of audio received (16-bit mono PCM answers; 0 for other formats)
    retry_after: str | None = None  # a 503's Retry-After header


@dataclass
class Summary:
    requests: int = 0
    ok: int = 0
    rejected: int = 0
    timeouts: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    throughput_rps: float = 0.0  # successful requests per second
    audio_per_s: float = 0.0  # goodput: seconds of audio of successful requests per wall second
    offered_rps: float | None = None  # open loop only
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    latency_p99_s: float | None = None
    ttfa_p50_s: float | None = None
    ttfa_p95_s: float | None = None
    ttfa_p99_s: float | None = None
    reject_p50_s: float | None = None
    reject_p99_s: float | None = None
    error_samples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def brief(self) -> str:
        """One line for a suite's progress log."""
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f}ms"
        return (f"{self.throughput_rps:.2f} rps {self.audio_per_s:.1f} audio-s/s ok={self.ok} "
                f"p50={ms(self.latency_p50_s)} p99={ms(self.latency_p99_s)} 503={self.rejected} "
                f"(p99 {ms(self.reject_p99_s)}) err={self.errors} timeout={self.timeouts}")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of the values that are not NaN; None for none."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def summarize(results: list[Result], elapsed_s: float, errors: list[str] | None = None,
              window: tuple[float, float] | None = None) -> Summary:
    """Counts and percentiles over ``results``; throughput over ``window`` when given: the work done inside it
    (``work_in_window``: no ramp-up or tail bias, right when a request outlasts the window)."""
    ok = [r for r in results if r.kind == "ok"]
    rej = [r.latency_s for r in results if r.kind == "rejected"]
    lat = [r.latency_s for r in ok]
    ttfa = [r.ttfa_s for r in ok if r.ttfa_s is not None]
    if window is not None:
        throughput, audio = work_in_window(ok, *window), work_in_window(ok, *window, weight=lambda r: r.audio_s)
    else:
        seconds = elapsed_s if elapsed_s > 0 else math.inf  # none: 0 per second
        throughput, audio = len(ok) / seconds, sum(r.audio_s for r in ok) / seconds
    return Summary(
        requests=len(results), ok=len(ok), rejected=len(rej),
        timeouts=sum(r.kind == "timeout" for r in results), errors=sum(r.kind == "error" for r in results),
        elapsed_s=elapsed_s, throughput_rps=throughput, audio_per_s=audio,
        **{f"{name}_p{q}_s": percentile(values, q) for name, values in (("latency", lat), ("ttfa", ttfa))
           for q in (50, 95, 99)},
        reject_p50_s=percentile(rej, 50), reject_p99_s=percentile(rej, 99), error_samples=(errors or [])[:5],
    )


def work_in_window(ok: list[Result], lo: float, hi: float, weight: Any = None) -> float:
    """Requests per second completed inside [lo, hi], each by its overlap share (times ``weight(result)``)."""
    if hi <= lo:
        return 0.0
    work = 0.0
    for r in ok:
        w = 1.0 if weight is None else weight(r)
        end = r.start + r.latency_s
        if r.latency_s <= 0:
            work += w if lo <= end <= hi else 0.0
        else:
            work += w * max(0.0, min(end, hi) - max(r.start, lo)) / r.latency_s
    return work / (hi - lo)


class LoadClient:
    """One httpx.AsyncClient for a run (``async with``); ``send`` never raises (outcomes become Results)."""

    def __init__(self, base_url: str, timeout_s: float = 120.0, max_connections: int = 1024) -> None:
        self.client = httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        self.timeout_s = timeout_s
        self.errors: list[str] = []

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def send(self, spec: RequestSpec) -> Result:
        t0 = time.monotonic()
        ttfa: float | None = None
        nbytes = 0
        rate = retry_after = None
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.client.stream(spec.method, spec.path, json=spec.json) as r:
                    async for part in r.aiter_raw():
                        if part and ttfa is None:
                            ttfa = time.monotonic() - t0
                        nbytes += len(part)
                    status = r.status_code
                    rate, retry_after = r.headers.get("x-sample-rate"), r.headers.get("retry-after")
        except (TimeoutError, httpx.TimeoutException):
            return Result(t0, 0, time.monotonic() - t0, ttfa, nbytes, "timeout")
        except httpx.HTTPError as exc:
            self._note(f"{type(exc).__name__}: {exc}")
            return Result(t0, 0, time.monotonic() - t0, ttfa, nbytes, "error")
        latency = time.monotonic() - t0
        pcm = (spec.json or {}).get("format") == "pcm"
        audio_s = nbytes / 2 / int(rate) if pcm and rate and rate.isdigit() and status == 200 else 0.0
        if status == 503:
            kind = "rejected"
        elif 200 <= status < 300 and nbytes > 0:
            kind = "ok"
        else:
            kind = "error"
            self._note(f"HTTP {status} ({nbytes} bytes)")
        return Result(t0, status, latency, ttfa if kind == "ok" else None, nbytes, kind, audio_s, retry_after)

    def _note(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)


def retry_pause_s(header: str | None, default_s: float = 1.0) -> float:
    """The pause a client that honours ``Retry-After`` takes (as the openai SDK and urllib3's Retry do):
    its seconds (an HTTP date, or none: ``default_s``)."""
    try:
        return max(0.0, float(header)) if header is not None else default_s
    except ValueError:
        return default_s


async def closed_loop(base_url: str, spec: RequestSpec, concurrency: int, duration_s: float, *,
                      warmup_s: float = 0.0, timeout_s: float = 120.0,
                      reject_backoff_s: float | None = 0.1) -> Summary:
    """``concurrency`` clients, each sending its next request when the last one ended, for ``warmup_s`` +
    ``duration_s``; the last ``duration_s`` is measured (``summarize``), requests in flight at its end awaited. After
    a 503 a client waits ``reject_backoff_s``, or with None the ``Retry-After`` it names (``retry_pause_s``)."""
    results: list[Result] = []
    t_measure = time.monotonic() + warmup_s
    t_end = t_measure + duration_s

    async def client(lc: LoadClient) -> None:
        while time.monotonic() < t_end:
            r = await lc.send(spec)
            if r.start + r.latency_s >= t_measure:
                results.append(r)
            if r.kind == "rejected":
                pause = retry_pause_s(r.retry_after) if reject_backoff_s is None else reject_backoff_s
                if pause > 0:
                    await asyncio.sleep(min(pause, max(0.0, t_end - time.monotonic())))

    async with LoadClient(base_url, timeout_s, max_connections=max(8, concurrency * 2)) as lc:
        await asyncio.gather(*(client(lc) for _ in range(concurrency)))
        return summarize(results, time.monotonic() - t_measure, lc.errors, window=(t_measure, t_end))


async def open_phases(base_url: str, spec: RequestSpec, phases: list[tuple[float, float]], timeout_s: float,
                      seed: int = 1, errors: list[str] | None = None) -> tuple[list[Result], float]:
    """Poisson arrivals at ``rate`` for ``seconds``, phase after phase, whatever the server does; every request
    awaited. (results, t0); ``errors`` receives the client's error texts (the first 20)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Result]] = []
    async with LoadClient(base_url, timeout_s) as lc:
        lc.errors = lc.errors if errors is None else errors
        try:
            t0, start = time.monotonic(), 0.0
            for rate, seconds in phases:
                at = start + rng.expovariate(rate)
                while at < start + seconds:
                    if (delay := t0 + at - time.monotonic()) > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(lc.send(spec)))
                    at += rng.expovariate(rate)
                start += seconds
            return list(await asyncio.gather(*tasks)), t0
        finally:
            for t in tasks:
                t.cancel()


async def open_loop(base_url: str, spec: RequestSpec, rate_rps: float, duration_s: float, *,
                    timeout_s: float = 120.0, seed: int = 1, window: bool = False) -> Summary:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``, whatever the server does; then wait for all.
    ``window``: throughput is the work done while the arrivals lasted, as a closed loop counts its window's."""
    errors: list[str] = []
    results, t0 = await open_phases(base_url, spec, [(rate_rps, duration_s)], timeout_s, seed, errors)
    ends = [r.start + r.latency_s for r in results]
    s = summarize(results, max(max(ends) - t0 if ends else duration_s, duration_s), errors,
                  window=(t0, t0 + duration_s) if window else None)
    s.offered_rps = len(results) / duration_s
    return s


async def fixed_count(base_url: str, spec: RequestSpec, count: int, concurrency: int,
                      timeout_s: float = 120.0) -> list[Result]:
    """Exactly ``count`` requests from ``concurrency`` closed-loop clients."""
    results: list[Result] = []
    left = count

    async def client(lc: LoadClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            results.append(await lc.send(spec))

    async with LoadClient(base_url, timeout_s, max_connections=max(8, concurrency * 2)) as lc:
        await asyncio.gather(*(client(lc) for _ in range(concurrency)))
    return results
