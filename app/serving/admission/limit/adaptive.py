"""``AdaptiveLimit``: how many requests run at once, and how many may wait, from measured latency."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.serving.admission.limit.baseline import Baseline
from app.serving.admission.limit.knee import KneeSearch
from app.serving.admission.limit.levels import Levels, Window
from app.serving.admission.limit.waiting import EPS, WaitingRoom

log = logging.getLogger("cosyserve.admission")

WINDOW_S = 1.0  # at most one step a second: a window then holds enough requests for a median
MIN_SAMPLES = 3  # fresh samples a step needs (fewer when the limit itself is lower)
EMA_ALPHA = 0.2  # the moving average latency, for the predicted wait before any rate is known
MAX_RETRY_AFTER_S = 600.0  # a client told to come back later than 10 minutes should go elsewhere


LEVEL_SAMPLES = 24  # requests a level's throughput needs before the knee search trusts it
LATENCY_WEIGHT = 0.125  # levels are scored by throughput / n ** latency_weight
PAIR_S = 3.0  # another level compares with this one's windows measured within this of it


@dataclass(frozen=True)
class AdaptiveConfig:
    """Built from ``pool.*`` by app/settings/runtime.py (checked there); the tuning from the constants above."""

    ceiling: int  # the limit never goes above (pool.workers + pool.max_queue)
    initial: float  # where the limit starts (the lifespan moves it for the machine)
    budget_s: float | None  # target latency of an average request; None: tolerance x unloaded latency
    tolerance: float  # the automatic target, in unloaded latencies
    max_wait_s: float | None  # no request waits to run if its predicted wait is longer (queue timeout)
    level_samples: int
    latency_weight: float
    pair_s: float


class AdaptiveLimit:
    """The limit follows measured latency against a budget; three jobs, each its own object.

    ``baseline``: the unloaded latency and the target it sets (``budget_s``, else ``tolerance`` x it).
    ``room``: a request that cannot run at once may wait if its predicted wait is short enough.
    ``knee``: from what each level measured (``knee.levels``), the next limit.

    Here, the windows: each finished request gives a sample (its latency per unit of size);
    at most once per ``WINDOW_S``, with ``MIN_SAMPLES`` fresh ones, the window is recorded at
    its level (busy if the places were kept ~90 % full and the limit reached) and the knee
    search picks the next limit. Requests admitted before the last change are not fresh (one
    step per round trip, as TCP); after a step down neither are those admitted before the
    excess has finished. Never above ``ceiling``, never below 1. Pure and synchronous (the
    clock is injected): the tests drive it with synthetic latencies. Why each piece:
    docs/design/limiter.md.
    """

    name = "adaptive"

    def __init__(self, config: AdaptiveConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.baseline = Baseline(config.budget_s, config.tolerance, clock)
        self.room = WaitingRoom(config.max_wait_s, promise=config.budget_s is not None)
        self.knee = KneeSearch(Levels(config.level_samples, config.pair_s), config.latency_weight)
        self.limit = float(min(config.ceiling, max(1.0, config.initial)))
        self.steps = 0  # changes made (observable)
        self._avg_s: float | None = None
        self._fresh: list[float] = []  # samples of requests admitted since the last change
        self._changed_at = -math.inf  # requests admitted before this saw another limit
        self._draining = False  # stepped down: requests beyond the new limit are still running
        self._hears_running = False  # note_load is given the running count (else no drain is awaited)
        self._stepped_at = clock()
        self._peak_load = 0.0  # since the last step
        self._load, self._load_at, self._area = 0.0, self._stepped_at, 0.0  # running load x seconds, this window
        self._demand_area = 0.0  # admitted load (running and waiting) x seconds, this window
        self._refused = 0  # since the last step

    # -- what it says ----------------------------------------------------------------------------
    @property
    def value(self) -> int:
        return max(1, min(self.config.ceiling, int(self.limit + EPS)))

    @property
    def unloaded_s(self) -> float | None:
        return self.baseline.unloaded_s

    @property
    def target_s(self) -> float | None:
        return self.baseline.target_s

    @property
    def average_s(self) -> float | None:
        return self._avg_s

    def rate(self) -> float | None:
        """Requests finished a second at the limit: measured (``Levels.rate``), else one at a time."""
        measured = self.knee.levels.rate(self.value)
        if measured is not None:
            return measured
        return 1.0 / self._avg_s if self._avg_s else None

    def allows(self, load: float, weight: float = 1.0) -> bool:
        n = self.value
        return self.room.runs_at_once(load, weight, n) or self.room.admits(load, weight, n, self.rate(), self.target_s)

    def predicted_wait_s(self, load: float, weight: float = 1.0) -> float:
        n = self.value
        if self.room.runs_at_once(load, weight, n):
            return 0.0
        return self.room.predicted_wait_s(load, weight, n, self.rate(), self.target_s)

    def retry_after_s(self, wait_s: float) -> float:
        return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait_s))))

    def start_at(self, limit: int) -> None:
        self.limit = float(max(1, min(self.config.ceiling, limit)))

    # -- what it hears ---------------------------------------------------------------------------
    def note_load(self, load: float, running: int | None = None, queued: int = 0) -> None:
        """The admitted load after every change; ``running``: requests holding a place now (after a step
        down, once they fit the new limit, requests admitted from then on are the new level's samples)."""
        now = self._clock()
        self._integrate(now)
        self._load = load
        self._peak_load = max(self._peak_load, load)
        self._hears_running = self._hears_running or running is not None
        if self._draining and running is not None and running <= self.value:
            self._draining = False
            self._changed_at = now
            self._fresh.clear()

    def _integrate(self, now: float) -> None:
        span = max(0.0, now - self._load_at)
        self._area += min(self._load, float(self.value)) * span
        self._demand_area += self._load * span
        self._load_at = now

    def note_refused(self) -> None:
        self._refused += 1

    def observe(self, latency_s: float, *, admitted_at: float, alone: bool = False) -> None:
        """One finished request's latency (already divided by its weight); may step the limit."""
        latency_s = max(1e-6, float(latency_s))
        self.baseline.observe(latency_s, alone)
        self._avg_s = latency_s if self._avg_s is None else self._avg_s + EMA_ALPHA * (latency_s - self._avg_s)
        if admitted_at >= self._changed_at and not self._draining:
            self._fresh.append(latency_s)
        self._maybe_step()

    def _maybe_step(self) -> None:
        now, n, target = self._clock(), self.value, self.target_s
        if target is None or len(self._fresh) < min(MIN_SAMPLES, n) or now - self._stepped_at < WINDOW_S:
            return
        median = statistics.median(self._fresh)
        self.baseline.observe_window(median)
        pressed = self._refused > 0 or self._peak_load + 1.0 > n + EPS  # the limit was reached
        self._integrate(now)
        span = max(EPS, now - self._stepped_at)
        running = self._area / span  # time-weighted, this window
        busy = pressed and running >= n - min(0.5, 0.1 * n)  # the places were kept ~90 % busy
        levels = self.knee.levels
        if busy:
            levels.loaded_s += span
        # the load offered (Little's law): admitted, running or waiting, and the refused as if they had run
        offered = (self._demand_area + self._refused * median) / span
        levels.add(n, Window(median, now, len(self._fresh), statistics.fmean(self._fresh),
                             running if busy else None, levels.loaded_s))
        old = self.limit
        new = self.knee.decide(old, n, target / median, busy and offered >= n + 0.5, target)
        new = min(float(self.config.ceiling), max(1.0, new))
        self._stepped_at = now
        self._area = self._demand_area = 0.0
        self._fresh.clear()
        self._refused = 0
        self._peak_load = 0.0
        if int(new + EPS) != n and log.isEnabledFor(logging.DEBUG):  # the levels' throughputs cost a scan
            log.debug("admission limit %d -> %d: median %.3f s, target %.3f s%s; throughput known %s", n,
                      int(new + EPS), median, target, ", places kept busy" if busy else "",
                      {k: round(x, 2) for k, x in sorted(levels.paired(n).items()) if x is not None})
        if new != old:
            self._draining = self._hears_running and int(new + EPS) < n
            self.limit = new
            self._changed_at = now
            self.steps += 1
